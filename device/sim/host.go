// The host-memory capability: pinned host memory, simulated by Go memory.

package sim

import (
	"github.com/gpumem/gpumem/device"
)

// HostAlloc returns size bytes of (simulated) pinned host memory: a real,
// zeroed Go slice. The live total is bounded by Config.HostCapacity; beyond
// it HostAlloc fails with device.ErrOutOfMemory. Size 0 fails with
// device.ErrInvalidSize.
func (d *Device) HostAlloc(size uint64) ([]byte, error) {
	const op = "host alloc"
	d.mu.Lock()
	t := d.payLocked(d.costs.hostAlloc(size))
	var err error
	switch {
	case size == 0:
		err = d.fail(op, device.ErrInvalidSize, "size 0")
	case size > d.hostCap-d.c.HostBytesInUse:
		err = d.fail(op, device.ErrOutOfMemory, "%s requested, %s of pinned host memory free of %s",
			formatBytes(size), formatBytes(d.hostCap-d.c.HostBytesInUse), formatBytes(d.hostCap))
	default:
		// Hold the bytes while the slice is made without the lock.
		d.c.HostBytesInUse += size
	}
	d.mu.Unlock()
	if err != nil {
		nap(t)
		return nil, err
	}
	b := make([]byte, size)
	d.mu.Lock()
	d.host[&b[0]] = size
	d.c.HostAllocs++
	d.mu.Unlock()
	nap(t)
	return b, nil
}

// HostFree releases memory that HostAlloc returned. The allocation is
// identified by its first byte (&b[0]), as cudaFreeHost identifies it by
// its pointer; any other slice, an empty one or one already freed fails
// with device.ErrInvalidPointer.
func (d *Device) HostFree(b []byte) error {
	const op = "host free"
	d.mu.Lock()
	t := d.payLocked(d.costs.HostFree)
	var err error
	if len(b) == 0 {
		err = d.fail(op, device.ErrInvalidPointer, "empty slice")
	} else if n, ok := d.host[&b[0]]; !ok {
		err = d.fail(op, device.ErrInvalidPointer, "memory at %p was not returned by HostAlloc, or was freed already", &b[0])
	} else {
		delete(d.host, &b[0])
		d.c.HostBytesInUse -= n
		d.c.HostFrees++
	}
	d.mu.Unlock()
	nap(t)
	return err
}
