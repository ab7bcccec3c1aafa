// This file holds `gpumem demo`: a small training loop's allocations on the
// simulated device.

package main

import (
	"context"
	"fmt"
	"io"

	"github.com/gpumem/gpumem/allocator"
	"github.com/gpumem/gpumem/device/sim"
	"github.com/gpumem/gpumem/estimate"
	"github.com/gpumem/gpumem/stats"
)

func runDemo(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("demo", "[--steps N] [--layers N] [--conf CONF] [--capacity SIZE | --card NAME [--overhead SIZE]]", stderr)
	steps := fs.Int("steps", 5, "training `N` steps to run")
	layers := fs.Int("layers", 12, "`N` transformer layers of the toy model (1 to 1000)")
	conf := fs.String("conf", "", confFlagHelp)
	devFlags := addDeviceFlags(fs, "")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usageError{fmt.Sprintf("unexpected argument %s", quote(fs.Arg(0)))}
	}
	if *steps < 1 || *layers < 1 || *layers > 1000 {
		return usageError{"--steps and --layers must be at least 1 (layers at most 1000)"}
	}
	cfg, _, err := resolveConf(fs, *conf)
	if err != nil {
		return err
	}
	capacity, _, _, err := devFlags.resolve()
	if err != nil {
		return err
	}
	fs.begin()
	dev, err := sim.New(sim.Config{Capacity: capacity})
	if err != nil {
		return err
	}
	a, err := allocator.New(dev, cfg)
	if err != nil {
		return err
	}
	m := estimate.Model{Name: "demo", Family: estimate.GPT2, Layers: *layers, Hidden: 1024, Heads: 16, Vocab: 32000,
		Bias: true, TieEmbeddings: true}
	pl := estimate.Plan{Model: &m, Workload: estimate.Workload{Precision: estimate.FP32, Optimizer: estimate.SGD, Batch: 8, Seq: 512,
		LossOnly: true}}
	fmt.Fprintf(stdout, "gpumem demo: a %d-layer transformer (hidden %d, vocab %d, batch %d x %d tokens, fp32) training with SGD on %s\n",
		m.Layers, m.Hidden, m.Vocab, pl.Workload.Batch, pl.Workload.Seq, dev)
	if cfg.String() != "" {
		fmt.Fprintf(stdout, "configuration: %s\n", cfg)
	}
	// Device calls are the allocator's num_device_alloc and num_device_free:
	// cudaMalloc and cudaFree, or page maps and unmaps with expandable
	// segments.
	var laterCalls int64 // device allocations and frees after the first step
	before, clock := a.Stats(), dev.Clock()
	err = pl.Drive(a, *steps, func(i int) error {
		a.MarkStep(fmt.Sprint("step", i+1)) // the boundary before the next step
		after := a.Stats()
		if i == 0 {
			fmt.Fprintf(stdout, "parameters:  %s, %d device mallocs\n", stats.Line(&after), after.NumDeviceAlloc)
		} else {
			mallocs, frees := after.NumDeviceAlloc-before.NumDeviceAlloc, after.NumDeviceFree-before.NumDeviceFree
			if i > 1 {
				laterCalls += mallocs + frees
			}
			fmt.Fprintf(stdout, "step %-3d     %s | device mallocs %d, frees %d, device time %v\n", i, stats.Line(&after),
				mallocs, frees, dev.Clock()-clock)
		}
		before, clock = after, dev.Clock()
		return nil
	})
	if err != nil {
		return err
	}
	st := a.Stats()
	fmt.Fprintf(stdout, "\n%d allocations served with %d device mallocs", st.Allocation[stats.All].Allocated, st.NumDeviceAlloc)
	switch {
	case *steps == 1:
		fmt.Fprint(stdout, ".\n\n")
	case laterCalls == 0:
		fmt.Fprint(stdout, ": every step after the first was served from the cache, with no device call.\n\n")
	case cfg.MaxSplitSize != 0 && cfg.ExpandableSegments && cfg.Policy == allocator.PolicyFaithful:
		fmt.Fprintf(stdout, ": the steps after the first still made %d device calls. With expandable segments, max_split_size_mb keeps a request below it out of the free ranges of that size or more that the segments merge into: unset it.\n\n", laterCalls)
	default:
		fmt.Fprintf(stdout, ": the steps after the first still made %d device calls.\n\n", laterCalls)
	}
	fmt.Fprint(stdout, a.Summary(false))
	if err := a.CheckInvariants(); err != nil {
		return fmt.Errorf("allocator invariants: %w", err)
	}
	return nil
}
