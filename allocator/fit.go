// This file holds step 7 of the allocation ladder: handing out the block
// found, which the free index splits (freeIndex.take). The best fit of
// step 4 is the free index's (freeIndex.bestFit, with the rule of
// expandable segments, expandableBestFit), asked by Allocator.fitLocked.

package allocator

// Best fit (step 4): Alloc asks the free index of the request's pool and
// stream for the block of the lowest (size, address) with at least the
// rounded size (freeIndex.bestFit): size buckets answer with bit scans,
// and remember the answer until they change; large buckets too, the tree
// with a lower bound; then the rule of expandable segments applies
// (expandableBestFit). searchLocked then checks that the block may serve
// the request (splitRule.mayServe: oversize blocks). The block stays in the
// free index: takeLocked takes it out. While garbage collection is
// active, each search of an index that keeps ages (every kind but size
// buckets: the large pool, and pools of expandable segments) counts in
// the pool's clock of block ages (gcCalls); garbage collection reads only
// the large pool's ages. Under the low_fragmentation policy every search
// counts (policyFitLocked), in both pools, whose ages its reclaim and
// lending read.

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
