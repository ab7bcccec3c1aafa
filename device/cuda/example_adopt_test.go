//go:build cuda

// example_adopt_test.go: a runnable example of sharing a runtime's stream
// with gpumem both ways (it needs a device: the stub driver or a GPU).

package cuda_test

import (
	"fmt"
	"runtime"

	"gorgonia.org/cu"

	"github.com/gpumem/gpumem/allocator"
	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/device/cuda"
)

// A runtime that launches kernels on its own stream adopts that stream, so
// that the caching allocator orders memory on it, and gets the driver
// handles back to launch with.
func ExampleDevice_AdoptStream() {
	dev, err := cuda.Open(0)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer dev.Close()

	// The runtime's own stream, made in the device's context.
	mine, err := inContext(dev.Context(), func() (cu.Stream, error) { return cu.MakeStream(cu.NonBlocking) })
	if err != nil {
		fmt.Println(err)
		return
	}
	defer inContext(dev.Context(), func() (cu.Stream, error) { return cu.NoStream, mine.Destroy() })

	s, err := dev.AdoptStream(mine)
	if err != nil {
		fmt.Println(err)
		return
	}
	a, err := allocator.New(dev, allocator.Config{})
	if err != nil {
		fmt.Println(err)
		return
	}
	p, err := a.Alloc(1<<20, s) // ordered on the runtime's stream
	if err != nil {
		fmt.Println(err)
		return
	}
	launchOn, _ := dev.DriverStream(s)
	var ptr cu.DevicePtr = cuda.DevicePtr(p) // a kernel argument
	fmt.Println("same stream:", launchOn == mine, "pointer set:", ptr != 0)
	fmt.Println("free:", a.Free(p))
	legacy, _ := dev.AdoptStreamHandle(cuda.StreamLegacy)
	fmt.Println("legacy is the default stream:", legacy == device.DefaultStream)
	// Output:
	// same stream: true pointer set: true
	// free: <nil>
	// legacy is the default stream: true
}

// inContext runs f with ctx current on a locked OS thread, as a runtime's
// own driver calls run.
func inContext(ctx cu.CUContext, f func() (cu.Stream, error)) (cu.Stream, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := cu.PushCurrentCtx(ctx); err != nil {
		return cu.NoStream, err
	}
	defer cu.PopCurrentCtx()
	return f()
}
