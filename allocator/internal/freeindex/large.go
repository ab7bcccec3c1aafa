// This file holds largeBuckets, the index of one stream's free blocks of
// up to 128 MiB in the large pool of plain segments: a bucket per 512-byte
// size, each a heap by address, found through a bitmap in three levels
// and a hash table of the sizes in use.

package freeindex

import (
	"math/bits"
	"slices"
)

const (
	largeClasses = 1 << 18                     // sizes 512 B to 128 MiB
	largeWords   = largeClasses / 64           // words of the first level of the bitmap
	maxLargeSize = largeClasses * MinBlockSize // larger free blocks go to the tree
)

// largeBuckets indexes the large pool's free blocks of at most 128 MiB by
// size class (size / 512 - 1), as sizeBuckets does the small pool's: the
// best fit for a size is the lowest address in the first non-empty class
// at or above the size's. The bitmap has a bit per class (l0), a bit per
// word of l0 (l1) and a bit per word of l1 (l2), so that three bit scans
// find that class among 2^18. The few classes that hold blocks are kept
// in an open-addressing table (a stream's large free blocks come in few
// sizes: tensors of one shape, again and again).
//
// Invariants (checked by check): a bit of l0 is set exactly when its
// class is in the table (or its page); a bit of l1 (l2) exactly when its
// word of l0 (l1) is not zero; a class's bucket holds its lowest address
// in first and, for two blocks or more, a heap by address of all of them
// with every block's heapIdx its position. In pages (checkPages): a word
// with blocks has its page; a word without has none, or, among the
// words of classes up to 2 MiB (keptWords), a zero one.
type largeBuckets struct {
	l0 [largeWords]uint64
	l1 [largeWords / 64]uint64
	l2 uint64

	tab   []bucket // a power of two of slots, at most half full
	shift uint8
	used  int
	spare [][]*Block // heaps of classes that emptied, kept for reuse

	frontier []*Block // ascendHeap's, kept for the next walk

	sums   *wordSums // the close fit's counts and lowest blocks per word of l0 (closefit.go), from its first use
	sumsAt int       // the first class the sums count: sumsFrom once they exist, above every class before

	pages  *[largeWords]*classPage // its classes by word of l0, if it keeps them so (pages.go): nil for an empty word, or zero for one of keptWords
	spareP []*classPage            // pages of words that emptied, zero, kept for reuse

	// top bounds the classes that hold blocks: none is above it. It
	// rises as a class fills (insert, move), and falls only where fit
	// finds no class at or above one (to the class below it), so that a
	// fit above every block it holds, as a lend asks of every other
	// stream, costs a comparison and no read of the bitmap.
	top int
}

// A bucket is one class's blocks; a zero class marks an empty slot.
type bucket struct {
	class int32 // class + 1
	first *Block
	heap  []*Block // two blocks or more: all of them, a heap by address
}

// classBit returns the word of l0 and the bit of class c.
func classBit(c int) (int, uint64) { return c >> 6 & (largeWords - 1), 1 << (c & 63) }

// firstAtLeast returns the first non-empty class at or above c, or -1.
func (s *largeBuckets) firstAtLeast(c int) int {
	w0 := c >> 6 & (largeWords - 1)
	if m := s.l0[w0] & (^uint64(0) << (c & 63)); m != 0 {
		return w0<<6 | bits.TrailingZeros64(m)
	}
	w1 := w0 >> 6
	if m := s.l1[w1] & (^uint64(0) << (w0&63 + 1)); m != 0 {
		w0 = w1<<6 | bits.TrailingZeros64(m)
		return w0<<6 | bits.TrailingZeros64(s.l0[w0])
	}
	if m := s.l2 & (^uint64(0) << (w1 + 1)); m != 0 {
		w1 = bits.TrailingZeros64(m)
		w0 = w1<<6 | bits.TrailingZeros64(s.l1[w1])
		return w0<<6 | bits.TrailingZeros64(s.l0[w0&(largeWords-1)])
	}
	return -1
}

// lastBelow returns the last non-empty class below c, or -1.
func (s *largeBuckets) lastBelow(c int) int {
	if c <= 0 {
		return -1
	}
	c--
	w0 := c >> 6 & (largeWords - 1)
	if m := s.l0[w0] & (^uint64(0) >> (63 - c&63)); m != 0 {
		return w0<<6 | (63 - bits.LeadingZeros64(m))
	}
	w1 := w0 >> 6
	if m := s.l1[w1] & (1<<(w0&63) - 1); m != 0 {
		w0 = w1<<6 | (63 - bits.LeadingZeros64(m))
		return w0<<6 | (63 - bits.LeadingZeros64(s.l0[w0]))
	}
	if m := s.l2 & (1<<w1 - 1); m != 0 {
		w1 = 63 - bits.LeadingZeros64(m)
		w0 = w1<<6 | (63 - bits.LeadingZeros64(s.l1[w1]))
		return w0<<6 | (63 - bits.LeadingZeros64(s.l0[w0&(largeWords-1)]))
	}
	return -1
}

// fit returns the free block of the lowest (size, address) with at least
// size bytes (at most 128 MiB), or nil.
func (s *largeBuckets) fit(size uint64) *Block {
	want := classOf(size)
	if want > s.top {
		return nil
	}
	c := s.firstAtLeast(want)
	if c < 0 {
		s.top = want - 1
		return nil
	}
	return s.find(c).first
}

// last returns a block of the largest size, or nil.
func (s *largeBuckets) last() *Block {
	if c := s.lastBelow(largeClasses); c >= 0 {
		return s.find(c).first
	}
	return nil
}

func (s *largeBuckets) home(c int32) int { return int(fibHash(uint64(c), s.shift)) }

// find returns the bucket of class c, which holds blocks.
func (s *largeBuckets) find(c int) *bucket {
	if s.pages != nil { // nil or a page for each word
		return &s.pages[c>>6][c&63]
	}
	return s.findInTable(c)
}

// findInTable is find in the table, apart so that find is inlined.
//
//go:noinline
func (s *largeBuckets) findInTable(c int) *bucket {
	key := int32(c) + 1
	i := s.home(key)
	for s.tab[i].class != key && s.tab[i].class != 0 {
		i = (i + 1) & (len(s.tab) - 1)
	}
	return &s.tab[i] // an empty slot if the table lacks c: a bug that check reports
}

// slot returns the slot of class c, or -1 if the table does not hold it
// (which for a class with a bit set in l0 is a bug that check reports).
func (s *largeBuckets) slot(c int) int {
	if len(s.tab) == 0 {
		return -1
	}
	key := int32(c) + 1
	mask := len(s.tab) - 1
	for i := s.home(key); ; i = (i + 1) & mask {
		switch s.tab[i].class {
		case key:
			return i
		case 0:
			return -1
		}
	}
}

// insert adds b to its class.
func (s *largeBuckets) insert(b *Block) {
	c := classOf(b.size)
	if c >= s.sumsAt {
		s.sums.added(c>>6, b)
	}
	w, bit := classBit(c)
	if s.l0[w]&bit != 0 {
		bk := s.find(c)
		h := bk.heap
		if len(h) == 0 {
			h = s.newHeap()
			bk.first.heapIdx = 0
			h = append(h, bk.first)
		}
		h = append(h, b)
		heapUp(h, len(h)-1, true)
		bk.heap, bk.first = h, h[0]
		return
	}
	key := int32(c) + 1
	s.top = max(s.top, c) // a class fills
	if s.pages != nil {
		// An empty word of small classes keeps its page, zero.
		p := s.pages[w]
		if s.l0[w] == 0 { // the word's first class: its bits above, and a page
			s.l1[w>>6] |= 1 << (w & 63)
			s.l2 |= 1 << (w >> 6)
			if p == nil {
				p = s.newPage()
				s.pages[w] = p
			}
		}
		s.l0[w] |= bit
		p[c&63].class, p[c&63].first = key, b // an empty bucket is zero
		return
	}
	s.l0[w] |= bit
	s.l1[w>>6] |= 1 << (w & 63)
	s.l2 |= 1 << (w >> 6)
	if 2*(s.used+1) > len(s.tab) {
		s.grow()
	}
	mask := len(s.tab) - 1
	i := s.home(key)
	for s.tab[i].class != 0 {
		i = (i + 1) & mask
	}
	s.tab[i] = bucket{class: key, first: b}
	s.used++
}

// newHeap returns an empty slice for a class's heap, reused when possible.
func (s *largeBuckets) newHeap() []*Block {
	if n := len(s.spare); n > 0 {
		h := s.spare[n-1]
		s.spare[n-1] = nil
		s.spare = s.spare[:n-1]
		return h
	}
	return make([]*Block, 0, 4)
}

// remove takes b out of its class.
func (s *largeBuckets) remove(b *Block) {
	c := classOf(b.size)
	if c >= s.sumsAt {
		s.sums.removed(c>>6, b)
	}
	var bk *bucket
	slot := -1
	if s.pages != nil {
		bk = &s.pages[c>>6&(largeWords-1)][c&63]
	} else {
		slot = s.slot(c)
		bk = &s.tab[slot]
	}
	if h := bk.heap; len(h) > 0 {
		h = heapRemove(h, int(b.heapIdx))
		bk.first = h[0]
		if len(h) == 1 {
			h[0] = nil
			s.spare = append(s.spare, h[:0])
			h = nil
		}
		bk.heap = h
		return
	}
	if slot < 0 {
		*bk = bucket{}
	} else {
		s.delete(slot)
	}
	w, bit := classBit(c)
	s.l0[w] &^= bit
	if s.l0[w] == 0 {
		if slot < 0 && w >= keptWords { // its page is zero again
			s.spareP = append(s.spareP, s.pages[w])
			s.pages[w] = nil
		}
		s.l1[w>>6] &^= 1 << (w & 63)
		if s.l1[w>>6] == 0 {
			s.l2 &^= 1 << (w >> 6)
		}
	}
}

// move refiles b, filed under the class of size old, under the class of
// its size, in buckets that keep pages: a pending split that settles
// (Index.settle). It is remove and then insert, less what they would undo:
// a page that the old class's word lets go of serves the new class's word
// if that needs one, and the bits above a word that empties and fills
// again stay. Its heap steps are remove's and insert's written out: the
// same steps as shared functions, which Go does not inline, cost the
// policy 13 instructions per operation on random_mixed (891.3 against
// 877.9, scripts/callgrind.sh policy) and the faithful default 3.
func (s *largeBuckets) move(b *Block, old uint64) {
	oc, c := classOf(old), classOf(b.size)
	if oc >= s.sumsAt {
		s.sums.removed(oc>>6, b)
	}
	if c >= s.sumsAt {
		s.sums.added(c>>6, b)
	}
	var freed *classPage // the old class's page, zero, if its word emptied and lets it go
	ow := oc >> 6 & (largeWords - 1)
	if bk := &s.pages[ow][oc&63]; len(bk.heap) > 0 {
		h := heapRemove(bk.heap, int(b.heapIdx))
		bk.first = h[0]
		if len(h) == 1 {
			h[0] = nil
			s.spare = append(s.spare, h[:0])
			h = nil
		}
		bk.heap = h
	} else {
		*bk = bucket{}
		if s.l0[ow] &^= 1 << (oc & 63); s.l0[ow] == 0 && ow >= keptWords {
			freed = s.pages[ow]
			s.pages[ow] = nil
		}
	}
	w, bit := classBit(c)
	if c > s.top { // c may be empty (the cases below but the first)
		s.top = c
	}
	switch {
	case s.l0[w]&bit != 0:
		bk := &s.pages[w][c&63]
		h := bk.heap
		if len(h) == 0 {
			h = s.newHeap()
			bk.first.heapIdx = 0
			h = append(h, bk.first)
		}
		h = append(h, b)
		heapUp(h, len(h)-1, true)
		bk.heap, bk.first = h, h[0]
	case s.l0[w] != 0:
		s.l0[w] |= bit
		bk := &s.pages[w][c&63] // zero
		bk.class, bk.first = int32(c)+1, b
	default: // the word's first class
		p := s.pages[w] // a kept word's, zero
		if p == nil {
			if p, freed = freed, nil; p == nil {
				p = s.newPage()
			}
			s.pages[w] = p
		}
		s.l0[w] = bit
		p[c&63].class, p[c&63].first = int32(c)+1, b // zero
		if w == ow {
			return // emptied and filled again: the bits above stay
		}
		s.l1[w>>6] |= 1 << (w & 63)
		s.l2 |= 1 << (w >> 6)
	}
	if s.l0[ow] == 0 { // the old word emptied and stays so
		s.clearWord(ow)
		if freed != nil {
			s.spareP = append(s.spareP, freed)
		}
	}
}

// clearWord clears the bits above word w of l0, which emptied.
func (s *largeBuckets) clearWord(w int) {
	if s.l1[w>>6] &^= 1 << (w & 63); s.l1[w>>6] == 0 {
		s.l2 &^= 1 << (w >> 6)
	}
}

// delete empties a slot, shifting later entries of its probe run back so
// that no tombstones accumulate.
func (s *largeBuckets) delete(hole int) {
	mask := len(s.tab) - 1
	for j := (hole + 1) & mask; s.tab[j].class != 0; j = (j + 1) & mask {
		if (j-s.home(s.tab[j].class))&mask >= (j-hole)&mask {
			s.tab[hole] = s.tab[j]
			hole = j
		}
	}
	s.tab[hole] = bucket{}
	s.used--
}

func (s *largeBuckets) grow() {
	old := s.tab
	size := max(2*len(old), 16)
	s.tab = make([]bucket, size)
	s.shift = tableShift(size)
	mask := size - 1
	for _, bk := range old {
		if bk.class != 0 {
			i := s.home(bk.class)
			for s.tab[i].class != 0 {
				i = (i + 1) & mask
			}
			s.tab[i] = bk
		}
	}
}

// each calls f on every block, by class (the paged classes, then in
// table order) and in heap order within a class, until f returns false.
func (s *largeBuckets) each(f func(*Block) bool) {
	s.eachBucket(func(bk *bucket) bool {
		if len(bk.heap) == 0 {
			return f(bk.first)
		}
		for _, b := range bk.heap {
			if !f(b) {
				return false
			}
		}
		return true
	})
}

// ascendFrom calls f on the blocks of class c and of the classes above
// it, by size and by address within a class, until f returns false; it
// reports whether f never did. A class's heap is read in address order
// through a frontier (ascendHeap), so that a walk that stops after k
// blocks of a class costs O(k log k), however many it holds.
func (s *largeBuckets) ascendFrom(c int, f func(*Block) bool) bool {
	for ; c >= 0; c = s.firstAtLeast(c + 1) {
		bk := s.find(c)
		h := bk.heap
		if len(h) == 0 {
			if !f(bk.first) {
				return false
			}
		} else if !s.ascendHeap(h, f) {
			return false
		}
		if c+1 == largeClasses {
			break
		}
	}
	return true
}

// closeFitAll is closeFit class by class, without the word sums: for a
// limit at or above the largest class's size, where the walk may end at
// the last class and go on through the blocks above 128 MiB, and from a
// class below those the sums count.
func (s *largeBuckets) closeFitAll(c int, limit, below uint64, window int, best *Block) (*Block, int, bool) {
	n := 0
	for c >= 0 {
		size := uint64(c+1) * MinBlockSize
		if size > limit {
			return best, n, true
		}
		bk := s.find(c)
		n += max(1, len(bk.heap))
		if size < below && bk.first.ptr < best.ptr {
			best = bk.first
		}
		if n >= window {
			return best, n, true
		}
		if c+1 == largeClasses {
			break
		}
		c = s.firstAtLeast(c + 1)
	}
	return best, n, limit < maxLargeSize // no class left: the blocks above 128 MiB are larger than a limit below
}

// ascendHeap calls f on the blocks of the heap h in address order until f
// returns false, and reports whether f never did. The frontier is a heap
// by address of the blocks of h whose parents were visited: the lowest is
// the next; visited, it gives way to its children, found by its position
// in h (heapIdx, which the frontier's moves leave alone).
func (s *largeBuckets) ascendHeap(h []*Block, f func(*Block) bool) bool {
	fr := append(s.frontier[:0], h[0])
	defer func() { clear(fr[:cap(fr)]); s.frontier = fr[:0] }()
	for len(fr) > 0 {
		top := fr[0]
		if !f(top) {
			return false
		}
		// Replace the top by its first child, or pop it; then push the
		// second child.
		l, r := 2*int(top.heapIdx)+1, 2*int(top.heapIdx)+2
		if l < len(h) {
			fr[0] = h[l]
		} else {
			last := len(fr) - 1
			fr[0] = fr[last]
			fr = fr[:last]
		}
		if len(fr) > 0 {
			heapDown(fr, 0, false)
		}
		if r < len(h) {
			fr = append(fr, h[r])
			heapUp(fr, len(fr)-1, false)
		}
	}
	return true
}

// DescendBelow calls f on the blocks of classes below class c, from the
// largest down and by address down within a class, until f returns false.
func (s *largeBuckets) descendBelow(c int, f func(*Block) bool) {
	for c = s.lastBelow(c); c >= 0; c = s.lastBelow(c) {
		bk := s.find(c)
		if len(bk.heap) == 0 {
			if !f(bk.first) {
				return
			}
			continue
		}
		h := slices.Clone(bk.heap)
		slices.SortFunc(h, func(x, y *Block) int { return -cmpPtr(x, y) })
		for _, b := range h {
			if !f(b) {
				return
			}
		}
	}
}

func cmpPtr(x, y *Block) int {
	switch {
	case x.ptr < y.ptr:
		return -1
	case x.ptr > y.ptr:
		return 1
	}
	return 0
}

// check verifies the bitmaps, the table and the heaps, and returns a
// description of the first fault found, or "".
func (s *largeBuckets) check() string {
	classes := 0
	if msg := s.checkPages(); msg != "" {
		return msg
	}
	fault := ""
	s.eachBucket(func(bk *bucket) bool {
		classes++
		c := int(bk.class) - 1
		fault = s.checkBucket(c, bk)
		return fault == ""
	})
	if fault != "" {
		return fault
	}
	bitsSet := 0
	for w, word := range s.l0 {
		bitsSet += bits.OnesCount64(word)
		if (word != 0) != (s.l1[w>>6]&(1<<(w&63)) != 0) {
			return "a second-level bit disagrees with its word"
		}
	}
	for w, word := range s.l1 {
		if (word != 0) != (s.l2&(1<<w) != 0) {
			return "a third-level bit disagrees with its word"
		}
	}
	if bitsSet != classes || s.pages == nil && classes != s.used {
		return "the count of classes is wrong"
	}
	if c := s.lastBelow(largeClasses); c > s.top {
		return "a class holds blocks above the bound of the classes"
	}
	return s.checkSums()
}

// checkBucket verifies the bucket of class c: its bit, that a lookup
// finds it, and its blocks; it returns a description of the first fault
// found, or "".
func (s *largeBuckets) checkBucket(c int, bk *bucket) string {
	if w, bit := classBit(c); s.l0[w]&bit == 0 {
		return "a class in the table has no bit"
	}
	if s.bucketOf(c) != bk {
		return "a class is not where a lookup finds it"
	}
	if bk.first == nil || classOf(bk.first.size) != c {
		return "a bucket's first block is of another size"
	}
	if len(bk.heap) == 1 || len(bk.heap) > 0 && bk.heap[0] != bk.first {
		return "a size bucket's heap and its first block disagree"
	}
	for j, b := range bk.heap {
		if b == nil || classOf(b.size) != c {
			return "a block is in the bucket of another size"
		}
		if int(b.heapIdx) != j {
			return "a block's heap position is wrong"
		}
		if j > 0 && bk.heap[(j-1)/2].ptr > b.ptr {
			return "a size bucket is not a heap by address"
		}
	}
	return ""
}
