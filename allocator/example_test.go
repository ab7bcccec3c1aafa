package allocator_test

import (
	"errors"
	"fmt"

	"github.com/gpumem/gpumem/allocator"
	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/device/sim"
)

func Example() {
	dev, _ := sim.New(sim.Config{})
	a, _ := allocator.New(dev, allocator.Config{})

	p, _ := a.Alloc(3<<20, device.DefaultStream) // 3 MiB: a 20 MiB segment, split
	_ = a.Free(p)
	q, _ := a.Alloc(3<<20, device.DefaultStream) // the same block, from the cache
	fmt.Println(p == q, dev.Counters().Mallocs)

	st := a.Stats()
	reserved, _ := st.Get("reserved_bytes.all.current")
	fmt.Println(reserved>>20, "MiB reserved")
	// Output:
	// true 1
	// 20 MiB reserved
}

func ExampleParseConf() {
	cfg, err := allocator.ParseConf("max_split_size_mb:128, garbage_collection_threshold:0.6, per_process_memory_fraction:0.9")
	fmt.Println(cfg.MaxSplitSize>>20, cfg.GarbageCollectionThreshold, cfg.MemoryFraction, err)

	_, err = allocator.ParseConf("max_split_size_mb:12")
	fmt.Println(err)
	// Output:
	// 128 0.6 0.9 <nil>
	// allocator: parsing config: max_split_size_mb:12 is too small: it must be at least 20 (the large segment size in MiB)
}

func ExampleOutOfMemoryError() {
	dev, _ := sim.New(sim.Config{Capacity: 1 << 30})
	a, _ := allocator.New(dev, allocator.Config{})
	_, err := a.Alloc(3<<30, device.DefaultStream)

	var oom *allocator.OutOfMemoryError
	if errors.As(err, &oom) {
		fmt.Println("asked", oom.Requested>>20, "MiB; device free", oom.DeviceFree>>20, "MiB")
	}
	fmt.Println(errors.Is(err, device.ErrOutOfMemory))
	// Output:
	// asked 3072 MiB; device free 1024 MiB
	// true
}

func ExampleAllocator_RecordStream() {
	dev, _ := sim.New(sim.Config{})
	a, _ := allocator.New(dev, allocator.Config{})
	side, _ := dev.NewStream()
	_ = dev.SetStreamBusy(side, true) // a copy kernel still runs on side

	p, _ := a.Alloc(4<<20, device.DefaultStream)
	_ = a.RecordStream(p, side) // p is read on side too
	_ = a.Free(p)               // not reusable until side's work is done

	q, _ := a.Alloc(4<<20, device.DefaultStream)
	fmt.Println("reused while side is busy:", p == q)

	_ = dev.CompleteStream(side)
	r, _ := a.Alloc(4<<20, device.DefaultStream)
	fmt.Println("reused after side's work:", p == r)
	// Output:
	// reused while side is busy: false
	// reused after side's work: true
}

func ExampleManager() {
	m, _ := allocator.NewManager(func(o int) (device.Device, error) {
		return sim.New(sim.Config{Ordinal: o})
	}, allocator.Config{})

	p, _ := m.Alloc(1, 8<<20, device.DefaultStream) // device 1, named in the call
	fmt.Println(m.Devices(), m.Stats(1).Allocated()>>20, "MiB on device 1")
	fmt.Println(m.Free(0, p) != nil, m.Free(1, p))
	// Output:
	// [1] 8 MiB on device 1
	// true <nil>
}

func ExampleAllocator_Snapshot() {
	dev, _ := sim.New(sim.Config{})
	a, _ := allocator.New(dev, allocator.Config{})
	_, _ = a.Alloc(1000, device.DefaultStream)
	for _, seg := range a.Snapshot() {
		fmt.Println(seg.Pool, seg.Size>>20, "MiB")
		for _, b := range seg.Blocks {
			fmt.Println(" ", b.State, b.Size, b.Requested)
		}
	}
	// Output:
	// small_pool 2 MiB
	//   active_allocated 1024 1000
	//   inactive 2096128 0
}

// actionLog is an Observer that prints what the allocator does.
type actionLog struct{}

func (actionLog) Observe(e allocator.Action) {
	fmt.Println(e.Kind, e.Size, e.Requested)
}

func ExampleAllocator_Attach() {
	dev, _ := sim.New(sim.Config{})
	a, _ := allocator.New(dev, allocator.Config{})
	detach := a.Attach(actionLog{})
	p, _ := a.Alloc(1000, device.DefaultStream)
	_ = a.Free(p)
	_ = a.EmptyCache()
	detach()
	_, _ = a.Alloc(1000, device.DefaultStream) // not seen: detached
	// Output:
	// segment_alloc 2097152 0
	// alloc 1024 1000
	// free_requested 1024 1000
	// free_completed 1024 1000
	// empty_cache 0 0
	// segment_free 2097152 0
}

func ExampleAllocator_EmptyCache() {
	dev, _ := sim.New(sim.Config{})
	a, _ := allocator.New(dev, allocator.Config{})
	p, _ := a.Alloc(64<<20, device.DefaultStream)
	_ = a.Free(p)
	fmt.Println("cached:", a.Stats().Reserved()>>20, "MiB reserved,", dev.BytesInUse()>>20, "MiB held on the device")
	_ = a.EmptyCache()
	fmt.Println("emptied:", a.Stats().Reserved()>>20, "MiB reserved,", dev.BytesInUse()>>20, "MiB held on the device")
	// Output:
	// cached: 64 MiB reserved, 64 MiB held on the device
	// emptied: 0 MiB reserved, 0 MiB held on the device
}

// Expandable segments map pages into one reserved range, so memory freed in
// pieces merges into one block: four 32 MiB requests reuse eight freed
// 16 MiB blocks instead of asking the device for more.
func ExampleConfig_expandableSegments() {
	for _, conf := range []string{"", "expandable_segments:True"} {
		cfg, _ := allocator.ParseConf(conf)
		dev, _ := sim.New(sim.Config{})
		a, _ := allocator.New(dev, cfg)
		var ps []device.Ptr
		for range 8 {
			p, _ := a.Alloc(16<<20, device.DefaultStream)
			ps = append(ps, p)
		}
		for _, p := range ps {
			_ = a.Free(p)
		}
		for range 4 {
			_, _ = a.Alloc(32<<20, device.DefaultStream)
		}
		fmt.Printf("%q: %d MiB reserved\n", conf, a.Stats().Reserved()>>20)
	}
	// Output:
	// "": 256 MiB reserved
	// "expandable_segments:True": 140 MiB reserved
}

// Passthrough is the baseline without a cache: every Alloc and Free is a
// device call, as PyTorch with PYTORCH_NO_CUDA_MEMORY_CACHING=1.
func ExamplePassthrough() {
	dev, _ := sim.New(sim.Config{})
	pt, _ := allocator.NewPassthrough(dev)
	for range 3 {
		p, _ := pt.Alloc(4<<20, device.DefaultStream)
		_ = pt.Free(p)
	}
	c := dev.Counters()
	fmt.Println(c.Mallocs, "device mallocs,", c.Frees, "device frees")
	// Output:
	// 3 device mallocs, 3 device frees
}
