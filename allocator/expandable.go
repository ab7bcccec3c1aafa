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
//     pool and 20 MiB in the large pool.
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
//     the device) and releases a segment that becomes wholly unmapped.
//   - Every split keeps a remainder of 512 bytes or more, and expandable
//     blocks never count as inactive split.

// expandableBestFitLocked applies PyTorch's rule for an expandable block b
// found by the best-fit search: among the following blocks of the same
// stream, prefer one whose size plus the unmapped range after it is
// smaller, that is, one that could not grow as much.
func (a *Allocator) expandableBestFitLocked(p *pool, b *block) *block {
	cur := b
	p.free.AscendGreaterOrEqual(b, func(n *block) bool {
		if n == b {
			return true
		}
		if !cur.seg.expandable() || n.stream != b.stream || expandableSize(n) >= expandableSize(cur) {
			return false
		}
		cur = n
		return true
	})
	return cur
}

// expandableSize is what a free block could grow to by mapping the
// unmapped range after it.
func expandableSize(b *block) uint64 {
	if b.next != nil && b.next.unmapped {
		return b.size + b.next.size
	}
	return b.size
}

// allocExpandableLocked maps memory for a request of size bytes on stream
// s and returns a free block of at least size bytes, in the free index. A
// refusal for lack of memory returns a nil block with the device's error
// in devErr (pages mapped before the refusal stay mapped, as free cached
// memory, as in PyTorch); other device errors are returned as err.
func (a *Allocator) allocExpandableLocked(p *pool, size uint64, s device.Stream) (b *block, devErr, err error) {
	c, devErr, err := a.findExpandableLocked(p, size, s)
	if c == nil {
		return nil, devErr, err
	}
	if c.unmapped {
		if devErr, err = a.mapBlockLocked(c, min(c.size, size)); devErr != nil || err != nil {
			return nil, devErr, err
		}
	}
	for c.size < size {
		// c is free and followed by an unmapped range: map the rest there;
		// the mapped block absorbs c.
		n := c.next
		if devErr, err = a.mapBlockLocked(n, min(size-c.size, n.size)); devErr != nil || err != nil {
			return nil, devErr, err
		}
		c = n
	}
	return c, nil, nil
}

// findExpandableLocked returns the lowest-addressed block of stream s in
// p from which size bytes of free and unmapped space follow, reserving a
// new segment when no segment has room.
func (a *Allocator) findExpandableLocked(p *pool, size uint64, s device.Stream) (*block, error, error) {
	var found *block
	a.key.stream, a.key.size, a.key.ptr = s, 0, 0
	p.unmapped.AscendGreaterOrEqual(&a.key, func(u *block) bool {
		if u.stream != s {
			return false
		}
		c := u
		if u.prev.available() {
			c = u.prev
		}
		var room uint64
		for b := c; room < size && b.available(); b = b.next {
			room += b.size
		}
		if room >= size {
			found = c
			return false
		}
		return true
	})
	if found != nil {
		return found, nil, nil
	}
	page := uint64(kLargeBuffer)
	if p.small {
		page = kSmallBuffer
	}
	reserve := (a.total + a.total/8 + page - 1) / page * page
	ptr, err := a.vm.Reserve(reserve)
	if err != nil {
		if errors.Is(err, device.ErrOutOfMemory) {
			return nil, err, nil
		}
		return nil, nil, fmt.Errorf("allocator: device %d: reserving an expandable segment of %d bytes: %w", a.ordinal, reserve, err)
	}
	seg := &segment{ptr: ptr, size: reserve, stream: s, pool: p, page: page}
	b := a.newBlock()
	b.ptr, b.size, b.stream, b.pool, b.seg, b.unmapped = ptr, reserve, s, p, seg, true
	seg.head = b
	a.segments[ptr] = seg
	p.unmapped.ReplaceOrInsert(b)
	return b, nil, nil
}

// mapBlockLocked backs the first size bytes of the unmapped block u with
// memory, rounded up to whole pages, and makes them a free block merged
// with free neighbours; the rest of u stays unmapped. u itself becomes the
// free block.
func (a *Allocator) mapBlockLocked(u *block, size uint64) (devErr, err error) {
	seg, p := u.seg, u.pool
	begin := uint64(u.ptr-seg.ptr) / seg.page
	end := (uint64(u.ptr-seg.ptr) + size + seg.page - 1) / seg.page
	n := (end - begin) * seg.page
	if mapErr := a.vm.Map(u.ptr, n); mapErr != nil {
		if errors.Is(mapErr, device.ErrOutOfMemory) {
			return mapErr, nil
		}
		return nil, fmt.Errorf("allocator: device %d: mapping %d bytes at %v: %w", a.ordinal, n, u.ptr, mapErr)
	}
	p.unmapped.Delete(u)
	u.unmapped = false
	if n < u.size {
		rest := a.newBlock()
		rest.ptr, rest.size, rest.stream, rest.pool, rest.seg, rest.unmapped = u.ptr+device.Ptr(n), u.size-n, u.stream, p, seg, true
		a.linkAfter(u, rest)
		p.unmapped.ReplaceOrInsert(rest)
		u.size = n
	}
	a.absorbLocked(u, u.prev)
	a.absorbLocked(u, u.next)
	p.insert(u)
	a.reserved += n
	a.st.ReservedBytes.Increase(p.stat, int64(n))
	a.st.NumDeviceAlloc++
	if len(a.observers) > 0 {
		a.notifyLocked(Action{Kind: ActionSegmentMap, Ptr: device.Ptr(uint64(seg.ptr) + begin*seg.page), Size: n, Stream: seg.stream})
	}
	return nil, nil
}

// unmapBlockLocked returns to the device the whole pages inside the free
// expandable block b. The pages become an unmapped block (merged with
// unmapped neighbours); the free bytes before and after them stay free
// blocks. b becomes the unmapped block.
func (a *Allocator) unmapBlockLocked(b *block) error {
	seg, p := b.seg, b.pool
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
	p.remove(b)
	if before := uint64(ptr - b.ptr); before > 0 {
		f := a.newBlock()
		f.ptr, f.size, f.stream, f.pool, f.seg = b.ptr, before, b.stream, p, seg
		a.linkBefore(b, f)
		p.insert(f)
	}
	if after := b.size - uint64(ptr-b.ptr) - n; after > 0 {
		f := a.newBlock()
		f.ptr, f.size, f.stream, f.pool, f.seg = ptr+device.Ptr(n), after, b.stream, p, seg
		a.linkAfter(b, f)
		p.insert(f)
	}
	b.ptr, b.size, b.unmapped = ptr, n, true
	a.absorbLocked(b, b.prev)
	a.absorbLocked(b, b.next)
	p.unmapped.ReplaceOrInsert(b)
	a.reserved -= n
	a.st.ReservedBytes.Decrease(p.stat, int64(n))
	a.st.NumDeviceFree++
	if len(a.observers) > 0 {
		a.notifyLocked(Action{Kind: ActionSegmentUnmap, Ptr: ptr, Size: n, Stream: seg.stream})
	}
	return nil
}

// releaseExpandableLocked releases the address range of a segment that is
// wholly unmapped (b is its only block).
func (a *Allocator) releaseExpandableLocked(b *block) error {
	seg := b.seg
	if err := a.vm.Release(seg.ptr); err != nil {
		return fmt.Errorf("allocator: device %d: releasing expandable segment %v: %w", a.ordinal, seg.ptr, err)
	}
	b.pool.unmapped.Delete(b)
	delete(a.segments, seg.ptr)
	a.recycle(b)
	return nil
}

// absorbLocked merges src into dst, its neighbour, when both are free
// mapped blocks or both unmapped ranges (PyTorch's try_merge_blocks); dst
// must be out of its index, src leaves its own.
func (a *Allocator) absorbLocked(dst, src *block) {
	if !src.available() || src.unmapped != dst.unmapped {
		return
	}
	if src.unmapped {
		src.pool.unmapped.Delete(src)
	} else {
		src.pool.remove(src)
	}
	if dst.prev == src {
		dst.ptr = src.ptr
		dst.prev = src.prev
		if dst.prev != nil {
			dst.prev.next = dst
		} else {
			dst.seg.head = dst
		}
	} else {
		dst.next = src.next
		if dst.next != nil {
			dst.next.prev = dst
		}
	}
	dst.size += src.size
	a.recycle(src)
}

// linkAfter puts n right after b in b's segment.
func (a *Allocator) linkAfter(b, n *block) {
	n.prev, n.next = b, b.next
	if b.next != nil {
		b.next.prev = n
	}
	b.next = n
}

// linkBefore puts n right before b in b's segment.
func (a *Allocator) linkBefore(b, n *block) {
	n.prev, n.next = b.prev, b
	if b.prev != nil {
		b.prev.next = n
	} else {
		b.seg.head = n
	}
	b.prev = n
}
