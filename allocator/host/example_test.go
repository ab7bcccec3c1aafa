package host_test

import (
	"fmt"

	"github.com/gpumem/gpumem/allocator"
	"github.com/gpumem/gpumem/allocator/host"
	"github.com/gpumem/gpumem/device/sim"
)

func Example() {
	dev, _ := sim.New(sim.Config{})
	pinned, _ := host.New(dev, host.Config{})
	defer pinned.Close()
	copyStream, _ := dev.NewStream()

	buf, _ := pinned.Alloc(3 << 20)          // rounded up to 4 MiB
	_ = pinned.RecordStream(buf, copyStream) // an async host-to-device copy reads buf
	_ = pinned.Free(buf)                     // reusable once the copy is done

	again, _ := pinned.Alloc(4 << 20)
	fmt.Println(len(buf), cap(buf), &again[0] == &buf[0], pinned.Stats().NumHostAlloc)
	// Output:
	// 3145728 4194304 true 1
}

// The pinned_* keys of a PyTorch configuration string configure the host
// allocator; RoundEighths, gpumem's own, rounds large buffers to an eighth
// of a power of two instead of a power of two.
func Example_config() {
	conf, err := allocator.ParseConf("pinned_reserve_segment_size_mb:16,pinned_use_background_threads:True")
	if err != nil {
		fmt.Println(err)
		return
	}
	dev, _ := sim.New(sim.Config{})
	pinned, err := host.New(dev, host.Config{Pinned: conf.Pinned, Rounding: host.RoundEighths})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer pinned.Close() // stops the background goroutine

	small, _ := pinned.Alloc(100 << 10) // carved from the 16 MiB reserve segment
	batch, _ := pinned.Alloc(65 << 20)  // 72 MiB, not 128 MiB
	st := pinned.Stats()
	fmt.Println(cap(small), cap(batch)>>20, st.NumHostAlloc, st.ReservedBytes.Current>>20)
	// Output:
	// 131072 72 2 88
}
