//go:build cuda

// pool.go: copies between host and device (device.Copier, cuMemcpyDtoH /
// cuMemcpyHtoD) and the device's default memory pool
// (device.StreamOrderedMemory, cuMemAllocFromPoolAsync / cuMemFreeAsync).

package cuda

import (
	"math"

	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/device/cuda/internal/cudadrv"
)

// handedOut reports whether [p, p+n) lies inside one live Malloc
// allocation, one live pool block, or pages of one reservation that are
// all mapped. It scans the live allocations: copies are rare (a pool's
// backup and restore), so no index is kept for them.
func (d *Device) handedOut(p device.Ptr, n uint64) bool {
	lo, hi := uint64(p), uint64(p)+n
	if hi < lo || p == 0 {
		return false
	}
	inside := func(m map[device.Ptr]uint64) bool {
		for a, size := range m {
			if lo >= uint64(a) && hi <= uint64(a)+size {
				return true
			}
		}
		return false
	}
	d.memMu.Lock()
	ok := inside(d.mem)
	d.memMu.Unlock()
	if ok {
		return true
	}
	d.asyncMu.Lock()
	ok = inside(d.async)
	d.asyncMu.Unlock()
	if ok {
		return true
	}
	d.vmMu.Lock()
	defer d.vmMu.Unlock()
	r := d.findLocked(p, n)
	if r == nil || d.gran == 0 {
		return false
	}
	first := (lo - uint64(r.base)) / d.gran
	last := (hi - 1 - uint64(r.base)) / d.gran
	for i := first; i <= last; i++ {
		if !r.mapped[i] {
			return false
		}
	}
	return true
}

// CopyToHost copies len(dst) bytes from device address src into dst
// (cuMemcpyDtoH, synchronous with respect to the host). The range must lie
// inside memory this Device handed out and backs now (a Malloc allocation,
// a pool block, mapped pages); otherwise it fails with
// device.ErrInvalidPointer before the driver is called. An empty dst
// copies nothing.
func (d *Device) CopyToHost(dst []byte, src device.Ptr) error {
	const op = "copy to host"
	if len(dst) == 0 {
		return nil
	}
	if err := d.enter(op); err != nil {
		return err
	}
	defer d.life.RUnlock()
	if !d.handedOut(src, uint64(len(dst))) {
		return usageError(op, d.ordinal, device.ErrInvalidPointer, "range %v+%d is not inside memory this device handed out", src, len(dst))
	}
	if c := d.call(func() int { return cudadrv.MemcpyDtoH(dst, uint64(src)) }); c != cudadrv.Success {
		return driverError(op, d.ordinal, c, subjectPointer)
	}
	return nil
}

// CopyFromHost copies src to device memory at dst (cuMemcpyHtoD), under
// CopyToHost's rules.
func (d *Device) CopyFromHost(dst device.Ptr, src []byte) error {
	const op = "copy from host"
	if len(src) == 0 {
		return nil
	}
	if err := d.enter(op); err != nil {
		return err
	}
	defer d.life.RUnlock()
	if !d.handedOut(dst, uint64(len(src))) {
		return usageError(op, d.ordinal, device.ErrInvalidPointer, "range %v+%d is not inside memory this device handed out", dst, len(src))
	}
	if c := d.call(func() int { return cudadrv.MemcpyHtoD(uint64(dst), src) }); c != cudadrv.Success {
		return driverError(op, d.ordinal, c, subjectPointer)
	}
	return nil
}

// MemoryPoolsSupported reports whether the device has stream-ordered
// memory pools (CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED). When it does
// not, the device.StreamOrderedMemory methods fail with
// device.ErrNotSupported without calling the driver.
func (d *Device) MemoryPoolsSupported() bool { return d.pools }

// poolEnter is enter for the pool's calls: it also fails with
// device.ErrNotSupported when the device has no memory pools.
func (d *Device) poolEnter(op string) error {
	if !d.pools {
		return usageError(op, d.ordinal, device.ErrNotSupported, "the device has no stream-ordered memory pools (CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED is 0)")
	}
	return d.enter(op)
}

// MallocAsync allocates size bytes from the device's default memory pool
// in the order of stream s (cuMemAllocFromPoolAsync).
func (d *Device) MallocAsync(size uint64, s device.Stream) (device.Ptr, error) {
	const op = "malloc async"
	if size == 0 || size > math.MaxInt64 {
		return 0, usageError(op, d.ordinal, device.ErrInvalidSize, "size %d", size)
	}
	if err := d.poolEnter(op); err != nil {
		return 0, err
	}
	defer d.life.RUnlock()
	d.streamMu.RLock()
	cs, err := d.streamLocked(op, s)
	d.streamMu.RUnlock()
	if err != nil {
		return 0, err
	}
	var p uint64
	c := d.call(func() int {
		var c int
		p, c = cudadrv.AllocAsync(size, d.pool, handleOf(cs))
		return c
	})
	if c != cudadrv.Success {
		return 0, driverError(op, d.ordinal, c, subjectSize)
	}
	d.asyncMu.Lock()
	d.async[device.Ptr(p)] = size
	d.asyncMu.Unlock()
	return device.Ptr(p), nil
}

// FreeAsync returns a block of MallocAsync to the pool in the order of
// stream s (cuMemFreeAsync). An address MallocAsync did not return, or one
// already freed, fails with device.ErrInvalidPointer before the driver is
// called.
func (d *Device) FreeAsync(p device.Ptr, s device.Stream) error {
	const op = "free async"
	if err := d.poolEnter(op); err != nil {
		return err
	}
	defer d.life.RUnlock()
	d.streamMu.RLock()
	cs, err := d.streamLocked(op, s)
	d.streamMu.RUnlock()
	if err != nil {
		return err
	}
	// Forget p before the driver frees it, as Free does.
	d.asyncMu.Lock()
	size, ok := d.async[p]
	delete(d.async, p)
	d.asyncMu.Unlock()
	if !ok {
		return usageError(op, d.ordinal, device.ErrInvalidPointer, "%v was not returned by MallocAsync or was already freed", p)
	}
	if c := d.call(func() int { return cudadrv.FreeAsync(uint64(p), handleOf(cs)) }); c != cudadrv.Success {
		d.asyncMu.Lock()
		d.async[p] = size
		d.asyncMu.Unlock()
		return driverError(op, d.ordinal, c, subjectPointer)
	}
	return nil
}

// SetReleaseThreshold sets the pool's CU_MEMPOOL_ATTR_RELEASE_THRESHOLD:
// the reserved bytes it keeps when a synchronization lets it return memory.
func (d *Device) SetReleaseThreshold(bytes uint64) error {
	const op = "set release threshold"
	if err := d.poolEnter(op); err != nil {
		return err
	}
	defer d.life.RUnlock()
	if c := cudadrv.PoolSetAttribute(d.pool, cudadrv.PoolReleaseThreshold, bytes); c != cudadrv.Success {
		return driverError(op, d.ordinal, c, subjectNone)
	}
	return nil
}

// TrimPool returns the pool's unused memory to the device, keeping at
// least keep bytes reserved (cuMemPoolTrimTo).
func (d *Device) TrimPool(keep uint64) error {
	const op = "trim pool"
	if err := d.poolEnter(op); err != nil {
		return err
	}
	defer d.life.RUnlock()
	if c := cudadrv.PoolTrimTo(d.pool, keep); c != cudadrv.Success {
		return driverError(op, d.ordinal, c, subjectNone)
	}
	return nil
}

// PoolUsage reads the pool's CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT / _HIGH
// and USED_MEM_CURRENT / _HIGH.
func (d *Device) PoolUsage() (device.PoolUsage, error) {
	const op = "pool usage"
	if err := d.poolEnter(op); err != nil {
		return device.PoolUsage{}, err
	}
	defer d.life.RUnlock()
	var u device.PoolUsage
	for _, a := range []struct {
		attr int
		to   *uint64
	}{
		{cudadrv.PoolReservedMemCurrent, &u.Reserved},
		{cudadrv.PoolReservedMemHigh, &u.ReservedPeak},
		{cudadrv.PoolUsedMemCurrent, &u.Used},
		{cudadrv.PoolUsedMemHigh, &u.UsedPeak},
	} {
		v, c := cudadrv.PoolGetAttribute(d.pool, a.attr)
		if c != cudadrv.Success {
			return device.PoolUsage{}, driverError(op, d.ordinal, c, subjectNone)
		}
		*a.to = v
	}
	return u, nil
}

// ResetPoolPeaks sets the pool's high-water marks to the current values
// (the driver resets CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH and USED_MEM_HIGH
// when they are set to 0).
func (d *Device) ResetPoolPeaks() error {
	const op = "reset pool peaks"
	if err := d.poolEnter(op); err != nil {
		return err
	}
	defer d.life.RUnlock()
	for _, attr := range []int{cudadrv.PoolReservedMemHigh, cudadrv.PoolUsedMemHigh} {
		if c := cudadrv.PoolSetAttribute(d.pool, attr, 0); c != cudadrv.Success {
			return driverError(op, d.ordinal, c, subjectNone)
		}
	}
	return nil
}
