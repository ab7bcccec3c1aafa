package gorgonia_test

import (
	"fmt"

	"gorgonia.org/tensor"

	"github.com/gpumem/gpumem/adapters/gorgonia"
	"github.com/gpumem/gpumem/allocator"
	"github.com/gpumem/gpumem/device/sim"
)

// gorgonia tensors take their device memory from gpumem's cache: the
// second tensor of a step reuses the first one's block without calling the
// device. (On a GPU, the device is device/cuda's, and the stream the one the
// runtime launches on.)
func Example() {
	dev, _ := sim.New(sim.Config{})
	a, _ := allocator.New(dev, allocator.Config{})
	s, _ := dev.AdoptStreamHandle(0x5eed) // the runtime's stream
	e, _ := gorgonia.New(a, s, nil)

	for step := 0; step < 2; step++ {
		x := tensor.New(tensor.WithShape(1024, 1024), tensor.Of(tensor.Float32), tensor.WithEngine(e))
		st := a.Stats()
		fmt.Printf("step %d: %v, allocated %d MiB, device mallocs %d\n",
			step, x.Shape(), st.Map()["allocated_bytes.all.current"]>>20, dev.Counters().Mallocs)
		_ = e.Free(x, int64(x.MemSize()))
	}
	// Output:
	// step 0: (1024, 1024), allocated 4 MiB, device mallocs 1
	// step 1: (1024, 1024), allocated 4 MiB, device mallocs 1
}
