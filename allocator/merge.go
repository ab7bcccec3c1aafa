// This file holds the merge: step 4 of the free ladder, and the one merge
// of neighbouring blocks that plain and expandable segments share.

package allocator

// finishFreeLocked completes the free of b, which is no longer allocated
// and has no events outstanding: it merges b with free neighbours, files
// the result in the free index and records the free as completed
// (PyTorch's free_block).
func (a *Allocator) finishFreeLocked(b *block) {
	p, ptr, size, requested, s, phase := b.pool, b.ptr, b.size, b.requested, b.stream, b.phase
	b.requested, b.phase = 0, 0
	m, absorbed, absorbedBytes := a.mergeLocked(b)
	if !m.seg.expandable() { // expandable blocks are never "inactive split"
		blocks, bytes := -absorbed, -absorbedBytes
		if m.isSplit() {
			blocks++
			bytes += int64(m.size)
		}
		a.inactiveSplitLocked(p, blocks, bytes)
	}
	a.freeCompletedLocked(p, ptr, size, requested, s, phase)
}

// mergeLocked merges b, a free block or an unmapped range in no index,
// with its neighbours of the same kind (PyTorch's try_merge_blocks), and
// files the result in its index. It returns the merged block and how many
// neighbours, of how many bytes, it absorbed.
//
// The merged block is a neighbour's struct when one merges, so that a
// neighbour already filed can keep its place in the index when its key
// still fits there (pool.keepsPlace), which saves a delete and an insert.
func (a *Allocator) mergeLocked(b *block) (merged *block, absorbed, absorbedBytes int64) {
	p := b.pool
	prev, next := b.prev, b.next
	mergePrev, mergeNext := b.mergesWith(prev), b.mergesWith(next)
	if !mergePrev && !mergeNext {
		p.file(b)
		return b, 0, 0
	}
	first, last, survivor, total := b, b, next, b.size
	if mergePrev {
		first, survivor = prev, prev
		absorbed, absorbedBytes, total = 1, int64(prev.size), total+prev.size
	}
	if mergeNext {
		last = next
		absorbed, absorbedBytes, total = absorbed+1, absorbedBytes+int64(next.size), total+next.size
		if survivor != next {
			p.unfile(next)
		}
	}
	inPlace := p.keepsPlace(survivor)
	if !inPlace {
		p.unfile(survivor)
	}
	survivor.size = total
	survivor.ptr = first.ptr
	survivor.prev, survivor.next = first.prev, last.next
	if survivor.prev != nil {
		survivor.prev.next = survivor
	} else {
		survivor.seg.head = survivor
	}
	if survivor.next != nil {
		survivor.next.prev = survivor
	}
	a.recycleLocked(b)
	if mergeNext && survivor != next {
		a.recycleLocked(next)
	}
	if inPlace {
		if !survivor.unmapped {
			survivor.gcCountBase = p.gcCalls // as filing it anew would
			p.relist(survivor)               // it may fill its segment now
		}
	} else {
		p.file(survivor)
	}
	return survivor, absorbed, absorbedBytes
}
