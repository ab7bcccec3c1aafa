//go:build cuda

// example_test.go: runnable examples of opening a device, memory, streams and
// events (they need a device: the stub driver or a GPU).

package cuda_test

import (
	"errors"
	"fmt"

	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/device/cuda"
)

// Open a device, allocate and free device memory. Errors wrap the device
// package's sentinels. (Examples need a device: the stub driver or a GPU.)
func Example() {
	if !cuda.Available() {
		fmt.Println("no CUDA device")
		return
	}
	dev, err := cuda.Open(0)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer dev.Close()

	p, err := dev.Malloc(1 << 20) // cuMemAlloc
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("free:", dev.Free(p))
	err = dev.Free(p)
	fmt.Println("double free is an invalid pointer:", errors.Is(err, device.ErrInvalidPointer))
	// Output:
	// free: <nil>
	// double free is an invalid pointer: true
}

// Streams and events are integer handles; an event recorded on a stream is
// done once the work queued before it has finished.
func ExampleDevice_RecordEvent() {
	dev, err := cuda.Open(0)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer dev.Close()

	s, err := dev.NewStream()
	if err != nil {
		fmt.Println(err)
		return
	}
	e, err := dev.RecordEvent(s)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("synchronize:", dev.SynchronizeEvent(e))
	done, err := dev.EventDone(e)
	fmt.Println("done:", done, err)
	fmt.Println("release:", dev.ReleaseEvent(e))
	_, err = dev.EventDone(e)
	fmt.Println("released event is invalid:", errors.Is(err, device.ErrInvalidEvent))
	// Output:
	// synchronize: <nil>
	// done: true <nil>
	// release: <nil>
	// released event is invalid: true
}
