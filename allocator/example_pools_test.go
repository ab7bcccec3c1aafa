package allocator_test

import (
	"errors"
	"fmt"

	"github.com/gpumem/gpumem/allocator"
	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/device/sim"
)

// A named pool keeps a KV cache apart: the stream's allocations go to it
// while it is routed there, and EmptyCache leaves it alone until it is
// released.
func ExampleAllocator_NewPool() {
	dev, _ := sim.New(sim.Config{})
	a, _ := allocator.New(dev, allocator.Config{})
	kv, _ := a.NewPool("kv-cache", allocator.PoolOptions{})

	_ = a.UsePool(kv, device.DefaultStream)
	p, _ := a.Alloc(64<<20, device.DefaultStream)
	_ = a.UseDefaultPool(device.DefaultStream)
	_ = a.Free(p)

	_ = a.EmptyCache() // the pool's cached segment stays
	st, _ := a.PoolStats(kv)
	fmt.Println(st.Name, st.ReservedBytes>>20, "MiB reserved,", st.AllocatedBytes, "allocated")

	_ = a.ReleasePool(kv) // now it goes
	reserved, _ := a.Stats().Get("reserved_bytes.all.current")
	fmt.Println(reserved, "bytes reserved")
	// Output:
	// kv-cache 64 MiB reserved, 0 allocated
	// 0 bytes reserved
}

// A graph capture sends the capturing stream's allocations to a private
// pool, which outlives the capture until the graph is released.
func ExampleAllocator_BeginCapture() {
	dev, _ := sim.New(sim.Config{})
	a, _ := allocator.New(dev, allocator.Config{})
	capture, _ := dev.NewStream()
	graph, _ := a.NewPool("graph0", allocator.PoolOptions{})

	_ = a.BeginCapture(graph, capture)
	tmp, _ := a.Alloc(4<<20, capture)
	_ = a.Free(tmp)                   // freed on its own stream: reusable within the capture
	out, _ := a.Alloc(4<<20, capture) // the same block
	_ = a.EndCapture(capture)
	other, _ := a.Alloc(4<<20, capture) // the default pool again
	fmt.Println(out == tmp, other == out)

	st, _ := a.PoolStats(graph)
	fmt.Println(st.AllocatedBytes>>20, "MiB held by the graph's pool")
	// Output:
	// true false
	// 4 MiB held by the graph's pool
}

// Pausing a pool returns its memory to the device and keeps its
// addresses: here another pool's request fits only while the first
// sleeps, and the first wakes with its block where it was.
func ExampleAllocator_PausePool() {
	dev, _ := sim.New(sim.Config{Capacity: 8 << 30})
	a, _ := allocator.New(dev, allocator.Config{ExpandableSegments: true})
	weights, _ := a.NewPool("weights", allocator.PoolOptions{})

	_ = a.UsePool(weights, device.DefaultStream)
	w, _ := a.Alloc(6<<30, device.DefaultStream)
	_ = a.UseDefaultPool(device.DefaultStream)

	_, err := a.Alloc(6<<30, device.DefaultStream)
	fmt.Println("while awake:", errors.Is(err, device.ErrOutOfMemory))

	_ = a.PausePool(weights, false) // no backup: the bytes are not kept
	kv, err := a.Alloc(6<<30, device.DefaultStream)
	fmt.Println("while asleep:", err)
	_ = a.Free(kv)

	err = a.ResumePool(weights) // the out-of-memory ladder releases kv's cached pages
	fmt.Println("resumed:", err, "; the block is live at the same address:", a.Free(w) == nil)
	// Output:
	// while awake: true
	// while asleep: <nil>
	// resumed: <nil> ; the block is live at the same address: true
}

// With a backup, a paused pool's blocks get their bytes back on resume.
// The allocator here has plain segments: on a device with virtual memory
// a named pool's segments are reserved and mapped, so they can be paused
// without expandable segments.
func ExampleAllocator_PausePool_backup() {
	dev, _ := sim.New(sim.Config{Capacity: 1 << 30})
	a, _ := allocator.New(dev, allocator.Config{})
	kv, _ := a.NewPool("kv", allocator.PoolOptions{})

	_ = a.UsePool(kv, device.DefaultStream)
	p, _ := a.Alloc(4096, device.DefaultStream)
	_ = a.UseDefaultPool(device.DefaultStream)
	_ = dev.CopyFromHost(p, []byte("the cache's keys"))

	_ = a.PausePool(kv, true) // the block's bytes go to pinned host memory
	fmt.Println("device bytes in use while paused:", dev.BytesInUse())
	_ = a.ResumePool(kv)
	got := make([]byte, 16)
	_ = dev.CopyToHost(got, p)
	fmt.Printf("resumed: %q\n", got)
	_ = a.Free(p)
	// Output:
	// device bytes in use while paused: 0
	// resumed: "the cache's keys"
}
