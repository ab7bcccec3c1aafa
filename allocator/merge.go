// This file holds step 4 of the free ladder: the completion of a free,
// counted in the ledger, then merged and filed by the free index
// (freeIndex.put, the one merge of neighbouring blocks that plain and
// expandable segments share).

package allocator

// finishFreeLocked completes the free of b, which is no longer allocated
// and has no events outstanding: it records the free as completed
// (free_completed; with requested, the caller's free too: free_requested,
// for a free that did not wait for events), then the free index merges b
// with free neighbours and files the result (PyTorch's free_block).
func (a *Allocator) finishFreeLocked(b *block, requested bool) {
	x := b.seg.free
	// The merge's change to the free blocks of split plain segments
	// (inactive_split): the neighbours it absorbs go, the merged block
	// counts if its segment stays split. Expandable blocks never count.
	// (An unsplit is such a merge too: its rest goes, and the block from
	// before the split counts if its segment stays split.)
	var blocks, bytes int64
	if !b.seg.expandable() {
		prev, next := b.prev, b.next
		first, last, size := b, b, b.size
		if prev != nil && prev.isFree() {
			first, size = prev, size+prev.size
			blocks, bytes = -1, -int64(prev.size)
		}
		if next != nil && next.isFree() {
			last, size = next, size+next.size
			blocks, bytes = blocks-1, bytes-int64(next.size)
		}
		if first.prev != nil || last.next != nil {
			blocks, bytes = blocks+1, bytes+int64(size)
		}
	}
	a.blockFreedLocked(x, b, requested, blocks, bytes)
	b.requested = 0
	x.put(b)
}
