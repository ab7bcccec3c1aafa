// This file holds the merge: step 4 of the free ladder, and the one merge
// of neighbouring blocks that plain and expandable segments share.

package allocator

// finishFreeLocked completes the free of b, which is no longer allocated
// and has no events outstanding: it records the free as completed
// (free_completed; with requested, the caller's free too: free_requested,
// for a free that did not wait for events), merges b with free neighbours
// and files the result in the free index (PyTorch's free_block).
func (a *Allocator) finishFreeLocked(b *block, requested bool) {
	x := b.seg.free
	a.blockFreedLocked(x, b, requested)
	b.requested = 0
	if blocks, bytes := a.mergeLocked(x, b); blocks|bytes != 0 {
		a.splitChangedLocked(x, blocks, bytes)
	}
}

// mergeLocked merges b, a free block or an unmapped range of x's pool and
// stream in no index, with its neighbours of the same kind (PyTorch's
// try_merge_blocks), and files the result, b grown, in its index. It
// returns what the merge changed in the free blocks of split plain
// segments (inactive_split): the neighbours absorbed, and the merged
// block if its segment stays split.
func (a *Allocator) mergeLocked(x *freeIndex, b *block) (splitBlocks, splitBytes int64) {
	bk := x.buckets // never set for expandable segments, whose unmapped ranges merge too
	if prev := b.prev; prev != nil && !prev.busy() && prev.unmapped == b.unmapped {
		if bk != nil {
			prev.indexed = false
			bk.remove(prev)
		} else {
			x.unfile(prev)
		}
		splitBlocks, splitBytes = -1, -int64(prev.size)
		b.ptr, b.size = prev.ptr, b.size+prev.size
		b.prev = prev.prev
		if b.prev != nil {
			b.prev.next = b
		} else {
			b.seg.head = b
		}
		a.recycleLocked(prev)
	}
	if next := b.next; next != nil && !next.busy() && next.unmapped == b.unmapped {
		if bk != nil {
			next.indexed = false
			bk.remove(next)
		} else {
			x.unfile(next)
		}
		splitBlocks, splitBytes = splitBlocks-1, splitBytes-int64(next.size)
		b.size += next.size
		b.next = next.next
		if b.next != nil {
			b.next.prev = b
		}
		a.recycleLocked(next)
	}
	if bk != nil {
		b.indexed = true
		bk.insert(b)
	} else {
		x.file(b)
	}
	if b.seg.expandable() { // expandable blocks are never "inactive split"
		return 0, 0
	}
	if b.isSplit() {
		splitBlocks, splitBytes = splitBlocks+1, splitBytes+int64(b.size)
	}
	return splitBlocks, splitBytes
}
