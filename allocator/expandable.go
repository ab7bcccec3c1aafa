// This file holds expandable segments: address ranges reserved once per
// stream and pool and backed by memory page by page (PyTorch's
// expandable_segments:True).

package allocator

import (
	"errors"
	"fmt"

	"github.com/gpumem/gpumem/device"
)

// Expandable segments, as PyTorch 2.6 builds them:
//
//   - A segment is an address range of 9/8 of the device's memory, rounded
//     up to whole pages, reserved with VirtualMemory.Reserve the first time
//     a stream needs memory from a pool. Its page is 2 MiB in the small
//     pool and 20 MiB in the large pool. (Current PyTorch's
//     expandable_segments_reserve and large_segment_size_mb change the
//     range and the large page when set; see conf_effects.go.)
//   - Its blocks tile the whole range. A block is mapped (backed by memory:
//     allocated, pending or free) or unmapped (in the pool's unmapped index,
//     by stream and address). Two unmapped neighbours are always merged, and
//     so are two free mapped ones; a free block never merges with an
//     unmapped one.
//   - On a cache miss the allocator finds the lowest address, among the
//     stream's unmapped ranges (each taken together with a free block just
//     before it), where enough free and unmapped space follows; it maps the
//     pages needed there, merges them with free neighbours and hands out
//     the result through the usual split. Mapping counts as a device
//     allocation and adds to reserved bytes, but not to the segment count.
//   - Emptying the cache unmaps every whole page inside free blocks (after
//     synchronizing the segment's stream, as unmapping does not wait for
//     the device) and releases every segment with nothing mapped.
//   - Every split keeps a remainder of 512 bytes or more, and expandable
//     blocks never count as inactive split.
//
// gpumem differs in one point: a segment reserved for an allocation that
// then fails is released at once, so that failed allocations cannot
// exhaust the device's address space; and a release the device refuses is
// retried by the next EmptyCache or out-of-memory flush.

// growExpandableLocked maps memory for a request of size bytes on stream s
// and returns a free block of at least size bytes, in the free index. A
// refusal for lack of memory wraps device.ErrOutOfMemory; pages mapped
// before the refusal stay mapped, as free cached memory, as in PyTorch.
func (a *Allocator) growExpandableLocked(x *freeIndex, size uint64) (*block, error) {
	c, reserved, err := a.findExpandableLocked(x, size)
	if err != nil {
		return nil, err
	}
	if c.unmapped {
		m, err := a.mapLocked(c, min(c.size, size))
		if err != nil {
			if reserved {
				// Nothing of the new segment is mapped: give its address
				// range back now rather than at the next flush.
				_ = a.releaseExpandableLocked(c)
			}
			return nil, err
		}
		c = m
	}
	for c.size < size {
		// c is free and followed by an unmapped range: map the rest there;
		// the mapped pages merge with c.
		if c, err = a.mapLocked(c.next, min(size-c.size, c.next.size)); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// findExpandableLocked returns the lowest-addressed block of x's pool and
// stream from which size bytes of free and unmapped space follow, reserving a
// new segment when no segment has room (reserved is then true and the
// block is the new segment's one unmapped range).
func (a *Allocator) findExpandableLocked(x *freeIndex, size uint64) (found *block, reserved bool, err error) {
	p, s := x.pool, x.stream
	a.key.stream, a.key.ptr = s, 0
	p.unmapped.AscendGreaterOrEqual(&a.key, func(u *block) bool {
		if u.stream != s {
			return false
		}
		c := u
		if u.prev != nil && !u.prev.busy() {
			c = u.prev
		}
		var room uint64
		for b := c; b != nil && room < size && !b.busy(); b = b.next {
			room += b.size
		}
		if room >= size {
			found = c
			return false
		}
		return true
	})
	if found != nil {
		return found, false, nil
	}
	page := a.rule.large
	if p.small {
		page = kSmallBuffer
	}
	n := a.expandableReserve(page)
	if n < size && a.cfg.ExpandableSegmentsReserve != (Reserve{}) {
		return nil, false, errReserveTooSmall
	}
	ptr, err := a.vm.Reserve(n)
	if err != nil {
		if refused(err) {
			return nil, false, err
		}
		return nil, false, fmt.Errorf("allocator: device %d: reserving an expandable segment of %d bytes: %w", a.ordinal, n, err)
	}
	seg := &segment{ptr: ptr, size: n, stream: s, pool: p, free: x, page: page}
	b := x.spares.get()
	b.ptr, b.size, b.stream, b.pool, b.seg, b.unmapped = ptr, n, s, p, seg, true
	seg.head = b
	a.segmentAddedLocked(seg)
	p.unmapped.ReplaceOrInsert(b)
	return b, true, nil
}

// mapLocked backs the first size bytes of the unmapped block u with
// memory, rounded up to whole pages, and makes them a free block merged
// with free neighbours, which it returns; the rest of u stays unmapped.
// On an error nothing changes.
func (a *Allocator) mapLocked(u *block, size uint64) (*block, error) {
	seg, p := u.seg, u.pool
	begin := uint64(u.ptr-seg.ptr) / seg.page
	end := (uint64(u.ptr-seg.ptr) + size + seg.page - 1) / seg.page
	n := (end - begin) * seg.page
	if err := a.vm.Map(u.ptr, n); err != nil {
		if refused(err) {
			return nil, err
		}
		return nil, fmt.Errorf("allocator: device %d: mapping %d bytes at %v: %w", a.ordinal, n, u.ptr, err)
	}
	p.unmapped.Delete(u)
	a.routePagesLocked(seg, u.ptr, n, +1)
	if n < u.size {
		rest := seg.free.spares.get()
		rest.ptr, rest.size, rest.stream, rest.pool, rest.seg, rest.unmapped = u.ptr+device.Ptr(n), u.size-n, u.stream, p, seg, true
		u.linkAfter(rest)
		p.unmapped.ReplaceOrInsert(rest)
		u.size = n
	}
	u.unmapped = false
	a.pagesMappedLocked(seg, u.ptr, n)
	return seg.free.put(u), nil
}

// unmapLocked returns to the device the whole pages inside the free
// expandable block b. The pages become an unmapped range (merged with
// unmapped neighbours); the free bytes before and after them stay free
// blocks. On an error nothing changes.
func (a *Allocator) unmapLocked(b *block) error {
	seg, x := b.seg, b.seg.free
	off := uint64(b.ptr - seg.ptr)
	begin := (off + seg.page - 1) / seg.page
	end := (off + b.size) / seg.page
	if begin >= end {
		return nil
	}
	// Unmapping does not wait for the device as cudaFree does: finish the
	// segment's stream first, as PyTorch does.
	if err := a.dev.SynchronizeStream(seg.stream); err != nil {
		return fmt.Errorf("allocator: device %d: synchronizing stream %d before unmapping: %w", a.ordinal, seg.stream, err)
	}
	ptr := seg.ptr + device.Ptr(begin*seg.page)
	n := (end - begin) * seg.page
	if err := a.vm.Unmap(ptr, n); err != nil {
		return fmt.Errorf("allocator: device %d: unmapping %d bytes at %v: %w", a.ordinal, n, ptr, err)
	}
	a.routePagesLocked(seg, ptr, n, -1)
	x.remove(b)
	if before := uint64(ptr - b.ptr); before > 0 {
		f := x.spares.get()
		f.ptr, f.size, f.stream, f.pool, f.seg = b.ptr, before, b.stream, b.pool, seg
		b.linkBefore(f)
		x.insert(f)
	}
	if after := b.size - uint64(ptr-b.ptr) - n; after > 0 {
		f := x.spares.get()
		f.ptr, f.size, f.stream, f.pool, f.seg = ptr+device.Ptr(n), after, b.stream, b.pool, seg
		b.linkAfter(f)
		x.insert(f)
	}
	b.ptr, b.size, b.unmapped = ptr, n, true
	a.pagesUnmappedLocked(seg, ptr, n)
	x.put(b)
	return nil
}

// releaseUnmappedLocked releases the address range of every expandable
// segment of p with nothing mapped (its one block is an unmapped range).
func (a *Allocator) releaseUnmappedLocked(p *pool) error {
	if p.unmapped == nil {
		return nil
	}
	list := a.collected[:0]
	p.unmapped.Ascend(func(u *block) bool {
		if !u.isSplit() {
			list = append(list, u)
		}
		return true
	})
	var errs []error
	for _, u := range list {
		if err := a.releaseExpandableLocked(u); err != nil {
			errs = append(errs, err)
		}
	}
	clear(list)
	a.collected = list[:0]
	return errors.Join(errs...)
}

// releaseExpandableLocked releases the address range of a segment with
// nothing mapped (u is its only block). On an error nothing changes and a
// later flush tries again.
func (a *Allocator) releaseExpandableLocked(u *block) error {
	seg := u.seg
	if err := a.vm.Release(seg.ptr); err != nil {
		return fmt.Errorf("allocator: device %d: releasing expandable segment %v: %w", a.ordinal, seg.ptr, err)
	}
	u.pool.unmapped.Delete(u)
	a.segmentRemovedLocked(seg)
	seg.free.spares.put(u)
	return nil
}

// routePagesLocked registers (change +1) or unregisters (-1) the n bytes
// of pages at ptr of the expandable segment seg in the routes, page by
// page, so that a page is unregistered as it was registered.
func (a *Allocator) routePagesLocked(seg *segment, ptr device.Ptr, n uint64, change int32) {
	if !a.routes.on {
		return
	}
	for off := uint64(0); off < n; off += seg.page {
		a.routes.add(ptr+device.Ptr(off), seg.page, a.shardOf(seg.free), change)
	}
}

// mappedRuns calls f on each run of mapped pages of the expandable
// segment seg, in address order: the ranges between its unmapped blocks,
// which start and end on page boundaries.
func (seg *segment) mappedRuns(f func(p device.Ptr, n uint64)) {
	pos := seg.ptr
	for b := seg.head; b != nil; b = b.next {
		if b.unmapped {
			if b.ptr > pos {
				f(pos, uint64(b.ptr-pos))
			}
			pos = b.ptr + device.Ptr(b.size)
		}
	}
	if end := seg.ptr + device.Ptr(seg.size); end > pos {
		f(pos, uint64(end-pos))
	}
}
