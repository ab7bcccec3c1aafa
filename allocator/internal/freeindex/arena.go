// This file holds the held arena: the free space of an expandable
// segment's range that the allocator's planned policy serves at planned
// addresses, taken out of the large buckets and the tree while a step
// follows the plan (Carve) and filed back before any other use of the
// index (settle).

package freeindex

import "github.com/gpumem/gpumem/device"

// arenaMark is x.pend while x holds an arena: every method that reads or
// changes the index settles a pending split first (x.pend != nil), and
// settle then files the arena's free blocks back (fileArena), so the
// held arena costs the other paths no test of their own.
var arenaMark = new(Block)

// holdArena takes b, a free block of an expandable segment filed in x,
// out of the index and holds the range it covers, [b.ptr, b.ptr+b.size):
// until the arena is filed back, the free blocks of that range are in no
// structure of x (not indexed), carves from them and merges among them
// touch only the segment's list (Carve, Put), and every other method
// files them back first. x has no pending split.
func (x *Index) holdArena(b *Block) {
	x.unfile(b)
	x.pend = arenaMark
	x.arena, x.arenaEnd = b, b.ptr+device.Ptr(b.size)
}

// inArena reports whether b lies in the held arena's range (x holds one).
func (x *Index) inArena(b *Block) bool {
	a := x.arena
	return b.seg == a.seg && b.ptr >= a.ptr && b.ptr < x.arenaEnd
}

// InArena reports whether b is a block of the arena x holds: a free one
// there is in no structure of x (the allocator's check asks).
func (x *Index) InArena(b *Block) bool { return x.pend == arenaMark && x.inArena(b) }

// HoldsArena reports whether x holds an arena (the allocator's tests ask).
func (x *Index) HoldsArena() bool { return x.pend == arenaMark }

// carveArena is Carve from c, a free block of the held arena: the bytes
// of c before ptr keep c's struct, the rest after ptr+size gets one of
// its own, both free and held, stamped as filing them would. A range at
// c's start keeps c's struct itself, so that the block at the arena's
// start (x.arena, where fileArena starts) is always the same struct.
func (x *Index) carveArena(c *Block, ptr device.Ptr, size uint64) *Block {
	b := c
	if ptr > c.ptr {
		b = x.spares.get()
		b.stream, b.pool = c.stream, c.pool
		b.sameSeg(c)
		b.ptr, b.size = ptr, c.size-uint64(ptr-c.ptr)
		c.linkAfter(b)
		c.size = uint64(ptr - c.ptr)
		c.gcCountBase = x.pool.GCCalls
	}
	if b.size > size {
		// Spares.get written out (it does not inline): a spare taken in
		// line, get called only for a new slab.
		sp := x.spares
		r := sp.head
		if r == nil {
			r = sp.get()
		} else {
			sp.head, r.next = r.next, nil
			sp.n--
		}
		r.stream, r.pool = b.stream, b.pool
		r.sameSeg(b)
		r.ptr, r.size = b.ptr+device.Ptr(size), b.size-size
		b.linkAfter(r)
		b.size = size
		r.gcCountBase = x.pool.GCCalls
	}
	return b
}

// putArena is Put for b, a block of the held arena just freed, whose
// free neighbours are held too: merged with them in the segment's list
// alone, into the lower struct (so that the arena's first block keeps
// its struct), and held. It reports false, changing nothing, when a free
// neighbour is filed in the index (one outside the arena's range).
func (x *Index) putArena(b *Block) (*Block, bool) {
	prev, next := b.prev, b.next
	mergePrev, mergeNext := prev != nil && prev.IsFree(), next != nil && next.IsFree()
	if mergePrev && prev.indexed || mergeNext && next.indexed {
		return nil, false
	}
	m := b
	if mergePrev {
		m = prev
		x.absorbNext(m) // b
	}
	if mergeNext {
		x.absorbNext(m) // next
	}
	m.gcCountBase = x.pool.GCCalls // as filing it would
	return m, true
}

// absorbNext merges m's next block into m, in the segment's list alone,
// and gives the next block's struct back to the spares.
func (x *Index) absorbNext(m *Block) {
	n := m.next
	m.size += n.size
	m.next = n.next
	m.growsAs(n)
	if m.next != nil {
		m.next.prev = m
	}
	x.spares.put(n)
}

// fileArena files the held arena's free blocks back in the index, each
// with the age base its last change stamped, and ends the hold.
func (x *Index) fileArena() {
	x.pend = nil
	for c := x.arena; c != nil && c.ptr < x.arenaEnd; c = c.next {
		if c.IsFree() {
			base := c.gcCountBase
			x.add(c)
			c.gcCountBase = base
		}
	}
	x.arena = nil
}

// checkArena checks the held arena: its first block starts the range
// and is a block of an expandable segment of x's pool and stream, whose
// lower neighbour is not free; the range ends at a block's end, whose
// upper neighbour is not free; the range's free blocks are in no
// structure (the allocator's check finds that every other free block
// is), and none of them neighbours another.
func (x *Index) checkArena(bad func(format string, args ...any)) {
	a := x.arena
	if x.kind != KindLarge || a == nil || a.seg == nil || !a.seg.Expandable() || a.stream != x.stream || a.pool != x.pool || !InSegment(a, a.seg) {
		bad("stream %d: the held arena's first block is not a block of an expandable segment of the large index", x.stream)
		return
	}
	if a.prev != nil && a.prev.IsFree() {
		bad("stream %d: the held arena at %v has a free lower neighbour %v", x.stream, a.ptr, a.prev.ptr)
	}
	c := a
	for ; c != nil && c.ptr < x.arenaEnd; c = c.next {
		if c.IsFree() && (c.indexed || c.next != nil && c.next.IsFree()) {
			bad("stream %d: the held arena's free block %v is indexed or has a free upper neighbour", x.stream, c.ptr)
		}
		if c.ptr+device.Ptr(c.size) > x.arenaEnd {
			bad("stream %d: the held arena ends at %v, within block %v+%d", x.stream, x.arenaEnd, c.ptr, c.size)
		}
	}
}
