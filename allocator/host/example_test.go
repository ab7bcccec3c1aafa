package host_test

import (
	"fmt"

	"github.com/gpumem/gpumem/allocator/host"
	"github.com/gpumem/gpumem/device/sim"
)

func Example() {
	dev, _ := sim.New(sim.Config{})
	pinned, _ := host.New(dev, host.Config{})
	copyStream, _ := dev.NewStream()

	buf, _ := pinned.Alloc(3 << 20)          // rounded up to 4 MiB
	_ = pinned.RecordStream(buf, copyStream) // an async host-to-device copy reads buf
	_ = pinned.Free(buf)                     // reusable once the copy is done

	again, _ := pinned.Alloc(4 << 20)
	fmt.Println(len(buf), cap(buf), &again[0] == &buf[0], pinned.Stats().NumHostAlloc)
	// Output:
	// 3145728 4194304 true 1
}
