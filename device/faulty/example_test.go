package faulty_test

import (
	"errors"
	"fmt"

	"github.com/gpumem/gpumem/allocator"
	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/device/faulty"
	"github.com/gpumem/gpumem/device/sim"
)

// Fail the second Malloc with an out-of-memory error, once.
func Example() {
	s, _ := sim.New(sim.Config{})
	j := faulty.New(s)
	_, _ = j.Add(faulty.Rule{Call: device.CallMalloc, Nth: 2, Err: device.ErrOutOfMemory})

	d := j.Device()
	for i := 1; i <= 3; i++ {
		_, err := d.Malloc(1 << 20)
		fmt.Printf("malloc %d: %v\n", i, err)
	}
	_, err := d.Malloc(1 << 20)
	fmt.Println(errors.Is(err, faulty.ErrInjected))
	fmt.Println(len(s.Allocations()), "allocations on the device")
	// Output:
	// malloc 1: <nil>
	// malloc 2: device 0: malloc: out of memory (injected fault: rule 0, malloc call 2)
	// malloc 3: <nil>
	// false
	// 3 allocations on the device
}

// Make every Map fail under an allocator with expandable segments: the
// allocator reports out of memory, and its books stay straight.
func ExampleInjector_Add() {
	s, _ := sim.New(sim.Config{Capacity: 1 << 30})
	j := faulty.New(s)
	a, _ := allocator.New(j.Device(), allocator.Config{ExpandableSegments: true})

	_, _ = j.Add(faulty.Rule{Call: device.CallMap, Count: faulty.Always, Err: device.ErrOutOfMemory})
	_, err := a.Alloc(1<<20, device.DefaultStream)
	fmt.Println("out of memory:", errors.Is(err, device.ErrOutOfMemory))
	fmt.Println("invariants:", a.CheckInvariants())
	for _, f := range j.Fired() {
		fmt.Printf("%v call %d failed (rule %d)\n", f.Call, f.N, f.Rule)
	}
	// Output:
	// out of memory: true
	// invariants: <nil>
	// map call 1 failed (rule 0)
	// map call 2 failed (rule 0)
}
