// This file holds the rule of expandable segments of step 4 of the
// allocation ladder (the best fit itself is the free index's bestFit,
// asked by Allocator.fitLocked), and step 7: handing out the block found,
// which the free index splits (freeIndex.take).

package allocator

// Best fit (step 4): Alloc asks the free index of the request's pool and
// stream for the block of the lowest (size, address) with at least the
// rounded size (freeIndex.bestFit): size buckets answer with bit scans,
// and remember the answer until they change; large buckets too, the tree
// with a lower bound; then the rule of expandable segments applies
// (expandableBestFit). fitLocked then checks that the block may serve the
// request (splitRule.mayServe: oversize blocks). The block stays in the
// free index: takeLocked takes it out. While garbage collection is
// active, each search of an index that keeps ages (every kind but size
// buckets: the large pool, and pools of expandable segments) counts in
// the pool's clock of block ages (gcCalls); garbage collection reads only
// the large pool's ages. Under the low_fragmentation policy every search
// counts (policyFitLocked), in both pools, whose ages its reclaim and
// lending read.

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
// rounded bytes, requested as asked: the index splits off the rest of the
// block when that is worth keeping (the front is handed out, the rest
// stays free), and the block handed out is marked allocated, filed in its
// shard's address table and recorded in the ledger. It returns that
// block.
//
// b is either in the free index (found by fitLocked, or mapped into an
// expandable segment) or a new segment's block, in no index yet.
func (a *Allocator) takeLocked(x *freeIndex, b *block, size, requested uint64) *block {
	wasSplit := b.isSplit()
	split := a.rule.shouldSplit(x.k == qSmall, b.size, size)
	f := x.take(b, size, split) // with split, b is the rest
	// The change to the free blocks of split plain segments
	// (inactive_split). Expandable blocks never count.
	var splitBlocks, splitBytes int64
	switch {
	case b.seg.expandable():
	case split && wasSplit:
		splitBytes = -int64(size)
	case split:
		splitBlocks, splitBytes = 1, int64(b.size)
	case wasSplit:
		splitBlocks, splitBytes = -1, -int64(b.size)
	}
	f.allocated, f.requested, f.phase = true, requested, a.phase
	x.sh.live.put(f)
	a.blockAllocatedLocked(x, f, splitBlocks, splitBytes)
	return f
}
