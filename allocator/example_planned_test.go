package allocator_test

import (
	"fmt"

	"github.com/gpumem/gpumem/allocator"
	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/device/sim"
)

// A training loop under the planned policy marks where each step starts.
// Once a step has repeated the one before it, the steps after it are
// served from an arena laid out for the step: no search of the free
// blocks, no device call. A short last batch (the same requests in the
// same order, none larger) is served from the same plan. PlanStats tells
// the program what the plan served.
func ExampleAllocator_PlanStats() {
	cfg, _ := allocator.ParseConf("gpumem_policy:planned")
	dev, _ := sim.New(sim.Config{})
	a, _ := allocator.New(dev, cfg)
	weights, _ := a.Alloc(256<<20, device.DefaultStream) // kept across steps: not planned

	step := func(batch uint64) {
		a.MarkStep("step")
		var acts []device.Ptr
		for _, perSample := range []uint64{3 << 20, 12 << 20, 3 << 20, 1 << 20} {
			p, _ := a.Alloc(perSample*batch, device.DefaultStream) // the forward pass keeps its activations
			acts = append(acts, p)
		}
		for i := len(acts) - 1; i >= 0; i-- {
			g, _ := a.Alloc(2<<20*batch, device.DefaultStream) // the backward pass: a gradient
			_ = a.Free(acts[i])
			_ = a.Free(g)
		}
	}
	for range 5 {
		step(8)
	}
	st, _ := a.PlanStats()
	fmt.Printf("%d plan, %d requests served from its arena of %d MiB\n", st.Plans, st.Served, st.ArenaBytes>>20)
	step(5) // the last batch, smaller
	st, _ = a.PlanStats()
	fmt.Printf("%d requests served, %d departures\n", st.Served, st.Departures)
	_ = a.Free(weights)
	// Output:
	// 1 plan, 24 requests served from its arena of 168 MiB
	// 32 requests served, 0 departures
}
