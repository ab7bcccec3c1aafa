package allocator_test

import (
	"fmt"

	"github.com/gpumem/gpumem/allocator"
	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/device/sim"
)

// trainStep marks a step and runs a toy training step at batch batch: a
// forward pass that keeps its activations, then a backward pass that
// frees them, a gradient at a time.
func trainStep(a *allocator.Allocator, batch uint64) {
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

	for range 5 {
		trainStep(a, 8)
	}
	st, _ := a.PlanStats()
	fmt.Printf("%d plan, %d requests served from its arena of %d MiB\n", st.Plans, st.Served, st.ArenaBytes>>20)
	trainStep(a, 5) // the last batch, smaller
	st, _ = a.PlanStats()
	fmt.Printf("%d requests served, %d departures\n", st.Served, st.Departures)
	_ = a.Free(weights)
	// Output:
	// 1 plan, 24 requests served from its arena of 168 MiB
	// 32 requests served, 0 departures
}

// Steps whose batch goes up and down, as a sampler that buckets examples
// by length makes them, never repeat the one before. The planned policy
// plans a step that fits the largest sizes seen at each of its
// positions, and serves every step after it that fits them too: here
// the third step (batch 2 after 4 and 6) is planned at batch 6's sizes
// and the five after it are served. A step larger than any before (batch
// 8) departs from the plan, and the next step that fits is planned
// anew, at batch 8's sizes: the four after it are served.
func ExampleAllocator_MarkStep() {
	cfg, _ := allocator.ParseConf("gpumem_policy:planned")
	dev, _ := sim.New(sim.Config{})
	a, _ := allocator.New(dev, cfg)

	for _, batch := range []uint64{4, 6, 2, 5, 3, 6, 1, 4, 8, 2, 7, 3, 5, 6} {
		trainStep(a, batch)
	}
	st, _ := a.PlanStats()
	fmt.Printf("14 steps: %d plans, %d of 112 requests served from an arena, %d departure\n", st.Plans, st.Served, st.Departures)
	fmt.Printf("the arena: %d MiB, batch 8's\n", st.ArenaBytes>>20)
	// Output:
	// 14 steps: 2 plans, 72 of 112 requests served from an arena, 1 departure
	// the arena: 168 MiB, batch 8's
}

// evalStep marks a step and runs a toy evaluation at batch batch: the
// forward pass alone, each activation freed once the next is made.
func evalStep(a *allocator.Allocator, batch uint64) {
	a.MarkStep("eval")
	var prev device.Ptr
	for _, perSample := range []uint64{3 << 20, 12 << 20, 3 << 20, 1 << 20} {
		p, _ := a.Alloc(perSample*batch, device.DefaultStream)
		if prev != 0 {
			_ = a.Free(prev)
		}
		prev = p
	}
	_ = a.Free(prev)
}

// A training loop that evaluates the model every few steps changes the
// shape of its steps for a while. The first evaluation step spares the
// training plan; the second ends it, and the plan is kept; the
// evaluation's steps get a plan of their own. Back to training, the
// second step finds the kept plan and takes it up again, packed already,
// and so does the next evaluation: two plans packed for three rounds of
// each. (A plan that ended was dropped once: six plans were packed, and
// 124 requests served.)
func ExampleAllocator_PlanStats_evaluation() {
	cfg, _ := allocator.ParseConf("gpumem_policy:planned")
	dev, _ := sim.New(sim.Config{})
	a, _ := allocator.New(dev, cfg)

	for range 3 {
		for range 6 {
			trainStep(a, 8)
		}
		for range 4 {
			evalStep(a, 8)
		}
	}
	st, _ := a.PlanStats()
	fmt.Printf("%d plans packed, %d taken up again, %d requests served from an arena\n", st.Plans, st.Reused, st.Served)
	// Output:
	// 2 plans packed, 4 taken up again, 148 requests served from an arena
}

// A data loader that copies the next input on a stream of its own
// allocates on that stream at each step's start. The planned policy plans
// the step on its main stream, the one with most of its allocations, and
// serves the input copies online, in the copy stream's own memory.
func ExampleAllocator_PlanStats_sideStream() {
	cfg, _ := allocator.ParseConf("gpumem_policy:planned")
	dev, _ := sim.New(sim.Config{})
	a, _ := allocator.New(dev, cfg)
	copyStream, _ := dev.NewStream()

	var input device.Ptr
	for step := range 6 {
		if input != 0 {
			_ = a.Free(input) // the last step's input
		}
		a.MarkStep("step")
		input, _ = a.Alloc(1<<20, copyStream) // the input, copied on its stream
		_ = a.RecordStream(input, device.DefaultStream)
		var acts []device.Ptr
		for _, size := range []uint64{24 << 20, 96 << 20, 24 << 20} {
			p, _ := a.Alloc(size, device.DefaultStream)
			acts = append(acts, p)
		}
		for _, p := range acts {
			_ = a.Free(p)
		}
		if step == 5 {
			st, _ := a.PlanStats()
			fmt.Printf("%d plan, %d requests served from its arena, %d departures\n", st.Plans, st.Served, st.Departures)
		}
	}
	_ = a.Free(input)
	// Output:
	// 1 plan, 12 requests served from its arena, 0 departures
}
