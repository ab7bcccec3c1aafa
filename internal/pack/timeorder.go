// This file holds TimeOrder, the packing in the order items come into use,
// and Within, which packs by size (Greedy) unless that would read more
// than a budget of placed items, and in time order then.

package pack

import (
	"cmp"
	"context"
	"math/bits"
	"slices"

	"github.com/google/btree"
)

// gap is a free range [off, off+size) below a TimeOrder's top.
type gap struct{ off, size uint64 }

// end is where g ends.
func (g gap) end() uint64 { return g.off + g.size }

// gapLess orders gaps by size, then offset: the first at or above a size
// is the best fit for it, the lowest of its size.
func gapLess(a, b gap) bool {
	if a.size != b.size {
		return a.size < b.size
	}
	return a.off < b.off
}

// gapSlicesMax is how many free gaps a TimeOrder keeps in slices
// (gapSet) before it moves them to a B-tree and maps (gapTree). A
// training step keeps few gaps at once (BERT's steps at most 25 to 43;
// 10^4 to 5 x 10^4 items of random sizes and lifetimes 119 to 765),
// where a binary search, a short copy and a scan of a class of sizes
// cost less than a tree's descent and a map's hashing; the tree bounds
// each operation by O(log n) where they are many. A variable for the
// tests that run past it.
var gapSlicesMax = 1024

// gapSet is the free gaps below a TimeOrder's top: in a slice by offset
// (for the merge of a range given back with the gaps beside it, and the
// gap at the top, the last), and in classes of sizes by powers of 2 (for
// the best fit: class c holds the gaps of c+1 significant bits, in no
// order; bit c of nonEmpty says it holds some), until they number more
// than gapSlicesMax; then in tree, and the slices are dropped. No two
// gaps touch: a range given back is merged with the gaps it touches.
type gapSet struct {
	byOff    []gap
	class    [64][]gap
	nonEmpty uint64
	tree     *gapTree
}

// classOf returns the class of sizes of a gap of size bytes (size > 0).
func classOf(size uint64) int { return bits.Len64(size) - 1 }

// file adds x to its class.
func (s *gapSet) file(x gap) {
	c := classOf(x.size)
	s.class[c] = append(s.class[c], x)
	s.nonEmpty |= 1 << c
}

// unfile takes x, filed, out of its class.
func (s *gapSet) unfile(x gap) {
	c := classOf(x.size)
	gs := s.class[c]
	i := 0
	for gs[i].off != x.off {
		i++
	}
	gs[i] = gs[len(gs)-1]
	s.class[c] = gs[:len(gs)-1]
	if len(gs) == 1 {
		s.nonEmpty &^= 1 << c
	}
}

// offAt returns the index in byOff of the first gap at or above off.
func (s *gapSet) offAt(off uint64) int {
	lo, hi := 0, len(s.byOff)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if s.byOff[m].off < off {
			lo = m + 1
		} else {
			hi = m
		}
	}
	return lo
}

// insertGap inserts x at index i of gs. (slices.Insert and Replace, for
// any number of elements, cost several times as much.)
func insertGap(gs []gap, i int, x gap) []gap {
	gs = append(gs, gap{})
	copy(gs[i+1:], gs[i:])
	gs[i] = x
	return gs
}

// deleteGap deletes index i of gs.
func deleteGap(gs []gap, i int) []gap {
	copy(gs[i:], gs[i+1:])
	return gs[:len(gs)-1]
}

// give files the range x given back, merged with the gaps that end
// where it starts and start where it ends.
func (s *gapSet) give(x gap) {
	if s.tree != nil {
		s.tree.give(x)
		return
	}
	i := s.offAt(x.off)
	lo, hi := i, i // byOff[lo:hi] are merged into x
	if i > 0 && s.byOff[i-1].end() == x.off {
		below := s.byOff[i-1]
		s.unfile(below)
		x = gap{below.off, below.size + x.size}
		lo = i - 1
	}
	if i < len(s.byOff) && s.byOff[i].off == x.end() {
		s.unfile(s.byOff[i])
		x.size += s.byOff[i].size
		hi = i + 1
	}
	switch hi - lo {
	case 0:
		s.byOff = insertGap(s.byOff, lo, x)
	case 2:
		s.byOff = deleteGap(s.byOff, hi-1)
		fallthrough
	case 1:
		s.byOff[lo] = x
	}
	s.file(x)
	if len(s.byOff) > gapSlicesMax {
		s.tree = newGapTree(s.byOff)
		s.byOff, s.class, s.nonEmpty = nil, [64][]gap{}, 0
	}
}

// take returns the offset of the smallest gap that holds b bytes (the
// lowest of those), which keeps what b does not use, or false if none
// does. A gap of b's class may hold it; every gap of a class above
// does, and is larger than any of b's class that does.
func (s *gapSet) take(b uint64) (uint64, bool) {
	if s.tree != nil {
		return s.tree.take(b)
	}
	c := classOf(b)
	fit, found := gap{}, false
	for _, g := range s.class[c] {
		if g.size >= b && (!found || gapLess(g, fit)) {
			fit, found = g, true
		}
	}
	if !found {
		above := s.nonEmpty >> c >> 1 << c << 1
		if above == 0 {
			return 0, false
		}
		gs := s.class[bits.TrailingZeros64(above)]
		fit = gs[0]
		for _, g := range gs[1:] {
			if gapLess(g, fit) {
				fit = g
			}
		}
	}
	s.unfile(fit)
	i := s.offAt(fit.off)
	if fit.size > b {
		rest := gap{fit.off + b, fit.size - b}
		s.byOff[i] = rest // in fit's place by offset
		s.file(rest)
	} else {
		s.byOff = deleteGap(s.byOff, i)
	}
	return fit.off, true
}

// atTop returns where an item that no gap holds goes: the start of the
// gap that ends at top, which it takes, or else top.
func (s *gapSet) atTop(top uint64) uint64 {
	if s.tree != nil {
		return s.tree.atTop(top)
	}
	n := len(s.byOff)
	if n == 0 || s.byOff[n-1].end() != top { // gaps lie below the top: the last is the highest
		return top
	}
	g := s.byOff[n-1]
	s.byOff = s.byOff[:n-1]
	s.unfile(g)
	return g.off
}

// gapTree holds the gaps of a gapSet past gapSlicesMax: a B-tree by size
// and offset for the best fit, and maps of their starts and their ends
// for the merge of a range given back with those beside it.
type gapTree struct {
	bySize *btree.BTreeG[gap]
	at     map[uint64]uint64 // start -> size
	ending map[uint64]uint64 // end -> start
}

// newGapTree returns a gapTree of the gaps in gs.
func newGapTree(gs []gap) *gapTree {
	t := &gapTree{bySize: btree.NewG(32, gapLess), at: make(map[uint64]uint64, 2*len(gs)), ending: make(map[uint64]uint64, 2*len(gs))}
	for _, g := range gs {
		t.add(g)
	}
	return t
}

// add files the free range x.
func (t *gapTree) add(x gap) {
	t.bySize.ReplaceOrInsert(x)
	t.at[x.off] = x.size
	t.ending[x.end()] = x.off
}

// remove takes the free range x, filed, out.
func (t *gapTree) remove(x gap) {
	t.bySize.Delete(x)
	delete(t.at, x.off)
	delete(t.ending, x.end())
}

// give is gapSet.give in the tree.
func (t *gapTree) give(x gap) {
	if off, ok := t.ending[x.off]; ok {
		below := gap{off, x.off - off}
		t.remove(below)
		x = gap{off, below.size + x.size}
	}
	if size, ok := t.at[x.end()]; ok {
		t.remove(gap{x.end(), size})
		x.size += size
	}
	t.add(x)
}

// take is gapSet.take in the tree.
func (t *gapTree) take(b uint64) (uint64, bool) {
	var fit gap
	found := false
	t.bySize.AscendGreaterOrEqual(gap{size: b}, func(x gap) bool {
		fit, found = x, true
		return false
	})
	if !found {
		return 0, false
	}
	t.remove(fit)
	if fit.size > b {
		t.add(gap{fit.off + b, fit.size - b})
	}
	return fit.off, true
}

// atTop is gapSet.atTop in the tree.
func (t *gapTree) atTop(top uint64) uint64 {
	start, ok := t.ending[top]
	if !ok {
		return top
	}
	t.remove(gap{start, top - start})
	return start
}

// TimeOrder packs items as an allocator that knows no lifetime would
// place them, in the order they come into use: at its Start each item
// takes the smallest free gap that holds it (the lowest of those on a
// tie), or else the free gap that ends at the top, grown past it, or
// else the top; at its End it gives its bytes back, merged with the free
// gaps beside them. At an op, the items that end there give their bytes
// back before those that start there take theirs; items that start at
// one op come in the order of their indices. It writes each item's
// offset in offsets (0 for one that takes no memory), and, if order is
// not nil, the items by offset as Greedy does (those that take memory
// from the lowest offset up, ties by index, then the others by index),
// and returns the footprint.
//
// It costs O(n log n) whatever the lifetimes, where Greedy reads about
// the pairs of items in use at once: on a training step's blocks, most
// of which are in use together, n^2/2. The free gaps are few at once
// on the steps measured, and kept in slices (gapSet) until they are
// many. It packs looser: BERT's steps at batches 2, 4 and 8 into
// 0.04 to 0.52 % more than their peaks of bytes in use, which greedy by
// size meets or comes within 0.09 % of.
func TimeOrder(items []Item, offsets []uint64, order []int32) uint64 {
	starts := make([]int32, 0, len(items))
	for i := range items {
		offsets[i] = 0
		if takesMemory(&items[i]) {
			starts = append(starts, int32(i))
		}
	}
	ends := slices.Clone(starts)
	// Ops as unsigned numbers in their order: the sign bit flipped.
	key := make([]uint64, len(items))
	for _, i := range starts {
		key[i] = uint64(items[i].Start) ^ 1<<63
	}
	sortBy(starts, key)
	for _, i := range ends {
		key[i] = uint64(items[i].End) ^ 1<<63
	}
	sortBy(ends, key)
	var g gapSet
	var top uint64
	for i, j := 0, 0; i < len(starts); {
		if j < len(ends) && items[ends[j]].End <= items[starts[i]].Start {
			g.give(gap{offsets[ends[j]], items[ends[j]].Bytes})
			j++
			continue
		}
		k := starts[i]
		i++
		b := items[k].Bytes
		off, ok := g.take(b)
		if !ok {
			off = g.atTop(top) // the gap at the top, grown, or the top
			top = off + b
		}
		offsets[k] = off
	}
	if order != nil {
		n := copy(order, starts)
		sortBy(order[:n], offsets)
		listUnplaced(items, order[n:])
	}
	return top
}

// sortBy sorts the distinct indices idx (none negative) by key[i], then
// by index. Where the keys' range and the indices fit in 64 bits
// together it sorts numbers that hold both (by radix, radixSort, where
// they are many), which compares without calls; else it sorts with a
// comparison.
func sortBy(idx []int32, key []uint64) {
	if len(idx) < 2 {
		return
	}
	lo, hi, top := key[idx[0]], key[idx[0]], idx[0]
	sorted, prev, prevI := true, lo, idx[0]
	var ones uint64 // the bits set in any key's difference from the first
	for _, i := range idx {
		k := key[i]
		lo, hi, top = min(lo, k), max(hi, k), max(top, i)
		sorted = sorted && (prev < k || prev == k && prevI <= i)
		prev, prevI = k, i
		ones |= k ^ key[idx[0]]
	}
	if sorted { // as the starts of a step's blocks, in the order they were asked for
		return
	}
	// The low bits in which no two keys differ (offsets of blocks of
	// whole 512 bytes: 9) are left out of the numbers sorted.
	low := min(bits.TrailingZeros64(ones), 63)
	wi := bits.Len32(uint32(top))
	if bits.Len64((hi-lo)>>low)+wi > 64 {
		slices.SortFunc(idx, func(x, y int32) int { return cmp.Or(cmp.Compare(key[x], key[y]), cmp.Compare(x, y)) })
		return
	}
	keys := make([]uint64, len(idx))
	for n, i := range idx {
		keys[n] = (key[i]-lo)>>low<<wi | uint64(i)
	}
	if len(keys) < 64 {
		slices.Sort(keys)
	} else {
		radixSort(keys, bits.Len64((hi-lo)>>low)+wi)
	}
	for n, k := range keys {
		idx[n] = int32(k & (1<<wi - 1))
	}
}

// radixSort sorts keys, each below 2^width, a byte at a time from the
// least significant, passing over the bytes in which every key is the
// same: a step's thousand ends take 2 or 3 passes, their offsets and
// indices 4 or 5, at about 15 instructions a key a pass, against a
// comparison sort's n log n steps.
func radixSort(keys []uint64, width int) {
	var ones uint64 // the bits in which some key differs from the first
	for _, k := range keys {
		ones |= k ^ keys[0]
	}
	src, dst := keys, make([]uint64, len(keys))
	for shift := 0; shift < width; shift += 8 {
		if ones>>shift&0xff == 0 {
			continue
		}
		var at [257]int
		for _, k := range src {
			at[k>>shift&0xff+1]++
		}
		for d := 1; d < len(at); d++ {
			at[d] += at[d-1]
		}
		for _, k := range src {
			d := k >> shift & 0xff
			dst[at[d]] = k
			at[d]++
		}
		src, dst = dst, src
	}
	copy(keys, src) // nothing to copy when the passes made were even
}

// Within packs items as Greedy does by size (Orders[0]), with fit,
// unless Greedy's model of the placed items it would read (the cheaper
// of its two searches: n^2/2 in address order, or through the buckets
// of time at scanCosts each) exceeds budget: then in time order
// (TimeOrder). It writes offsets and order as Greedy does, and returns
// the footprint and whether it packed by size. A caller that packs
// while others wait (the allocator's planned policy, under its lock)
// bounds the wait so: Greedy's reads grow as the square of the items
// in use at once, TimeOrder's work as n log n.
func Within(items []Item, ops int, offsets []uint64, fit Fit, order []int32, budget int) (uint64, bool) {
	if len(items) == 0 {
		return 0, true
	}
	scan, cost := searchCost(items, ops)
	if cost > budget {
		return TimeOrder(items, offsets, order), false
	}
	return greedy(context.Background(), items, ops, Sorted(items, 0), offsets, fit, order, scan), true
}
