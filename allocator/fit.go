// This file holds steps 4 and 7 of the allocation ladder: the best-fit
// search of a pool's free blocks, and the split that hands out the front
// of the block found.

package allocator

import "github.com/gpumem/gpumem/device"

// bestFitLocked finds the best-fitting free block of p on stream s for a
// request of size (rounded) bytes; nil if none may serve it. The block
// stays in the free index: takeLocked takes it out or shrinks it in place.
func (a *Allocator) bestFitLocked(p *pool, size uint64, s device.Stream) *block {
	if a.gcActive || a.pol != nil { // policy: block ages for reclaim
		p.gcCalls++
	}
	a.key.stream, a.key.size, a.key.ptr = s, size, 0
	var b *block
	if first, ok := p.free.Min(); ok && !freeLess(first, &a.key) {
		b = first // the smallest free block already fits: no search needed
	} else if ok {
		p.free.AscendGreaterOrEqual(&a.key, a.foundFunc)
		b, a.found = a.found, nil
	}
	if b == nil || b.stream != s {
		return nil
	}
	if a.pol != nil && a.pol.fitWindow > 1 && !p.small {
		b = a.lowFitLocked(p, b, size) // policy: a low address among close fits
	}
	if b.seg.expandable() {
		b = a.expandableBestFitLocked(p, b)
	}
	if !a.rule.mayServe(b.size, size) {
		return nil
	}
	return b
}

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

// takeLocked hands out the free block b for a request of size rounded
// bytes, requested as asked: it splits off the rest of the block when that
// is worth keeping (the front is handed out, the rest stays free), marks
// the block allocated and records it in the ledger. It returns the block
// handed out.
//
// b is either in the free index (found by bestFitLocked, or mapped into an
// expandable segment) or a new segment's block, in no index yet.
func (a *Allocator) takeLocked(b *block, size, requested uint64) *block {
	p := b.pool
	wasSplit := b.isSplit()
	if a.rule.shouldSplit(p.small, b.size, size) {
		// The front of b is handed out as a new block; b keeps the rest
		// and stays (or goes) in the index under its new, smaller key.
		rest := b
		b = a.newBlockLocked() // zeroed
		b.ptr, b.size, b.stream, b.pool, b.seg = rest.ptr, size, rest.stream, p, rest.seg
		rest.linkBefore(b)
		inPlace := rest.indexed && p.shrinksInPlace(rest, size)
		if rest.indexed && !inPlace {
			p.remove(rest)
		}
		rest.ptr += device.Ptr(size)
		rest.size -= size
		if inPlace {
			rest.gcCountBase = p.gcCalls
			p.relist(rest) // it is split now
		} else {
			p.insert(rest)
		}
		switch {
		case b.seg.expandable(): // expandable blocks are never "inactive split"
		case wasSplit:
			a.inactiveSplitLocked(p, 0, -int64(size))
		default:
			a.inactiveSplitLocked(p, 1, int64(rest.size))
		}
	} else {
		if b.indexed {
			p.remove(b)
		}
		if wasSplit && !b.seg.expandable() {
			a.inactiveSplitLocked(p, -1, -int64(b.size))
		}
	}
	b.allocated = true
	b.requested = requested
	b.phase = a.phase
	a.live.put(b)
	a.blockAllocatedLocked(b)
	return b
}

// shrinksInPlace reports whether b, a free block in the index, can lose
// its first size bytes without leaving its place in the free index (its
// key only decreases, so it must stay above its predecessor). It answers
// only what it can tell without a search: when b is the smallest block,
// or when b was found by the best-fit search for size bytes (so every
// block before it on its stream is smaller than size) and the rest is at
// least size bytes. A block in the index that the search did not find is
// one mapped into an expandable segment, hence the exclusion. A search for
// the predecessor would fail most of the time (96% of the splits of
// random_mixed) and then cost more than the delete and insert it tries to
// save.
func (p *pool) shrinksInPlace(b *block, size uint64) bool {
	if b.size-size >= size && !b.seg.expandable() {
		return true
	}
	first, _ := p.free.Min()
	return first == b
}
