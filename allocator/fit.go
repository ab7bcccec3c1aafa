// This file holds steps 4 and 7 of the allocation ladder: the best-fit
// search of a stream's free blocks in a pool, and the split that hands out
// the front of the block found.

package allocator

import "github.com/gpumem/gpumem/device"

// Best fit (step 4): Alloc asks the free index of the request's pool and
// stream for the block of the lowest (size, address) with at least the
// rounded size: size buckets answer with bit scans (sizeBuckets.bestFit,
// largeBuckets.fit), the tree with a lower bound; largeFitLocked then
// applies the rule of expandable segments. Alloc then checks that
// the block may serve the request (splitRule.mayServe: oversize blocks).
// The block stays in the free index: takeLocked takes it out. While
// garbage collection is active, each search of the large pool (or of a
// pool of expandable segments) counts in the pool's clock of block ages
// (gcCalls); garbage collection reads only the large pool's ages. Under
// the low_fragmentation policy every search counts (policyFitLocked),
// in both pools, whose ages its reclaim and lending read.

// largeFitLocked returns the best-fitting free block of x, an index of
// the large pool or of expandable segments, for a request of size
// (rounded) bytes, or nil.
func (a *Allocator) largeFitLocked(x *freeIndex, size uint64) *block {
	if a.aging {
		x.pool.gcCalls++
	}
	var b *block
	if x.large != nil && size <= maxLargeSize {
		b = x.large.fit(size)
	}
	if b == nil {
		b = x.tree.lowerBound(size) // every block of the tree is larger
	}
	if b != nil && b.seg.expandable() {
		b = expandableBestFit(x, b)
	}
	return b
}

// expandableBestFit applies PyTorch's rule for an expandable block b found
// by the best-fit search (the lowest address of its size): among the
// following blocks of the same stream, prefer one whose size plus the
// unmapped range after it is smaller, that is, one that could not grow as
// much.
func expandableBestFit(x *freeIndex, b *block) *block {
	if expandableSize(b) == b.size {
		// b cannot grow, and no later block is smaller: the walk would
		// stop at the first.
		return b
	}
	cur := b
	x.ascendFrom(b, func(n *block) bool {
		if n == b {
			return true
		}
		if !cur.seg.expandable() || expandableSize(n) >= expandableSize(cur) {
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

// takeLocked hands out the free block b of x for a request of size
// rounded bytes, requested as asked: it splits off the rest of the block
// when that is worth keeping (the front is handed out, the rest stays
// free), marks the block allocated and records it in the ledger. It
// returns the block handed out.
//
// b is either in the free index (found by bestFitLocked, or mapped into an
// expandable segment) or a new segment's block, in no index yet.
func (a *Allocator) takeLocked(x *freeIndex, b *block, size, requested uint64) *block {
	wasSplit := b.isSplit()
	split := a.rule.shouldSplit(x.k == qSmall, b.size, size)
	if b.indexed && !split {
		if bk := x.buckets; bk != nil {
			b.indexed = false
			bk.remove(b)
		} else {
			x.remove(b)
		}
	}
	var splitBlocks, splitBytes int64
	if split {
		// The front of b is handed out as a new block; b keeps the rest
		// and stays in the index (or goes in) under its new, smaller key.
		rest, old := b, keyOf(b)
		if b = x.front; b != nil {
			x.front = nil // zero but for the fields set here
		} else {
			b = x.sh.newBlockLocked() // zeroed
		}
		b.ptr, b.size, b.stream, b.pool, b.seg = rest.ptr, size, rest.stream, rest.pool, rest.seg
		rest.linkBefore(b)
		rest.ptr += device.Ptr(size)
		rest.size -= size
		if rest.indexed {
			// Its move to the new key waits (freeIndex.pend); it is
			// stamped and unlisted now, as filing it anew would.
			if x.buckets == nil {
				rest.gcCountBase = x.pool.gcCalls
				if rest.listed {
					x.unlist(rest)
				}
			}
			x.pend, x.pendKey = rest, old
		} else {
			x.insert(rest)
		}
		switch {
		case b.seg.expandable(): // expandable blocks are never "inactive split"
		case wasSplit:
			splitBytes = -int64(size)
		default:
			splitBlocks, splitBytes = 1, int64(rest.size)
		}
	} else if wasSplit && !b.seg.expandable() {
		splitBlocks, splitBytes = -1, -int64(b.size)
	}
	b.allocated, b.requested, b.phase = true, requested, a.phase
	x.sh.live.put(b)
	a.blockAllocatedLocked(x, b, splitBlocks, splitBytes)
	return b
}
