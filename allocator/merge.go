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
	prev, next := b.prev, b.next
	mergePrev := prev != nil && !prev.busy() && !prev.unmapped
	// The merge's change to the free blocks of split plain segments
	// (inactive_split): the neighbours it absorbs go, the merged block
	// counts if its segment stays split. Expandable blocks never count.
	var blocks, bytes int64
	plain := !b.seg.expandable()
	if pb := x.pend; pb != nil {
		if next == pb && !mergePrev {
			// b goes back into the block it was split from by the last
			// Alloc from x, whose move in the index is still pending: an
			// unsplit.
			if plain {
				blocks, bytes = -1, -int64(pb.size)
				if b.prev != nil || pb.next != nil {
					blocks, bytes = 0, int64(b.size)
				}
			}
			a.blockFreedLocked(x, b, requested, blocks, bytes)
			// The merged block is the one from before the split, filed
			// under the key pb is still filed under: the index does not
			// change.
			x.pend = nil
			pb.ptr, pb.size = b.ptr, b.size+pb.size
			pb.prev = prev
			if prev != nil {
				prev.next = pb
			} else {
				pb.seg.head = pb
			}
			if x.front == nil {
				b.requested = 0
				x.front = b // for the next split of x: b's flags and counts are zero
			} else {
				x.sh.recycleLocked(b)
			}
			if x.buckets == nil {
				pb.gcCountBase = x.pool.gcCalls // as filing it anew would
				if plain && !pb.isSplit() {
					x.list(pb) // it fills its segment again
				}
			}
			return
		}
		x.settle()
	}
	mergeNext := next != nil && !next.busy() && !next.unmapped
	if plain {
		first, last, size := b, b, b.size
		if mergePrev {
			first, size = prev, size+prev.size
			blocks, bytes = -1, -int64(prev.size)
		}
		if mergeNext {
			last, size = next, size+next.size
			blocks, bytes = blocks-1, bytes-int64(next.size)
		}
		if first.prev != nil || last.next != nil {
			blocks, bytes = blocks+1, bytes+int64(size)
		}
	}
	a.blockFreedLocked(x, b, requested, blocks, bytes)
	b.requested = 0
	a.mergeLocked(x, b)
}

// mergeLocked merges b, a free block or an unmapped range of x's pool and
// stream in no index, with its neighbours of the same kind (PyTorch's
// try_merge_blocks), and files the result in its index, which has no
// pending split. It returns the merged block.
func (a *Allocator) mergeLocked(x *freeIndex, b *block) *block {
	bk := x.buckets // set for the small pool of plain segments only: no unmapped ranges
	prev, next := b.prev, b.next
	mergePrev := prev != nil && !prev.busy() && prev.unmapped == b.unmapped
	mergeNext := next != nil && !next.busy() && next.unmapped == b.unmapped
	if bk == nil && x.large == nil && !b.unmapped && (mergePrev || mergeNext) {
		return a.mergeIntoLocked(x, b, mergePrev, mergeNext)
	}
	if mergePrev {
		unfileFree(x, prev)
		b.ptr, b.size = prev.ptr, b.size+prev.size
		b.prev = prev.prev
		if b.prev != nil {
			b.prev.next = b
		} else {
			b.seg.head = b
		}
		x.sh.recycleLocked(prev)
	}
	if mergeNext {
		unfileFree(x, next)
		b.size += next.size
		b.next = next.next
		if b.next != nil {
			b.next.prev = b
		}
		x.sh.recycleLocked(next)
	}
	if bk != nil {
		b.indexed = true
		bk.insert(b)
	} else {
		x.file(b)
	}
	return b
}

// mergeIntoLocked merges b, a free block in no index, into its free
// neighbours (one or both merge) in x, a tree (a pool of expandable
// segments), and returns the merged block: a neighbour's struct (the next
// one's if it merges), moved to its new key in place (freeTree.rekey),
// which saves a remove and an insert when it stays in its leaf.
func (a *Allocator) mergeIntoLocked(x *freeIndex, b *block, mergePrev, mergeNext bool) *block {
	prev, next := b.prev, b.next
	m := prev
	if mergeNext {
		m = next
	}
	old := keyOf(m)
	first, last, total := b, b, b.size
	if mergePrev {
		first, total = prev, total+prev.size
		if prev != m {
			x.remove(prev)
		}
	}
	if mergeNext {
		last, total = next, total+next.size
	}
	m.ptr, m.size = first.ptr, total
	m.prev, m.next = first.prev, last.next
	if m.prev != nil {
		m.prev.next = m
	} else {
		m.seg.head = m
	}
	if m.next != nil {
		m.next.prev = m
	}
	if mergePrev && prev != m {
		x.sh.recycleLocked(prev)
	}
	x.sh.recycleLocked(b)
	x.rekey(m, old)
	return m
}

// unfileFree takes b, a free block or an unmapped range, out of its index
// (x, or its pool's unmapped index).
func unfileFree(x *freeIndex, b *block) {
	if bk := x.buckets; bk != nil {
		b.indexed = false
		bk.remove(b)
	} else {
		x.unfile(b)
	}
}
