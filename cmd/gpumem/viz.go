// This file holds `gpumem viz`: a picture of a trace's replay.

package main

import (
	"context"
	"fmt"
	"io"
	"path/filepath"

	"github.com/gpumem/gpumem/allocator"
	"github.com/gpumem/gpumem/trace/plan"
	"github.com/gpumem/gpumem/trace/replay"
	"github.com/gpumem/gpumem/trace/viz"
)

func runViz(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("viz", "[-o OUT.svg] [--conf CONF] [--capacity SIZE | --card NAME [--overhead SIZE]] TRACE", stderr)
	out := fs.String("o", "-", "write the SVG to `OUT.svg` (- is standard output); a file is replaced only once the whole picture is written")
	conf := fs.String("conf", "", confFlagHelp)
	dev := addDeviceFlags(fs, "")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return usageError{"viz takes exactly one trace"}
	}
	if err := sameFile("-o", *out, fs.Arg(0)); err != nil {
		return err
	}
	cfg, _, err := resolveConf(fs, *conf)
	if err != nil {
		return err
	}
	if cfg.Backend == allocator.BackendCudaMallocAsync {
		return usageError{"viz draws the caching allocator's segments: backend:cudaMallocAsync has none gpumem can see (the driver's pool keeps the blocks)"}
	}
	capacity, _, _, err := dev.resolve()
	if err != nil {
		return err
	}
	path := fs.Arg(0)
	fs.begin()
	in, err := openInput(path)
	if err != nil {
		return err
	}
	defer in.Close()
	m, err := plan.NewMachine(cfg, capacity, false)
	if err != nil {
		return err
	}
	title := clip(filepath.Base(path))
	if cfg.String() != "" {
		title += " (" + cfg.String() + ")"
	}
	pic, res, err := viz.Replay(in.ops, m.Allocator, replay.Options{Name: title})
	if err != nil {
		return fmt.Errorf("%s: %w", in.name, err)
	}
	pic.Subtitle = fmt.Sprintf("peak reserved %s, peak allocated %s, peak requested %s, fragmentation %.3f, %d device mallocs, %d out of memory",
		size(res.PeakReserved), size(res.PeakAllocated), size(res.PeakRequested), res.Fragmentation, res.DeviceAllocs, res.OOMs)
	return writeOutput(*out, stdout, pic.WriteSVG)
}
