// Runnable examples of the address rule, virtual memory and waiting for one
// event on a busy stream.

package sim_test

import (
	"fmt"

	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/device/sim"
)

// Addresses follow one rule: first fit at the lowest free address, in whole
// pages, with freed ranges merged and reused.
func ExampleDevice_Allocations() {
	dev, _ := sim.New(sim.Config{Capacity: 1 << 30}) // 2 MiB pages
	a, _ := dev.Malloc(2 << 20)
	b, _ := dev.Malloc(6 << 20) // three pages
	c, _ := dev.Malloc(1)       // charged a whole page
	_ = dev.Free(b)

	d, _ := dev.Malloc(3 << 20) // two pages: the lowest hole that fits is b's
	fmt.Println("reused b's hole:", d == b)
	for _, r := range dev.Allocations() {
		fmt.Printf("%v: %d bytes asked, %d MiB charged\n", r.Ptr, r.Size, r.Charged>>20)
	}
	_, _ = a, c
	// Output:
	// reused b's hole: true
	// 0x100000000000: 2097152 bytes asked, 2 MiB charged
	// 0x100000200000: 3145728 bytes asked, 4 MiB charged
	// 0x100000800000: 1 bytes asked, 2 MiB charged
}

// Virtual memory: reserve address space for free, then map and unmap
// physical pages in it, charged against the same capacity as Malloc.
func ExampleDevice_Reserve() {
	dev, _ := sim.New(sim.Config{Capacity: 8 << 20}) // four 2 MiB pages
	g := dev.Granularity()
	r, _ := dev.Reserve(64 * g) // far more address space than memory
	fmt.Printf("reserved %v, %d MiB in use\n", r, dev.BytesInUse()>>20)

	_ = dev.Map(r, 3*g)
	fmt.Printf("mapped three pages, %d MiB in use\n", dev.BytesInUse()>>20)
	fmt.Println(dev.Map(r+device.Ptr(3*g), 2*g))

	fmt.Println(dev.Release(r))
	_ = dev.Unmap(r, 3*g)
	fmt.Println(dev.Release(r), dev.BytesInUse())
	// Output:
	// reserved 0x100000000000000, 0 MiB in use
	// mapped three pages, 6 MiB in use
	// device 0: map: out of memory (4 MiB requested, 2 MiB free of 8 MiB)
	// device 0: release: invalid argument (reservation 0x100000000000000 still has 6 MiB mapped)
	// <nil> 0
}

// Waiting for one event of a busy stream finishes the work up to that
// event, not the work recorded after it.
func ExampleDevice_SynchronizeEvent() {
	dev, _ := sim.New(sim.Config{})
	s, _ := dev.NewStream()
	_ = dev.SetStreamBusy(s, true)
	first, _ := dev.RecordEvent(s)
	second, _ := dev.RecordEvent(s)

	_ = dev.SynchronizeEvent(first)
	done1, _ := dev.EventDone(first)
	done2, _ := dev.EventDone(second)
	pending, _ := dev.PendingWork(s)
	fmt.Println(done1, done2, pending)

	_ = dev.Synchronize()
	done2, _ = dev.EventDone(second)
	fmt.Println(done2)
	// Output:
	// true false 1
	// true
}

// A runtime that launches on its own streams hands them to gpumem by name
// (on a GPU, the CUstream; here any non-zero number) and gets the name back
// to launch on. The names of the legacy and per-thread default streams are
// the CUDA backend's.
func ExampleDevice_AdoptStreamHandle() {
	dev, _ := sim.New(sim.Config{})
	const runtimeStream = 0x5eed // the runtime's own stream
	s, _ := dev.AdoptStreamHandle(runtimeStream)
	legacy, _ := dev.AdoptStreamHandle(sim.StreamLegacy)
	fmt.Println("legacy is the default stream:", legacy == device.DefaultStream)

	e, _ := dev.RecordEvent(s) // ordered on the runtime's stream
	done, _ := dev.EventDone(e)
	h, _ := dev.StreamHandle(s)
	fmt.Printf("event done: %v, launch on %#x\n", done, h)

	fmt.Println("release:", dev.ReleaseStream(s))
	fmt.Println("still a stream:", dev.HasStream(s))
	// Output:
	// legacy is the default stream: true
	// event done: true, launch on 0x5eed
	// release: <nil>
	// still a stream: false
}
