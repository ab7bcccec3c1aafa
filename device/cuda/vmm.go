//go:build cuda

// vmm.go: the virtual memory capability (device.VirtualMemory) on the
// driver's cuMemAddressReserve / cuMemCreate / cuMemMap family.

package cuda

import (
	"sort"

	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/device/cuda/internal/cudadrv"
)

// reservation is one range of address space from Reserve. Physical memory
// is mapped into it one granularity page at a time: each page has its own
// physical allocation (cuMemCreate of Granularity bytes), so that any
// page-aligned sub-range can be unmapped and its memory returned,
// whatever ranges were mapped together.
type reservation struct {
	base    device.Ptr
	size    uint64
	pages   []uint64 // physical allocation handle of each page, if mapped
	mapped  []bool   // whether each page is mapped
	nmapped int      // number of mapped pages
}

// VirtualMemorySupported reports whether the device supports the driver's
// virtual memory management (CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED).
// When it does not, Reserve, Map, Unmap and Release fail with
// device.ErrNotSupported.
func (d *Device) VirtualMemorySupported() bool { return d.vmm }

// Granularity returns the minimum granularity of physical allocations on
// the device (cuMemGetAllocationGranularity, 2 MiB on current GPUs), the
// unit of Reserve, Map and Unmap. Without virtual memory support it
// returns 0, which tells callers of device.VirtualMemory that the
// capability is absent (the caching allocator then refuses expandable
// segments up front).
func (d *Device) Granularity() uint64 {
	if !d.vmm {
		return 0
	}
	return d.gran
}

// checkRange validates a range of op: p and size multiples of the
// granularity, size > 0, no wrap-around.
func (d *Device) checkRange(op string, p device.Ptr, size uint64) error {
	if !d.vmm {
		return usageError(op, d.ordinal, device.ErrNotSupported, "the device has no virtual memory management")
	}
	if size == 0 || size%d.gran != 0 || uint64(p)%d.gran != 0 || uint64(p)+size < uint64(p) {
		return usageError(op, d.ordinal, device.ErrInvalidArgument,
			"range [%v, +%d) is not a non-empty multiple of the granularity %d", p, size, d.gran)
	}
	return nil
}

// findLocked returns the reservation that contains [p, p+size), or nil.
// The caller holds d.vmMu.
// pagesLocked finds the reservation holding [p, p+size) and the range of
// its page indexes, and checks that every page is mapped (wantMapped) or
// that none is. The caller holds d.vmMu.
func (d *Device) pagesLocked(op string, p device.Ptr, size uint64, wantMapped bool) (r *reservation, first, n int, err error) {
	r = d.findLocked(p, size)
	if r == nil {
		return nil, 0, 0, usageError(op, d.ordinal, device.ErrInvalidArgument, "range [%v, +%d) is not inside a reservation", p, size)
	}
	first = int((uint64(p) - uint64(r.base)) / d.gran)
	n = int(size / d.gran)
	for i := first; i < first+n; i++ {
		if r.mapped[i] != wantMapped {
			what := "is already mapped"
			if wantMapped {
				what = "is not mapped"
			}
			return nil, 0, 0, usageError(op, d.ordinal, device.ErrInvalidArgument, "page %v %s", device.Ptr(uint64(r.base)+uint64(i)*d.gran), what)
		}
	}
	return r, first, n, nil
}

func (d *Device) findLocked(p device.Ptr, size uint64) *reservation {
	i := sort.Search(len(d.reservations), func(i int) bool { return d.reservations[i].base > p })
	if i == 0 {
		return nil
	}
	r := d.reservations[i-1]
	if uint64(p)-uint64(r.base) > r.size || size > r.size-(uint64(p)-uint64(r.base)) {
		return nil
	}
	return r
}

// Reserve reserves size bytes of device address space (cuMemAddressReserve);
// size must be a multiple of Granularity.
func (d *Device) Reserve(size uint64) (device.Ptr, error) {
	if !d.vmm {
		return 0, usageError("reserve", d.ordinal, device.ErrNotSupported, "the device has no virtual memory management")
	}
	if size == 0 || size%d.gran != 0 {
		return 0, usageError("reserve", d.ordinal, device.ErrInvalidSize, "size %d is not a non-zero multiple of the granularity %d", size, d.gran)
	}
	if err := d.enter("reserve"); err != nil {
		return 0, err
	}
	defer d.life.RUnlock()
	var base uint64
	c := d.call(func() int {
		var c int
		base, c = cudadrv.AddressReserve(size)
		return c
	})
	if c != cudadrv.Success {
		return 0, driverError("reserve", d.ordinal, c, subjectSize)
	}
	n := size / d.gran
	r := &reservation{base: device.Ptr(base), size: size, pages: make([]uint64, n), mapped: make([]bool, n)}
	d.vmMu.Lock()
	i := sort.Search(len(d.reservations), func(i int) bool { return d.reservations[i].base > r.base })
	d.reservations = append(d.reservations, nil)
	copy(d.reservations[i+1:], d.reservations[i:])
	d.reservations[i] = r
	d.vmMu.Unlock()
	return r.base, nil
}

// Map backs [p, p+size) with physical memory: one cuMemCreate and cuMemMap
// per granularity page, then one cuMemSetAccess (read-write from this
// device) over the range. The range must lie in one reservation and be
// unmapped. If any step fails, what was mapped is unmapped and released
// again, so nothing changes; running out of physical memory gives
// device.ErrOutOfMemory.
func (d *Device) Map(p device.Ptr, size uint64) error {
	if err := d.checkRange("map", p, size); err != nil {
		return err
	}
	if err := d.enter("map"); err != nil {
		return err
	}
	defer d.life.RUnlock()
	d.vmMu.Lock()
	defer d.vmMu.Unlock()
	r, first, n, err := d.pagesLocked("map", p, size, false)
	if err != nil {
		return err
	}
	c := d.call(func() int {
		done := 0
		undo := func() {
			for i := first; i < first+done; i++ {
				cudadrv.Unmap(uint64(r.base)+uint64(i)*d.gran, d.gran)
				cudadrv.Release(r.pages[i])
			}
		}
		for i := first; i < first+n; i++ {
			h, c := cudadrv.Create(int(d.dev), d.gran)
			if c != cudadrv.Success {
				undo()
				return c
			}
			if c := cudadrv.Map(uint64(r.base)+uint64(i)*d.gran, d.gran, h); c != cudadrv.Success {
				cudadrv.Release(h)
				undo()
				return c
			}
			r.pages[i] = h
			done++
		}
		if c := cudadrv.SetAccess(uint64(p), size, int(d.dev)); c != cudadrv.Success {
			undo()
			return c
		}
		return cudadrv.Success
	})
	if c != cudadrv.Success {
		return driverError("map", d.ordinal, c, subjectRange)
	}
	for i := first; i < first+n; i++ {
		r.mapped[i] = true
	}
	r.nmapped += n
	return nil
}

// Unmap unmaps [p, p+size), page by page (cuMemUnmap), and releases each
// page's physical memory (cuMemRelease). Every page of the range must be
// mapped. If the driver fails part way, the pages before the failing one
// stay unmapped (and are recorded so); the error says which page failed.
func (d *Device) Unmap(p device.Ptr, size uint64) error {
	if err := d.checkRange("unmap", p, size); err != nil {
		return err
	}
	if err := d.enter("unmap"); err != nil {
		return err
	}
	defer d.life.RUnlock()
	d.vmMu.Lock()
	defer d.vmMu.Unlock()
	r, first, n, err := d.pagesLocked("unmap", p, size, true)
	if err != nil {
		return err
	}
	d.call(func() int {
		for i := first; i < first+n; i++ {
			addr := uint64(r.base) + uint64(i)*d.gran
			if c := cudadrv.Unmap(addr, d.gran); c != cudadrv.Success {
				err = driverError("unmap", d.ordinal, c, subjectRange)
				return c
			}
			r.mapped[i] = false
			r.nmapped--
			if c := cudadrv.Release(r.pages[i]); c != cudadrv.Success {
				// The page is unmapped; only its handle leaked.
				err = driverError("unmap", d.ordinal, c, subjectRange)
				return c
			}
		}
		return cudadrv.Success
	})
	return err
}

// Release frees a reservation from Reserve (cuMemAddressFree). Every page
// of it must be unmapped first.
func (d *Device) Release(p device.Ptr) error {
	if !d.vmm {
		return usageError("release", d.ordinal, device.ErrNotSupported, "the device has no virtual memory management")
	}
	if err := d.enter("release"); err != nil {
		return err
	}
	defer d.life.RUnlock()
	d.vmMu.Lock()
	defer d.vmMu.Unlock()
	i := sort.Search(len(d.reservations), func(i int) bool { return d.reservations[i].base >= p })
	if i == len(d.reservations) || d.reservations[i].base != p {
		return usageError("release", d.ordinal, device.ErrInvalidPointer, "%v is not a reservation of this device", p)
	}
	r := d.reservations[i]
	if r.nmapped != 0 {
		return usageError("release", d.ordinal, device.ErrInvalidArgument, "reservation %v still has %d mapped pages", p, r.nmapped)
	}
	if c := d.call(func() int { return cudadrv.AddressFree(uint64(r.base), r.size) }); c != cudadrv.Success {
		return driverError("release", d.ordinal, c, subjectPointer)
	}
	d.reservations = append(d.reservations[:i], d.reservations[i+1:]...)
	return nil
}
