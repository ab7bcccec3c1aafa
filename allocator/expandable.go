// This file holds expandable segments: address ranges reserved once per
// stream and pool and backed by memory page by page (PyTorch's
// expandable_segments:True).

package allocator

import (
	"errors"
	"fmt"

	"github.com/gpumem/gpumem/allocator/internal/freeindex"
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
func (a *Allocator) growExpandableLocked(x *freeindex.Index, size uint64) (*freeindex.Block, error) {
	c, reserved, err := a.findExpandableLocked(x, size)
	if err != nil {
		return nil, err
	}
	if c.Unmapped() {
		m, err := a.mapLocked(c, min(c.Size(), size))
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
	for c.Size() < size {
		// c is free and followed by an unmapped range: map the rest there;
		// the mapped pages merge with c.
		if c, err = a.mapLocked(c.Next(), min(size-c.Size(), c.Next().Size())); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// findExpandableLocked returns the lowest-addressed block of x's pool and
// stream from which size bytes of free and unmapped space follow, reserving a
// new segment when no segment has room (reserved is then true and the
// block is the new segment's one unmapped range).
func (a *Allocator) findExpandableLocked(x *freeindex.Index, size uint64) (found *freeindex.Block, reserved bool, err error) {
	p, s := x.Pool(), x.Stream()
	p.AscendUnmapped(s, func(u *freeindex.Block) bool {
		c := u
		if u.Prev() != nil && !u.Prev().Busy() {
			c = u.Prev()
		}
		var room uint64
		for b := c; b != nil && room < size && !b.Busy(); b = b.Next() {
			room += b.Size()
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
	if p.Small() {
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
	b := x.NewSegment(ptr, n, page)
	a.segmentAddedLocked(b.Seg())
	return b, true, nil
}

// mapLocked backs the first size bytes of the unmapped block u with
// memory, rounded up to whole pages, and makes them a free block merged
// with free neighbours, which it returns; the rest of u stays unmapped.
// On an error nothing changes.
func (a *Allocator) mapLocked(u *freeindex.Block, size uint64) (*freeindex.Block, error) {
	seg := u.Seg()
	begin := uint64(u.Ptr()-seg.Ptr()) / seg.Page()
	end := (uint64(u.Ptr()-seg.Ptr()) + size + seg.Page() - 1) / seg.Page()
	n := (end - begin) * seg.Page()
	if err := a.vm.Map(u.Ptr(), n); err != nil {
		if refused(err) {
			return nil, err
		}
		return nil, fmt.Errorf("allocator: device %d: mapping %d bytes at %v: %w", a.ordinal, n, u.Ptr(), err)
	}
	a.routePagesLocked(seg, u.Ptr(), n, +1)
	m := seg.Free().MapPages(u, 0, n)
	a.pagesMappedLocked(seg, m.Ptr(), n)
	return seg.Free().Put(m), nil
}

// unmapLocked returns to the device the whole pages inside the free
// expandable block b. The pages become an unmapped range (merged with
// unmapped neighbours); the free bytes before and after them stay free
// blocks. On an error nothing changes.
func (a *Allocator) unmapLocked(b *freeindex.Block) error {
	seg, x := b.Seg(), b.Seg().Free()
	off := uint64(b.Ptr() - seg.Ptr())
	begin := (off + seg.Page() - 1) / seg.Page()
	end := (off + b.Size()) / seg.Page()
	if begin >= end {
		return nil
	}
	// Unmapping does not wait for the device as cudaFree does: finish the
	// segment's stream first, as PyTorch does.
	if err := a.dev.SynchronizeStream(seg.Stream()); err != nil {
		return fmt.Errorf("allocator: device %d: synchronizing stream %d before unmapping: %w", a.ordinal, seg.Stream(), err)
	}
	ptr := seg.Ptr() + device.Ptr(begin*seg.Page())
	n := (end - begin) * seg.Page()
	if err := a.vm.Unmap(ptr, n); err != nil {
		return fmt.Errorf("allocator: device %d: unmapping %d bytes at %v: %w", a.ordinal, n, ptr, err)
	}
	a.routePagesLocked(seg, ptr, n, -1)
	u := x.UnmapPages(b, ptr, n)
	a.pagesUnmappedLocked(seg, ptr, n)
	x.Put(u)
	return nil
}

// releaseUnmappedLocked releases the address range of every expandable
// segment of p with nothing mapped (its one block is an unmapped range).
func (a *Allocator) releaseUnmappedLocked(p *freeindex.Pool) error {
	list := a.collected[:0]
	p.EachUnmapped(func(u *freeindex.Block) bool {
		if !u.IsSplit() {
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
func (a *Allocator) releaseExpandableLocked(u *freeindex.Block) error {
	seg := u.Seg()
	if err := a.vm.Release(seg.Ptr()); err != nil {
		return fmt.Errorf("allocator: device %d: releasing expandable segment %v: %w", a.ordinal, seg.Ptr(), err)
	}
	seg.Free().ForgetSegment(u)
	a.segmentRemovedLocked(seg)
	return nil
}

// routePagesLocked registers (change +1) or unregisters (-1) the n bytes
// of pages at ptr of the expandable segment seg in the routes, in one
// range (routes coalesce the pages of one shard that touch, so pages
// mapped apart may be unmapped together, and the other way round).
func (a *Allocator) routePagesLocked(seg *freeindex.Segment, ptr device.Ptr, n uint64, change int32) {
	if !a.routes.on {
		return
	}
	a.routes.add(ptr, n, a.shardOf(seg.Free()), change)
}
