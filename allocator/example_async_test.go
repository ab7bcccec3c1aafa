package allocator_test

import (
	"fmt"

	"github.com/gpumem/gpumem/allocator"
	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/device/sim"
)

// ExampleNewAsync serves allocations from the device's stream-ordered pool,
// as PyTorch does with backend:cudaMallocAsync: the pool keeps what it
// reserved after a free, and EmptyCache returns it to the device.
func ExampleNewAsync() {
	dev, _ := sim.New(sim.Config{Capacity: 1 << 30})
	cfg, _ := allocator.ParseConf("backend:cudaMallocAsync")
	a, err := allocator.NewAsync(dev, cfg)
	if err != nil {
		fmt.Println(err)
		return
	}
	p, _ := a.Alloc(3<<20, device.DefaultStream)
	_ = a.Free(p)
	_ = dev.Synchronize()
	st := a.Stats()
	reserved, _ := st.Get("reserved_bytes.all.current")
	peak, _ := st.Get("allocated_bytes.all.peak")
	fmt.Println(reserved>>20, "MiB reserved,", peak>>20, "MiB allocated at the peak")

	_ = a.EmptyCache()
	st = a.Stats()
	reserved, _ = st.Get("reserved_bytes.all.current")
	fmt.Println(reserved>>20, "MiB reserved after EmptyCache")

	// The caching allocator refuses the key and names the constructor.
	_, err = allocator.New(dev, cfg)
	fmt.Println(err)
	// Output:
	// 32 MiB reserved, 3 MiB allocated at the peak
	// 0 MiB reserved after EmptyCache
	// allocator: backend:cudaMallocAsync is the device's stream-ordered pool, served by NewAsync, not by the caching allocator (New)
}
