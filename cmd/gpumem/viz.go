// This file holds `gpumem viz`: a picture of a trace's replay.

package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/gpumem/gpumem/allocator"
	"github.com/gpumem/gpumem/device/sim"
	"github.com/gpumem/gpumem/trace"
	"github.com/gpumem/gpumem/trace/replay"
	"github.com/gpumem/gpumem/trace/viz"
)

func runViz(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("viz", "[-o OUT.svg] [--conf CONF] [--capacity SIZE] TRACE", stderr)
	out := fs.String("o", "", "write the SVG here instead of standard output")
	conf := fs.String("conf", "", "allocator configuration, PYTORCH_CUDA_ALLOC_CONF syntax")
	capacity := &sizeFlag{80 << 30}
	fs.Var(capacity, "capacity", "simulated device memory (80GiB, 512MiB, bytes)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return usageError{"viz takes exactly one trace"}
	}
	cfg, err := allocator.ParseConf(*conf)
	if err != nil {
		return usageError{err.Error()}
	}
	path := fs.Arg(0)
	r, err := trace.Open(path)
	if err != nil {
		return err
	}
	defer r.Close()
	dev, err := sim.New(sim.Config{Capacity: capacity.n})
	if err != nil {
		return err
	}
	a, err := allocator.New(dev, cfg)
	if err != nil {
		return err
	}
	title := filepath.Base(path)
	if cfg.String() != "" {
		title += " (" + cfg.String() + ")"
	}
	pic, res, err := viz.Replay(r, a, replay.Options{Name: title})
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	pic.Subtitle = fmt.Sprintf("peak reserved %s, peak allocated %s, peak requested %s, fragmentation %.3f, %d device mallocs, %d out of memory",
		size(res.PeakReserved), size(res.PeakAllocated), size(res.PeakRequested), res.Fragmentation, res.DeviceAllocs, res.OOMs)
	w := stdout
	if *out != "" {
		f, err := os.Create(*out)
		if err != nil {
			return err
		}
		defer f.Close()
		w = f
	}
	return pic.WriteSVG(w)
}
