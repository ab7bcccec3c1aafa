//go:build cuda

// host.go: the pinned host memory capability (device.HostMemory).

package cuda

import (
	"math"
	"unsafe"

	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/device/cuda/internal/cudadrv"
)

// HostAlloc allocates size bytes of page-locked host memory
// (cuMemHostAlloc, default flags) that the device can reach directly. The
// slice's memory belongs to the driver, not to Go's heap: it stays valid
// until HostFree or Close.
func (d *Device) HostAlloc(size uint64) ([]byte, error) {
	if size == 0 || size > math.MaxInt {
		return nil, usageError("host alloc", d.ordinal, device.ErrInvalidSize, "size %d", size)
	}
	if err := d.enter("host alloc"); err != nil {
		return nil, err
	}
	defer d.life.RUnlock()
	var p unsafe.Pointer
	c := d.call(func() int {
		var c int
		p, c = cudadrv.HostAlloc(size)
		return c
	})
	if c != cudadrv.Success {
		return nil, driverError("host alloc", d.ordinal, c, subjectSize)
	}
	d.hostMu.Lock()
	d.hosts[p] = size
	d.hostMu.Unlock()
	return unsafe.Slice((*byte)(p), size), nil
}

// HostFree releases memory from HostAlloc (cuMemFreeHost). b may be a
// reslice of the returned slice, as long as it starts where it did.
func (d *Device) HostFree(b []byte) error {
	if err := d.enter("host free"); err != nil {
		return err
	}
	defer d.life.RUnlock()
	p := unsafe.Pointer(unsafe.SliceData(b))
	d.hostMu.Lock()
	size, ok := d.hosts[p]
	delete(d.hosts, p)
	d.hostMu.Unlock()
	if p == nil || !ok {
		return usageError("host free", d.ordinal, device.ErrInvalidPointer, "%p was not returned by HostAlloc or was already freed", p)
	}
	if c := d.call(func() int { return cudadrv.HostFree(p) }); c != cudadrv.Success {
		d.hostMu.Lock()
		d.hosts[p] = size
		d.hostMu.Unlock()
		return driverError("host free", d.ordinal, c, subjectPointer)
	}
	return nil
}
