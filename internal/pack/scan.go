// This file holds greedyScan, Greedy reading the placed items in address
// order (scanLists), which Greedy takes where most items are in use at
// once, as in a training step.

package pack

import (
	"context"
	"math"
	"math/bits"
	"slices"
)

// greedyScan is Greedy reading, for each item, the placed items in
// address order: their starts, ends, offsets, tops and supports are kept
// in lists in that order, cut into chunks of at most scanChunk items, a
// new one inserted where it belongs. An item's support is the lifetime
// of the placed item whose top is its offset: the one that set the
// running top where the item was placed (the whole of time for an item
// at 0). A placed item whose support is in use with the item placed
// lies at or below the running top when the search reaches it (the
// support lies before it in address order), so no gap starts at it. A
// chunk's weak items are those whose support is out of use at some op
// of their own lifetime (277 of BERT's 1,004 blocks), and its exposed
// times the 64ths of the ops of those ops. Where none of the weak items
// in use with the item placed has its support out of use, no gap starts
// in the chunk, and it changes only the running top, to the highest top
// of its items in use with the item placed: the chunk's items are read
// from the highest top down (byTop) to the first such, or to one no
// higher than the running top (scanLists.fit), or by its item of the
// highest top alone where that lies below the running top plus the
// item's size and is in use or no higher. Only a chunk whose
// exposed times meet the item's lifetime's is looked at for weak items,
// and only one with a weak item whose support is out of use is read
// item by item. A chunk is skipped whole where none of its items
// touches the 64th of the ops that the item's lifetime touches.
func greedyScan(ctx context.Context, items []Item, idx []int32, offsets []uint64, fit Fit, order []int32) uint64 {
	s := newScanLists(items)
	var footprint uint64
	for n, x := range idx {
		if n&1023 == 1023 && ctx.Err() != nil {
			break
		}
		b := &items[x]
		offsets[x] = 0
		if !takesMemory(b) {
			continue
		}
		at, sup := s.fit(uint32(b.Start), uint32(b.End), b.Bytes, fit == FirstFit)
		offsets[x] = at
		footprint = max(footprint, at+b.Bytes)
		s.insert(uint32(b.Start), uint32(b.End), at, at+b.Bytes, sup, x)
	}
	if order != nil {
		n := 0
		for _, r := range s.chunks {
			n += copy(order[n:], r.ids[:r.n])
		}
		listUnplaced(items, order[n:])
	}
	return footprint
}

// newScanLists returns empty lists for items: times cut into 64ths of
// their ops, up to the last End of those that take memory.
func newScanLists(items []Item) scanLists {
	var last uint32
	for i := range items {
		if b := &items[i]; takesMemory(b) {
			last = max(last, uint32(b.End))
		}
	}
	return scanLists{shift: uint(max(0, bits.Len32(last)-6))}
}

// scanChunk is the most placed items a chunk of scanLists holds (at most
// 16: the bits of scanRun.weak, the 4-bit positions of its byTop): the
// fewer, the more chunks are skipped whole and the more are looked at.
const scanChunk = 16

// scanLists are the placed items of greedyScan in address order, in
// chunks (scanItem); a chunk's times has bit k set where one of its
// items is in use at some op t with t>>shift == k (shift makes the last
// op's k less than 64).
type scanLists struct {
	chunks []*scanRun
	shift  uint
	slab   []scanRun // the chunks to come, made runSlab at a time
}

// runSlab is how many chunks scanLists makes at once (about 10 KiB).
const runSlab = 16

// newRun returns a new, empty chunk, from the slab: one allocation for
// runSlab of them.
func (s *scanLists) newRun() *scanRun {
	if len(s.slab) == 0 {
		s.slab = make([]scanRun, runSlab)
	}
	r := &s.slab[0]
	s.slab = s.slab[1:]
	return r
}

// scanRun is one chunk of scanLists: byTop lists its items' positions
// from the highest top down (on a tie, in the order they were placed),
// 4 bits each from the lowest; weak has bit i set where item i's support
// is out of use at some op of its lifetime, and exposed the bits of the
// times of those ops.
type scanRun struct {
	times   uint64
	exposed uint64
	n       int
	weak    uint16
	byTop   uint64
	items   [scanChunk]scanItem
	ids     [scanChunk]int32
}

// A scanItem is a placed item of a chunk: in use during [start, end) at
// the bytes [off, top), its support in use during sup (the chunk's ids
// name it in Greedy's items). A chunk keeps its items as one array of 32
// bytes each, so that an insertion moves them with one copy (and their
// ids with another), and the search reads an item's fields from one
// place.
type scanItem struct {
	start, end uint32
	off, top   uint64
	sup        [2]uint32
}

// times returns the bits of the 64ths of the ops that [start, end)
// touches.
func (s *scanLists) times(start, end uint32) uint64 {
	a, b := start>>s.shift, (end-1)>>s.shift
	return ^uint64(0) >> (63 - (b - a)) << a
}

// insert adds item id, in use during [start, end) at [off, top), whose
// support is in use during sup, after the items below off and before
// those at or above it.
func (s *scanLists) insert(start, end uint32, off, top uint64, sup [2]uint32, id int32) {
	// The chunk of the first item at or above off, else the last.
	c := len(s.chunks) - 1
	for lo, hi := 0, len(s.chunks); lo < hi; {
		m := int(uint(lo+hi) >> 1)
		if r := s.chunks[m]; r.items[r.n-1].off >= off {
			c, hi = m, m
		} else {
			lo = m + 1
		}
	}
	if c < 0 {
		s.chunks = append(s.chunks, s.newRun())
		c = 0
	}
	r := s.chunks[c]
	i := 0 // the first item at or above off
	for hi := r.n; i < hi; {
		m := int(uint(i+hi) >> 1)
		if r.items[m].off < off {
			i = m + 1
		} else {
			hi = m
		}
	}
	if r.n == scanChunk {
		// Split the chunk in two halves, and insert into the one that
		// holds the place.
		h := scanChunk / 2
		q := s.newRun()
		q.n = scanChunk - h
		copy(q.items[:], r.items[h:])
		copy(q.ids[:], r.ids[h:])
		q.weak = r.weak >> h
		r.n = h
		r.weak &= 1<<h - 1
		r.times, q.times = s.timesOf(r), s.timesOf(q)
		r.exposed, q.exposed = s.exposedOf(r), s.exposedOf(q)
		r.byTop, q.byTop = splitByTop(r.byTop, h)
		s.chunks = slices.Insert(s.chunks, c+1, q)
		if i > h {
			r, i = q, i-h
		}
	}
	copy(r.items[i+1:r.n+1], r.items[i:r.n])
	copy(r.ids[i+1:r.n+1], r.ids[i:r.n])
	r.items[i], r.ids[i] = scanItem{start: start, end: end, off: off, top: top, sup: sup}, id
	// Positions from i move up one, in byTop (its even and its odd
	// nibbles as bytes: a byte of at least i gets its bit 7 set by
	// |0x80 - i, which borrows from no other) and in weak.
	const ones, low = 0x0101_0101_0101_0101, 0x0f0f_0f0f_0f0f_0f0f
	ev, od, bi := r.byTop&low, r.byTop>>4&low, uint64(i)*ones
	ev += ((ev | ones<<7) - bi) >> 7 & ones
	od += ((od | ones<<7) - bi) >> 7 & ones
	by := ev&low | (od&low)<<4
	// The new item goes before the first of a lower top.
	lo, hi := 0, r.n
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if r.items[by>>(4*m)&15].top >= top {
			lo = m + 1
		} else {
			hi = m
		}
	}
	below := uint64(1)<<(4*lo) - 1
	r.byTop = by&below | (by&^below)<<4 | uint64(i)<<(4*lo)
	r.weak += r.weak &^ (1<<i - 1)
	if sup[0] > start || sup[1] < end {
		r.weak |= 1 << i
		r.exposed |= s.exposed(start, end, sup)
	}
	r.n++
	r.times |= s.times(start, end)
}

// splitByTop splits by, the byTop of a full chunk, at position h: the
// positions below h, and those from h less h, each in by's order.
func splitByTop(by uint64, h int) (lo, hi uint64) {
	var nl, nh int
	for range scanChunk {
		p := by & 15
		by >>= 4
		if p < uint64(h) {
			lo |= p << (4 * nl)
			nl++
		} else {
			hi |= (p - uint64(h)) << (4 * nh)
			nh++
		}
	}
	return lo, hi
}

// exposed returns the bits of the 64ths of the ops that the part of
// [start, end) out of sup touches.
func (s *scanLists) exposed(start, end uint32, sup [2]uint32) uint64 {
	var t uint64
	if sup[0] > start {
		t |= s.times(start, min(end, sup[0]))
	}
	if sup[1] < end {
		t |= s.times(max(start, sup[1]), end)
	}
	return t
}

// exposedOf returns the bits of the exposed times of r's weak items.
func (s *scanLists) exposedOf(r *scanRun) uint64 {
	var t uint64
	for u := r.weak; u != 0; u &= u - 1 {
		i := bits.TrailingZeros16(u)
		it := &r.items[i]
		t |= s.exposed(it.start, it.end, it.sup)
	}
	return t
}

// timesOf returns the bits of the times of r's items.
func (s *scanLists) timesOf(r *scanRun) uint64 {
	var t uint64
	for i := range r.n {
		t |= s.times(r.items[i].start, r.items[i].end)
	}
	return t
}

// fit returns the offset for an item of bytes in use during [start,
// end), among the placed items: the smallest gap between those in use
// at some op of [start, end) that holds it, the lowest of those on a
// tie (the lowest gap that holds it, when first), else above them all;
// and the lifetime of the placed item whose top it is (the whole of
// time at 0). A gap of exactly bytes is the smallest there can be, and
// the lowest such is the first found: the search stops there, as it
// stops at the first gap that holds the item when first.
func (s *scanLists) fit(start, end uint32, bytes uint64, first bool) (uint64, [2]uint32) {
	var top uint64
	sup := [2]uint32{0, math.MaxUint32}
	// best.slack is the best gap found less bytes: a gap g holds the
	// item and is smaller when g-bytes < best.slack (g >= bytes, checked
	// apart). It is read and written only where a gap holds the item,
	// seldom: kept in memory, it leaves the loop's registers to the rest.
	best := &scanBest{slack: math.MaxUint64, at: math.MaxUint64}
	want := s.times(start, end)
	for _, r := range s.chunks {
		if r.times&want == 0 {
			continue // no item of r in use during [start, end)
		}
		// Item h of r has the highest top. If its offset is below
		// top+bytes, no gap that holds the item starts at h or before
		// it (their offsets are no higher, and top only rises); then,
		// when h's top is no higher than top, no item of r raises top
		// or starts a gap (each lies below its own top), and when h is
		// in use during [start, end), top rises to h's, above every
		// item after it. Either way r is known without its weak items.
		if h := &r.items[r.byTop&15]; h.off < top+bytes {
			if h.top <= top {
				continue
			}
			if h.start < end && h.end > start {
				top, sup = h.top, [2]uint32{h.start, h.end}
				continue
			}
		}
		// A gap may start only at a weak item in use during [start,
		// end) whose support is not, which can be only where r's
		// exposed times meet the item's.
		if r.exposed&want != 0 {
			for u := r.weak; u != 0; u &= u - 1 {
				i := bits.TrailingZeros16(u)
				if it := &r.items[i]; (it.sup[0] >= end || it.sup[1] <= start) && it.start < end && it.end > start {
					goto read
				}
			}
		}
		// None: the running top rises to the highest top of r's items
		// in use during [start, end), if above it.
		for by, k := r.byTop, r.n; k > 0; by, k = by>>4, k-1 {
			it := &r.items[by&15]
			if it.top <= top {
				break
			}
			if it.start < end && it.end > start {
				top, sup = it.top, [2]uint32{it.start, it.end}
				break
			}
		}
		continue
	read:
		for i := range r.items[:r.n] {
			it := &r.items[i]
			if it.start >= end || it.end <= start {
				continue
			}
			if o := it.off; o >= top+bytes && (first || best.better(o-top-bytes, top, sup)) {
				return top, sup
			}
			if it.top > top {
				top, sup = it.top, [2]uint32{it.start, it.end}
			}
		}
	}
	if best.at == math.MaxUint64 {
		return top, sup
	}
	return best.at, best.sup
}

// scanBest is the best gap scanLists.fit has found: its size less the
// item's, its offset and the lifetime of the item whose top it is.
type scanBest struct {
	slack, at uint64
	sup       [2]uint32
}

// better keeps a gap at of slack bytes more than the item's, above an
// item in use during sup, if it is smaller than the best so far, and
// reports whether it fits exactly.
//
//go:noinline
func (b *scanBest) better(slack, at uint64, sup [2]uint32) bool {
	if slack < b.slack {
		b.slack, b.at, b.sup = slack, at, sup
	}
	return slack == 0
}
