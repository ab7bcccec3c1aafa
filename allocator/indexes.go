// This file holds the allocator's work over many free indexes: settling
// them all, the count of segments, and the walks of a pool's free blocks
// on every stream that releasing the cache makes.

package allocator

import (
	"slices"

	"github.com/gpumem/gpumem/allocator/internal/freeindex"
)

// wholeSegmentsLocked appends the whole free segments of pool p on every
// stream to list, in (stream, size, address) order (the order PyTorch
// releases them in), and returns it.
func (a *Allocator) wholeSegmentsLocked(p *freeindex.Pool, list []*freeindex.Block) []*freeindex.Block {
	n := len(list)
	a.hotIndexesLocked(p, func(x *freeindex.Index) { list = x.AppendWholes(list) })
	for _, x := range p.Cold().WholeIndexes() {
		a.visited++
		list = x.AppendWholes(list)
	}
	sortFree(list[n:])
	return list
}

// pageBlocksLocked appends to list the free blocks of pool p (of
// expandable segments) that may hold a whole page, those of a page or
// more, in (stream, size, address) order, and returns it: unmapping any
// other free block would change nothing, so that releasing the cache
// costs the blocks it may unmap, not a walk of every cached block.
func (a *Allocator) pageBlocksLocked(p *freeindex.Pool, list []*freeindex.Block) []*freeindex.Block {
	page := uint64(kSmallBuffer)
	if !p.Small() {
		page = kLargeBuffer
		if a.pol != nil {
			page = a.pol.largePage
		}
	}
	n := len(list)
	add := func(b *freeindex.Block) bool {
		list = append(list, b)
		return true
	}
	a.hotIndexesLocked(p, func(x *freeindex.Index) { x.AscendAtLeast(page, add) })
	p.Cold().AscendAtLeast(page, add)
	sortFree(list[n:])
	return list
}

// sortFree sorts blocks in FreeLess order.
func sortFree(list []*freeindex.Block) {
	slices.SortFunc(list, func(x, y *freeindex.Block) int {
		if freeindex.FreeLess(x, y) {
			return -1
		}
		return 1
	})
}

// settleAllLocked settles every free index, before a walk or a change of
// more than one index, and lets go of the structs kept for the next split.
// (The cold shard's indexes never wait.)
func (a *Allocator) settleAllLocked() {
	for _, sh := range a.shards {
		if sh.cold {
			continue
		}
		for i := range sh.free {
			sh.free[i].Flush()
		}
	}
}

// segmentAddedLocked files the new segment seg: in the segments map, and
// in its free index's count.
func (a *Allocator) segmentAddedLocked(seg *freeindex.Segment) {
	a.segments[seg.Ptr()] = seg
	seg.Free().SegmentAdded()
}

// segmentRemovedLocked unfiles the segment seg, released.
func (a *Allocator) segmentRemovedLocked(seg *freeindex.Segment) {
	delete(a.segments, seg.Ptr())
	seg.Free().SegmentRemoved()
}

// hotIndexesLocked calls f on the free index of pool p of every shard of
// its own that has segments in p, in no order: p's owners (the free
// indexes that hold its segments; a named pool's freeindex pools are its
// own, so a walk of the default pool's passes its shards over) but the
// cold shard's, which the cold view covers: with it, every stream's
// cache, at a cost of the streams that hold memory in p. Its callers
// sort, sum or take the largest of what they find; lendLocked walks the
// same indexes, written out.
func (a *Allocator) hotIndexesLocked(p *freeindex.Pool, f func(*freeindex.Index)) {
	ids := *a.byID.Load()
	for _, x := range p.Owners() {
		if !ids[x.Shard()].cold {
			a.visited++
			f(x)
		}
	}
}
