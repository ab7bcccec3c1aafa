package counting_test

import (
	"fmt"

	"github.com/gpumem/gpumem/allocator"
	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/device/counting"
	"github.com/gpumem/gpumem/device/sim"
)

// Count what a caching allocator asks of the device: its cache turns
// many allocations into few device calls.
func Example() {
	s, _ := sim.New(sim.Config{Capacity: 1 << 30})
	c := counting.New(s)
	a, _ := allocator.New(c.Device(), allocator.Config{})

	for range 100 {
		p, _ := a.Alloc(1<<20, device.DefaultStream) // 1 MiB, 100 times
		_ = a.Free(p)
	}
	n := c.Counts()
	fmt.Println("device mallocs:", n.Calls[device.CallMalloc])
	fmt.Println("bytes:", n.Bytes[device.CallMalloc])

	_ = a.EmptyCache()
	fmt.Println(c.Counts().Sub(n))
	// Output:
	// device mallocs: 1
	// bytes: 2097152
	// free 1
}

// The counted device has the capabilities of the one it wraps, and the
// capability calls are counted too.
func ExampleCounter_Device() {
	s, _ := sim.New(sim.Config{})
	c := counting.New(s)
	vm, ok := c.Device().(device.VirtualMemory)
	fmt.Println("virtual memory:", ok)

	r, _ := vm.Reserve(8 << 20)
	_ = vm.Map(r, 4<<20)
	_ = vm.Unmap(r, 4<<20)
	_ = vm.Release(r)
	fmt.Println(c.Counts())
	// Output:
	// virtual memory: true
	// reserve 1 (8388608 B), map 1 (4194304 B), unmap 1 (4194304 B), release 1
}
