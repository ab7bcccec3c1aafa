package allocator

import (
	"fmt"
	"testing"

	"github.com/gpumem/gpumem/device"
)

// BenchmarkMarkStep is the cost of a step boundary (MarkStep: the live
// blocks' counts for Leaks, kept from the step's log or, past the log's
// bound, from a count of the live blocks), side by side for three shapes
// of step: a training step that hands out and frees more blocks than it
// keeps (BERT's: 1,004 blocks allocated and freed over 589 kept), a
// generation step of few changes over many live blocks, and a loop that
// marks after every few operations over a handful. Each iteration runs
// one step (its allocations and frees, untimed) and its boundary (timed):
// ns/op is the boundary's alone.
func BenchmarkMarkStep(b *testing.B) {
	for _, c := range []struct {
		name       string
		live, step int // blocks kept across steps; blocks allocated and freed within a step
	}{
		{"training", 589, 1004},
		{"generation", 20_000, 100},
		{"fewLive", 10, 1000},
	} {
		b.Run(fmt.Sprintf("%s/live=%d/step=%d", c.name, c.live, c.step), func(b *testing.B) {
			a, _ := newBench(b, Config{})
			a.SetPhase("train")
			for i := range c.live {
				if _, err := a.Alloc(uint64(512*(1+i%37)), device.DefaultStream); err != nil {
					b.Fatal(err)
				}
			}
			a.MarkStep("first")
			ptrs := make([]device.Ptr, c.step)
			for b.Loop() {
				b.StopTimer()
				for i := range ptrs {
					p, err := a.Alloc(uint64(512*(1+i%53)), device.DefaultStream)
					if err != nil {
						b.Fatal(err)
					}
					ptrs[i] = p
				}
				for _, p := range ptrs {
					if err := a.Free(p); err != nil {
						b.Fatal(err)
					}
				}
				b.StartTimer()
				a.MarkStep("step")
			}
		})
	}
}
