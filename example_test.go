package gpumem_test

import (
	"errors"
	"fmt"

	"github.com/gpumem/gpumem/allocator"
	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/device/sim"
)

// Example is the quick start: an allocator on a simulated device, a cached
// reuse, the stats and an out-of-memory error.
func Example() {
	dev, _ := sim.New(sim.Config{Capacity: 1 << 30}) // a 1 GiB device
	a, _ := allocator.New(dev, allocator.Config{})

	p, _ := a.Alloc(64<<20, device.DefaultStream) // 64 MiB: one device malloc
	_ = a.Free(p)                                 // kept in the cache
	q, _ := a.Alloc(64<<20, device.DefaultStream) // served from the cache
	fmt.Println("reused:", p == q, "device mallocs:", dev.Counters().Mallocs)

	st := a.Stats()
	peak, _ := st.Get("allocated_bytes.all.peak")
	fmt.Println("peak allocated MiB:", peak>>20)

	_, err := a.Alloc(2<<30, device.DefaultStream)
	var oom *allocator.OutOfMemoryError
	fmt.Println("out of memory:", errors.As(err, &oom), errors.Is(err, device.ErrOutOfMemory), oom.Requested>>20, "MiB asked")
	// Output:
	// reused: true device mallocs: 1
	// peak allocated MiB: 64
	// out of memory: true true 2048 MiB asked
}
