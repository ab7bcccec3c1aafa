// The virtual-memory capability: address reservations and the physical
// pages mapped into them.

package sim

import (
	"cmp"
	"slices"
	"time"

	"github.com/gpumem/gpumem/device"
)

// A reservation is an address range from Reserve. mapped lists its mapped
// ranges as [start, end) address pairs, sorted, disjoint and never
// adjacent (touching ranges merge): mapping state is per page, not per Map
// call, so one Unmap may cover pages of several Maps, or part of one.
type reservation struct {
	base   device.Ptr
	size   uint64
	mapped [][2]uint64
	bytes  uint64 // mapped bytes
}

// Reservation describes a live reservation, for checkers.
type Reservation struct {
	Ptr    device.Ptr
	Size   uint64 // bytes of address space
	Mapped uint64 // bytes mapped (and charged) inside it
}

// Granularity returns the page size: reservations and mappings are made in
// multiples of it.
func (d *Device) Granularity() uint64 { return d.page }

// Reserve reserves size bytes of address space (a positive multiple of the
// granularity) from the device's virtual-memory region, at the lowest free
// address that fits, as Malloc does in its own region. It charges nothing
// against capacity.
func (d *Device) Reserve(size uint64) (device.Ptr, error) {
	d.mu.Lock()
	p, t, err := d.reserveLocked(size)
	d.mu.Unlock()
	nap(t)
	return p, err
}

func (d *Device) reserveLocked(size uint64) (device.Ptr, time.Duration, error) {
	const op = "reserve"
	t := d.payLocked(d.costs.Reserve)
	if size == 0 {
		return 0, t, d.fail(op, device.ErrInvalidSize, "size 0")
	}
	if size%d.page != 0 {
		return 0, t, d.fail(op, device.ErrInvalidArgument, "size %d is not a multiple of the granularity %d", size, d.page)
	}
	a, ok := d.vm.take(size)
	if !ok {
		return 0, t, d.fail(op, device.ErrOutOfMemory, "%s of address space requested: the 1 PiB virtual-memory region has no free range that large", formatBytes(size))
	}
	r := &reservation{base: device.Ptr(a), size: size}
	i, _ := slices.BinarySearchFunc(d.resv, r.base, func(r *reservation, p device.Ptr) int { return cmp.Compare(r.base, p) })
	d.resv = slices.Insert(d.resv, i, r)
	d.c.Reserves++
	return r.base, t, nil
}

// rangeLocked checks that [p, p+size) is page aligned, non-empty and inside
// one reservation, and returns that reservation.
func (d *Device) rangeLocked(op string, p device.Ptr, size uint64) (*reservation, error) {
	if size == 0 {
		return nil, d.fail(op, device.ErrInvalidArgument, "size 0")
	}
	if size%d.page != 0 || uint64(p)%d.page != 0 {
		return nil, d.fail(op, device.ErrInvalidArgument, "range %v+%d is not aligned to the granularity %d", p, size, d.page)
	}
	i, found := slices.BinarySearchFunc(d.resv, p, func(r *reservation, p device.Ptr) int { return cmp.Compare(r.base, p) })
	if !found {
		i-- // the reservation with the greatest base below p
	}
	if i >= 0 {
		r := d.resv[i]
		if off := uint64(p - r.base); off < r.size && size <= r.size-off {
			return r, nil
		}
	}
	return nil, d.fail(op, device.ErrInvalidArgument, "range %v+%d is not inside one reservation", p, size)
}

// Map backs [p, p+size) with physical pages charged against capacity. The
// range must lie in one reservation, be aligned to the granularity and
// have no page mapped (else device.ErrInvalidArgument). When fewer bytes
// are free than size, or an injected fault says so (FailNthMalloc,
// FailMallocAbove and FailMallocWhen apply to Map as to Malloc), it fails
// with device.ErrOutOfMemory and maps nothing.
func (d *Device) Map(p device.Ptr, size uint64) error {
	injected := d.predicateSays(size)
	d.mu.Lock()
	t, err := d.mapLocked(p, size, injected)
	d.mu.Unlock()
	nap(t)
	return err
}

func (d *Device) mapLocked(p device.Ptr, size uint64, injected bool) (time.Duration, error) {
	const op = "map"
	t := d.payLocked(times(d.costs.Map, size/d.page))
	r, err := d.rangeLocked(op, p, size)
	if err != nil {
		return t, err
	}
	lo, hi := uint64(p), uint64(p)+size
	// The first mapped range that ends after lo must start at or after hi.
	i, _ := slices.BinarySearchFunc(r.mapped, lo, func(m [2]uint64, a uint64) int { return cmp.Compare(m[1], a+1) })
	if i < len(r.mapped) && r.mapped[i][0] < hi {
		return t, d.fail(op, device.ErrInvalidArgument, "range %v+%d overlaps mapped pages", p, size)
	}
	if why := d.faults.mallocFault(size, injected); why != "" {
		d.c.FailedMaps++
		return t, d.fail(op, device.ErrOutOfMemory, "%s requested; injected fault: %s", formatBytes(size), why)
	}
	if size > d.capacity-d.used {
		d.c.FailedMaps++
		return t, d.fail(op, device.ErrOutOfMemory, "%s requested, %s free of %s",
			formatBytes(size), formatBytes(d.capacity-d.used), formatBytes(d.capacity))
	}
	// Insert at i, merging with a range that ends at lo or starts at hi.
	joinPrev := i > 0 && r.mapped[i-1][1] == lo
	joinNext := i < len(r.mapped) && r.mapped[i][0] == hi
	switch {
	case joinPrev && joinNext:
		r.mapped[i-1][1] = r.mapped[i][1]
		r.mapped = slices.Delete(r.mapped, i, i+1)
	case joinPrev:
		r.mapped[i-1][1] = hi
	case joinNext:
		r.mapped[i][0] = lo
	default:
		r.mapped = slices.Insert(r.mapped, i, [2]uint64{lo, hi})
	}
	r.bytes += size
	d.chargeLocked(size)
	d.c.MappedBytes += size
	d.c.Maps++
	return t, nil
}

// Unmap releases the physical pages behind [p, p+size), which must all be
// mapped (by one Map or several), and returns their charge. A range with an
// unmapped page, misaligned or outside one reservation fails with
// device.ErrInvalidArgument and changes nothing; FailFrees makes it fail
// too.
func (d *Device) Unmap(p device.Ptr, size uint64) error {
	d.mu.Lock()
	t, err := d.unmapLocked(p, size)
	d.mu.Unlock()
	nap(t)
	return err
}

func (d *Device) unmapLocked(p device.Ptr, size uint64) (time.Duration, error) {
	const op = "unmap"
	t := d.payLocked(times(d.costs.Unmap, size/d.page))
	r, err := d.rangeLocked(op, p, size)
	if err != nil {
		return t, err
	}
	lo, hi := uint64(p), uint64(p)+size
	// Merged ranges: every page is mapped iff one range covers them all.
	i, _ := slices.BinarySearchFunc(r.mapped, lo, func(m [2]uint64, a uint64) int { return cmp.Compare(m[1], a+1) })
	if i == len(r.mapped) || r.mapped[i][0] > lo || r.mapped[i][1] < hi {
		return t, d.fail(op, device.ErrInvalidArgument, "range %v+%d has pages that are not mapped", p, size)
	}
	if err := d.faults.freeErr; err != nil {
		d.c.FailedUnmaps++
		return t, d.fail(op, err, "range %v+%d: injected fault", p, size)
	}
	m := r.mapped[i]
	switch {
	case m[0] == lo && m[1] == hi:
		r.mapped = slices.Delete(r.mapped, i, i+1)
	case m[0] == lo:
		r.mapped[i][0] = hi
	case m[1] == hi:
		r.mapped[i][1] = lo
	default:
		r.mapped[i][1] = lo
		r.mapped = slices.Insert(r.mapped, i+1, [2]uint64{hi, m[1]})
	}
	r.bytes -= size
	d.dropLocked(lo, hi)
	d.unchargeLocked(size)
	d.c.MappedBytes -= size
	d.c.Unmaps++
	return t, nil
}

// Release frees a reservation. p must be a base that Reserve returned and
// no page of the reservation may be mapped; otherwise it fails with
// device.ErrInvalidArgument and changes nothing.
func (d *Device) Release(p device.Ptr) error {
	d.mu.Lock()
	t, err := d.releaseLocked(p)
	d.mu.Unlock()
	nap(t)
	return err
}

func (d *Device) releaseLocked(p device.Ptr) (time.Duration, error) {
	const op = "release"
	t := d.payLocked(d.costs.Release)
	i, found := slices.BinarySearchFunc(d.resv, p, func(r *reservation, p device.Ptr) int { return cmp.Compare(r.base, p) })
	if !found {
		return t, d.fail(op, device.ErrInvalidArgument, "%v is not the base of a reservation", p)
	}
	r := d.resv[i]
	if r.bytes != 0 {
		return t, d.fail(op, device.ErrInvalidArgument, "reservation %v still has %s mapped", p, formatBytes(r.bytes))
	}
	d.resv = slices.Delete(d.resv, i, i+1)
	d.vm.give(uint64(r.base), r.size)
	d.c.Releases++
	return t, nil
}

// Reservations returns the live reservations in address order.
func (d *Device) Reservations() []Reservation {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make([]Reservation, len(d.resv))
	for i, r := range d.resv {
		out[i] = Reservation{Ptr: r.base, Size: r.size, Mapped: r.bytes}
	}
	return out
}

// Mapped returns the mapped ranges of the reservation at base, in address
// order, merged where they touch (each Range's Size and Charged are its
// length); nil if base is not a reservation's base.
func (d *Device) Mapped(base device.Ptr) []Range {
	d.mu.Lock()
	defer d.mu.Unlock()
	i, found := slices.BinarySearchFunc(d.resv, base, func(r *reservation, p device.Ptr) int { return cmp.Compare(r.base, p) })
	if !found {
		return nil
	}
	out := make([]Range, len(d.resv[i].mapped))
	for j, m := range d.resv[i].mapped {
		out[j] = Range{Ptr: device.Ptr(m[0]), Size: m[1] - m[0], Charged: m[1] - m[0]}
	}
	return out
}
