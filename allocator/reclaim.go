// This file holds steps 5 and 6 of the allocation ladder: obtaining memory
// from the device after a cache miss, and reclaiming cached memory when
// the device refuses (releasing oversize blocks, then the whole cache, and
// garbage collection), up to the out-of-memory error; and EmptyCache,
// which releases the whole cache on the caller's request.

package allocator

import (
	"errors"
	"fmt"

	"github.com/gpumem/gpumem/allocator/internal/freeindex"
	"github.com/gpumem/gpumem/device"
)

// errOverCap is a refusal by the allocator's own cap (memory fraction or
// limit), which PyTorch treats as the device refusing.
var errOverCap = fmt.Errorf("allocator: over the configured memory cap: %w", device.ErrOutOfMemory)

// refused reports whether err is a refusal for lack of memory (by the
// device or by the cap), which the ladder answers by reclaiming and
// retrying; other errors end the allocation.
func refused(err error) bool { return err != nil && errors.Is(err, device.ErrOutOfMemory) }

// allocSlowLocked runs the ladder after a cache miss for a request of size
// (rounded) bytes, requested as asked: garbage collection, a device
// allocation, then releasing cached oversize blocks and retrying, then
// releasing the whole cache and retrying; for a request of the default
// pool, last, a free block of a pool made with UseOnOOM (pools.go). It
// returns a free block of at least size bytes and the free index it is in
// (x, or a pool's), or an *OutOfMemoryError, or another device error.
func (a *Allocator) allocSlowLocked(x *freeindex.Index, size, requested uint64) (*freeindex.Index, *freeindex.Block, error) {
	a.settleAllLocked()         // the ladder below walks and changes every index
	capturing := a.captures > 0 // no device free, no event wait: the ladder only grows
	if a.gcActive && !capturing {
		a.garbageCollectLocked()
	}
	segSize := a.rule.segmentSize(size)
	if a.refusesEarlyLocked(segSize) {
		return a.lastResortLocked(x, size, requested, segSize, nil)
	}
	b, err := a.growLocked(x, size, segSize)
	if refused(err) && !capturing && a.releaseOversizeLocked(x, size) {
		b, err = a.growLocked(x, size, segSize)
	}
	if refused(err) && !capturing {
		_ = a.releaseCachedLocked() // a failed release leaves those blocks cached; the retry decides
		a.retriedLocked()
		b, err = a.growLocked(x, size, segSize)
	}
	if refused(err) {
		if err == errOverCap {
			err = nil // the cap refused without asking the device
		}
		return a.lastResortLocked(x, size, requested, segSize, err)
	}
	return x, b, err
}

// lastResortLocked ends a request the device could not serve: a free block
// of a pool made with UseOnOOM, for a request of the default pool, else
// the out-of-memory error (with the device's error, devErr, if any).
func (a *Allocator) lastResortLocked(x *freeindex.Index, size, requested, segSize uint64, devErr error) (*freeindex.Index, *freeindex.Block, error) {
	if len(a.pools) > 0 && a.shardOf(x).pool == nil {
		if y, b := a.oomPoolFitLocked(x.Stream(), size); b != nil {
			return y, b, nil
		}
	}
	return x, nil, a.outOfMemoryLocked(requested, segSize, x.Stream(), devErr)
}

// growLocked obtains memory for a request of size (rounded) bytes in x
// (a pool on one stream): a new segment of segSize bytes, or with expandable segments
// pages mapped into one. The block returned is free: a new segment's in
// no index, a mapped one in the free index. A refusal for lack of memory
// (by the device, or by the cap, which counts segSize bytes either way, as
// PyTorch does) wraps device.ErrOutOfMemory.
func (a *Allocator) growLocked(x *freeindex.Index, size, segSize uint64) (*freeindex.Block, error) {
	if a.pol != nil && a.vm != nil {
		return a.policyGrowLocked(x, size, true) // policy: placement and reclaim
	}
	if a.allowed > 0 && a.reservedLocked()+segSize > a.allowed {
		return nil, errOverCap
	}
	if a.vm != nil {
		return a.growExpandableLocked(x, size)
	}
	return a.newSegmentLocked(x, segSize)
}

// newSegmentLocked asks the device for a segment of size bytes and returns
// its one block, free and in no index.
func (a *Allocator) newSegmentLocked(x *freeindex.Index, size uint64) (*freeindex.Block, error) {
	ptr, mapped, err := a.segmentMemoryLocked(x, size)
	if err != nil {
		if refused(err) {
			return nil, err
		}
		return nil, fmt.Errorf("allocator: device %d: allocating a %d-byte segment: %w", a.ordinal, size, err)
	}
	b := x.NewSegment(ptr, size, 0)
	seg := b.Seg()
	if mapped {
		a.mappedSegs[seg] = true
	}
	a.segmentAddedLocked(seg)
	a.routes.add(ptr, size, a.shardOf(x), +1)
	a.segmentAllocatedLocked(seg)
	return b, nil
}

// releaseSegmentLocked returns the segment of the free, unsplit block b to
// the device. On a device error nothing changes.
func (a *Allocator) releaseSegmentLocked(b *freeindex.Block) error {
	seg := b.Seg()
	if a.mappedSegs[seg] {
		if err := a.unmapSegmentLocked(seg); err != nil {
			return err
		}
	} else if err := a.dev.Free(seg.Ptr()); err != nil {
		return fmt.Errorf("allocator: device %d: releasing segment %v: %w", a.ordinal, seg.Ptr(), err)
	}
	seg.Free().ForgetSegment(b)
	a.segmentRemovedLocked(seg)
	a.routes.add(seg.Ptr(), seg.Size(), a.shardOf(seg.Free()), -1)
	a.segmentFreedLocked(seg)
	return nil
}

// releaseCachedLocked waits for every outstanding stream event, then
// releases every cached segment of both pools that is wholly free, and
// with expandable segments unmaps the whole pages of free blocks
// (PyTorch's release_cached_blocks).
func (a *Allocator) releaseCachedLocked() error {
	err := a.drainEventsLocked()
	err2 := a.releasePoolLocked(a.large)
	err3 := a.releasePoolLocked(a.small)
	var err4 error
	if a.releasing > 0 {
		err4 = a.dropReleasedLocked() // released pools' cached memory too, as PyTorch's freeable pools
	}
	return errors.Join(err, err2, err3, err4)
}

// releasePoolLocked releases every free block of p that fills its plain
// segment, and unmaps the whole pages inside every free block of an
// expandable segment, releasing the segment's address range once nothing
// of it is mapped (PyTorch's release_blocks).
func (a *Allocator) releasePoolLocked(p *freeindex.Pool) error {
	plain := a.wholeSegmentsLocked(p, a.collected[:0])
	var mapped []*freeindex.Block
	if p.Expandable() { // expandable segments: every free block is in one
		mapped = a.pageBlocksLocked(p, nil)
	}
	a.examined += len(plain) + len(mapped)
	var errs []error
	for _, b := range plain {
		if err := a.releaseSegmentLocked(b); err != nil {
			errs = append(errs, err)
		}
	}
	clear(plain)
	a.collected = plain[:0]
	for _, b := range mapped {
		if err := a.unmapLocked(b); err != nil {
			errs = append(errs, err)
		}
	}
	if err := a.releaseUnmappedLocked(p); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// releaseOversizeLocked frees cached oversize blocks of x (a pool on one
// stream) to make room for a request of size bytes (PyTorch's
// release_available_cached_blocks): the smallest single block of at least
// max(size, max_split_size) if there is one, else oversize blocks from the
// largest down until that many bytes are released. It does nothing without
// max_split_size, and reports whether it released enough.
func (a *Allocator) releaseOversizeLocked(x *freeindex.Index, size uint64) bool {
	if a.rule.maxSplit == maxSplitNone {
		return false
	}
	want := max(size, a.rule.maxSplit)
	b := x.Fit(want)
	if b != nil && !b.Seg().Expandable() {
		return a.releaseSegmentLocked(b) == nil
	}
	// No single block is large enough: release oversize blocks from the
	// largest down (expandable ones are passed over, not released).
	list := a.collected[:0]
	var total uint64
	x.DescendBelow(want, func(c *freeindex.Block) bool {
		if total >= want || c.Size() < a.rule.maxSplit {
			return false
		}
		if !c.Seg().Expandable() {
			list = append(list, c)
			total += c.Size()
		}
		return true
	})
	var released uint64
	for _, c := range list {
		n := c.Size()
		if a.releaseSegmentLocked(c) == nil {
			released += n
		}
	}
	clear(list)
	a.collected = list[:0]
	return released >= want
}

// garbageCollectLocked releases cached large blocks that have gone unused
// longest when reserved memory passes the threshold (PyTorch's
// garbage_collect_cached_blocks). Each pass releases every unsplit block at
// least as old as the average, until enough is reclaimed.
func (a *Allocator) garbageCollectLocked() {
	threshold := uint64(a.cfg.GarbageCollectionThreshold * float64(a.allowed))
	reserved := a.reservedLocked()
	if reserved <= threshold {
		return
	}
	target := reserved - threshold
	p := a.large
	var totalAge int64
	count := 0
	ages := func(x *freeindex.Index) {
		x.EachWhole(func(b *freeindex.Block) {
			totalAge += p.GCCalls - b.GCCountBase()
			count++
		})
	}
	a.hotIndexesLocked(p, ages)
	for _, x := range p.Cold().WholeIndexes() {
		a.visited++
		ages(x)
	}
	if count == 0 {
		return
	}
	var reclaimed uint64
	freed := true
	for reclaimed < target && freed && count > 0 {
		ageThreshold := float64(totalAge) / float64(count)
		freed = false
		list := a.wholeSegmentsLocked(p, a.collected[:0])
		for _, b := range list {
			if float64(p.GCCalls-b.GCCountBase()) < ageThreshold {
				continue
			}
			age, n := p.GCCalls-b.GCCountBase(), b.Size()
			if a.releaseSegmentLocked(b) != nil {
				continue
			}
			freed = true
			reclaimed += n
			totalAge -= age
			count--
		}
		clear(list)
		a.collected = list[:0]
	}
}

// largestFreeLocked returns the size of the largest cached free block:
// it visits the shards of their own that hold memory and the cold view,
// every index settled.
func (a *Allocator) largestFreeLocked() uint64 {
	var largest uint64
	for _, p := range [2]*freeindex.Pool{a.small, a.large} {
		a.hotIndexesLocked(p, func(x *freeindex.Index) {
			if b := x.Largest(); b != nil {
				largest = max(largest, b.Size())
			}
		})
		if b := p.Cold().Largest(); b != nil {
			largest = max(largest, b.Size())
		}
	}
	return largest
}

// EmptyCache waits for outstanding stream events, then returns every cached
// segment that is wholly free to the device (PyTorch's emptyCache); with
// expandable segments it unmaps the whole pages of free blocks and releases
// segments with nothing mapped. Segments holding any allocated or pending
// block stay. An error from the device leaves the blocks it concerns
// cached; the others are released.
func (a *Allocator) EmptyCache() error {
	if !a.made() {
		return errNotMade
	}
	a.lockAll()
	defer a.unlockAll()
	if a.captures > 0 {
		return errCapturing
	}
	a.cacheEmptiedLocked()
	a.settleAllLocked()
	err := errors.Join(a.releaseCachedLocked(), a.freeStrayHostLocked(), a.releaseStrayLocked())
	if selfCheck {
		a.selfCheckLocked("EmptyCache")
	}
	return err
}
