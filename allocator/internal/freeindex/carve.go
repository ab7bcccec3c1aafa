// This file holds Carve and Containing, the free index's part in the
// allocator's planned policy: handing out a block at an address chosen in
// advance rather than by a fit.

package freeindex

import "github.com/gpumem/gpumem/device"

// Carve takes out of x the free block b, which holds [ptr, ptr+size), and
// returns a block of exactly that range, in no index, for the caller to
// hand out at once (Take without a split): the bytes of b before ptr and
// after ptr+size stay free blocks of their own, of x. Until the
// returned block is handed out it is a free neighbour of those, which
// the invariants forbid; the caller hands it out in the same operation.
// b must be free, filed in x or a block of the arena x holds, and hold
// the range; size is a positive
// multiple of 512 and ptr is 512-aligned.
//
// In an index of the large kind, b of an expandable segment is taken
// out of the index and its range held (holdArena; b may then be a free
// block of the held arena): the bytes before and after the block stay
// free blocks of that range, in no structure, until the index is next
// used otherwise (package doc, the held arena). Elsewhere, a range at
// b's start is split off as Take splits (the rest keeps b's struct and,
// until the index is next used, its key: a pending split), so that a
// block freed before the next use merges back with no change to the
// index; b whole is taken out of it.
func (x *Index) Carve(b *Block, ptr device.Ptr, size uint64) *Block {
	if x.pend == arenaMark && x.inArena(b) {
		return x.carveArena(b, ptr, size)
	}
	if x.pend != nil {
		x.settle()
	}
	if x.kind == KindLarge && b.SegExpandable() {
		x.holdArena(b)
		return x.carveArena(b, ptr, size)
	}
	if ptr == b.ptr {
		return x.Take(b, size, b.size > size)
	}
	x.unfile(b)
	if ptr > b.ptr {
		m := x.spares.get()
		m.stream, m.pool = b.stream, b.pool
		m.sameSeg(b)
		m.ptr, m.size = ptr, b.size-uint64(ptr-b.ptr)
		b.linkAfter(m)
		b.size = uint64(ptr - b.ptr)
		x.add(b)
		b = m
	}
	if b.size > size {
		r := x.spares.get()
		r.stream, r.pool = b.stream, b.pool
		r.sameSeg(b)
		r.ptr, r.size = b.ptr+device.Ptr(size), b.size-size
		b.linkAfter(r)
		b.size = size
		x.add(r)
	}
	return b
}

// InSegment reports whether the struct b is a block of seg now: linked
// among its blocks, not a spare (zeroed) nor reused elsewhere. A caller
// that kept b across operations that merge blocks (which give the
// absorbed structs back as spares) asks before it walks from b.
func InSegment(b *Block, seg *Segment) bool {
	if b == nil || b.seg != seg {
		return false
	}
	if b.prev == nil {
		if seg.head != b {
			return false
		}
	} else if b.prev.next != b {
		return false
	}
	return b.next == nil || b.next.prev == b
}

// Containing returns the block of from's segment that holds the address
// ptr, walking the segment's blocks from from toward it, or nil when ptr
// is outside the segment.
func Containing(from *Block, ptr device.Ptr) *Block {
	b := from
	for b != nil && ptr < b.ptr {
		b = b.prev
	}
	for b != nil && ptr >= b.ptr+device.Ptr(b.size) {
		b = b.next
	}
	return b
}
