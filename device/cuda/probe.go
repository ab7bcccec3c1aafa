//go:build cuda

// probe.go: whether the driver initialized and how many devices it sees.

package cuda

import (
	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/device/cuda/internal/cudadrv"
	"gorgonia.org/cu"
)

func init() {
	// gorgonia.org/cu's init (which calls cuInit) has run: this package
	// imports it. From now on cuInit failures are reported, not masked.
	cudadrv.EndInitMasking()
}

// DeviceCount returns the number of CUDA devices. When the driver did not
// initialize (no GPU, driver and library mismatch, ...) it returns an error
// wrapping ErrNoDevice with the driver's code and text.
func DeviceCount() (int, error) {
	called, found, code := cudadrv.InitResult()
	switch {
	case !called:
		return 0, usageError("init", -1, ErrNoDevice, "cuInit was never called")
	case !found:
		return 0, usageError("init", -1, ErrNoDevice, "the loaded libcuda.so.1 has no cuInit")
	case code != cudadrv.Success:
		return 0, driverError("init", -1, code, subjectNone)
	}
	n, err := cu.NumDevices()
	if c := codeOf(err); c != cudadrv.Success {
		return 0, driverError("device count", -1, c, subjectNone)
	}
	return n, nil
}

// Available reports whether the driver initialized and sees at least one
// device, so that Open(0) can succeed.
func Available() bool {
	n, err := DeviceCount()
	return err == nil && n > 0
}

var _ device.Device = (*Device)(nil)
var _ device.VirtualMemory = (*Device)(nil)
var _ device.HostMemory = (*Device)(nil)
var _ device.StreamWaiter = (*Device)(nil)
