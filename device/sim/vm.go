// This file holds the virtual-memory and host-memory capabilities.

package sim

import (
	"fmt"
	"slices"

	"github.com/gpumem/gpumem/device"
)

// A reservation is an address range from Reserve; mapped marks its pages
// that are backed by (charged) physical memory.
type reservation struct {
	size   uint64
	mapped []bool // one per page
}

// Granularity returns the page size: reservations and mappings are made
// in multiples of it.
func (d *Device) Granularity() uint64 { return d.page }

// Reserve reserves size bytes of address space from the device's
// virtual-memory region, first fit, lowest address. Nothing is charged.
func (d *Device) Reserve(size uint64) (device.Ptr, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if size == 0 || size%d.page != 0 {
		return 0, d.errorf("reserve", device.ErrInvalidSize, "size %d is not a positive multiple of %d", size, d.page)
	}
	p, ok := d.vm.take(size)
	if !ok {
		return 0, d.errorf("reserve", device.ErrOutOfMemory, "virtual address space exhausted")
	}
	d.reserved[p] = &reservation{size: size, mapped: make([]bool, size/d.page)}
	d.c.Reserves++
	d.pay(d.costs.Reserve)
	return p, nil
}

// pagesLocked finds the reservation holding [p, p+size) and the page
// indexes of the range.
func (d *Device) pagesLocked(op string, p device.Ptr, size uint64) (*reservation, int, int, error) {
	if size == 0 || size%d.page != 0 || uint64(p)%d.page != 0 {
		return nil, 0, 0, d.errorf(op, device.ErrInvalidArgument, "range %v+%d is not page aligned", p, size)
	}
	for base, r := range d.reserved {
		if p >= base && uint64(p-base)+size <= r.size && uint64(p-base) < r.size {
			first := int(uint64(p-base) / d.page)
			return r, first, first + int(size/d.page), nil
		}
	}
	return nil, 0, 0, d.errorf(op, device.ErrInvalidArgument, "range %v+%d is not inside a reservation", p, size)
}

// Map backs [p, p+size) with physical memory charged against capacity.
// The malloc faults (FailNthMalloc, FailMallocAbove, FailMallocWhen) apply
// to it too.
func (d *Device) Map(p device.Ptr, size uint64) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	r, lo, hi, err := d.pagesLocked("map", p, size)
	if err != nil {
		return err
	}
	if slices.Contains(r.mapped[lo:hi], true) {
		return d.errorf("map", device.ErrInvalidArgument, "range %v+%d is already partly mapped", p, size)
	}
	d.mallocCall++
	if err := d.faults.mallocFault(d.mallocCall, size); err != nil {
		d.c.FailedMallocs++
		return d.errorf("map", device.ErrOutOfMemory, "%v", err)
	}
	if d.used+size > d.capacity {
		d.c.FailedMallocs++
		return d.errorf("map", device.ErrOutOfMemory, "%d bytes requested, %d free", size, d.capacity-d.used)
	}
	for i := lo; i < hi; i++ {
		r.mapped[i] = true
	}
	d.useLocked(int64(size))
	d.c.Maps++
	d.pay(d.costs.MapPerPage * timeUnits(size/d.page))
	return nil
}

// Unmap releases the physical memory behind [p, p+size), which must be
// wholly mapped.
func (d *Device) Unmap(p device.Ptr, size uint64) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	r, lo, hi, err := d.pagesLocked("unmap", p, size)
	if err != nil {
		return err
	}
	if slices.Contains(r.mapped[lo:hi], false) {
		return d.errorf("unmap", device.ErrInvalidArgument, "range %v+%d is not wholly mapped", p, size)
	}
	if err := d.faults.freeErr; err != nil {
		d.c.FailedFrees++
		return fmt.Errorf("sim: device %d: unmap %v: %w", d.ordinal, p, err)
	}
	for i := lo; i < hi; i++ {
		r.mapped[i] = false
	}
	d.useLocked(-int64(size))
	d.c.Unmaps++
	d.pay(d.costs.UnmapPerPage * timeUnits(size/d.page))
	return nil
}

// Release frees a reservation, which must have no page mapped.
func (d *Device) Release(p device.Ptr) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	r, ok := d.reserved[p]
	if !ok {
		return d.errorf("release", device.ErrInvalidPointer, "%v is not a reservation", p)
	}
	if slices.Contains(r.mapped, true) {
		return d.errorf("release", device.ErrInvalidArgument, "reservation %v still has mapped pages", p)
	}
	delete(d.reserved, p)
	d.vm.give(p, r.size)
	d.c.Releases++
	d.pay(d.costs.Release)
	return nil
}

// HostAlloc returns size bytes of (simulated) pinned host memory: real Go
// memory.
func (d *Device) HostAlloc(size uint64) ([]byte, error) {
	if size == 0 || size > 1<<40 {
		return nil, d.errorf("host alloc", device.ErrInvalidSize, "size %d", size)
	}
	b := make([]byte, size)
	d.mu.Lock()
	defer d.mu.Unlock()
	d.host[&b[0]] = len(b)
	d.c.HostAllocs++
	d.pay(d.costs.HostAlloc)
	return b, nil
}

// HostFree releases memory from HostAlloc.
func (d *Device) HostFree(b []byte) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(b) == 0 {
		return d.errorf("host free", device.ErrInvalidPointer, "empty slice")
	}
	n, ok := d.host[&b[0]]
	if !ok || n != len(b) {
		return d.errorf("host free", device.ErrInvalidPointer, "memory was not returned by HostAlloc or was already freed")
	}
	delete(d.host, &b[0])
	d.c.HostFrees++
	d.pay(d.costs.HostFree)
	return nil
}
