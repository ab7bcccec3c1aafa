// This file holds the close fit of large buckets (the low_fragmentation
// policy's fit, Index.CloseFit): the lowest address among the blocks
// within a size limit, found a word of the bitmap at a time. Each word of
// l0 (64 classes) has the number of blocks of its classes and the block
// of the lowest address among them (wordSums), so that a word the walk
// covers whole costs one entry's loads instead of a table lookup per
// class.

package freeindex

import (
	"math/bits"

	"github.com/gpumem/gpumem/device"
)

// sumsFrom is the first class that the word sums count: a close fit is
// for requests of more than 1 MiB, so that it reads no word of smaller
// classes, and the small blocks that come and go most are not counted.
// A word below it is read class by class.
const sumsFrom = 1 << 20 / MinBlockSize

// wordSums holds, for each word of a largeBuckets' l0 from sumsFrom's,
// the number of blocks of its 64 classes and the block of the lowest
// address among them, with that address, in one entry (one cache line
// for the three; the address spares the walk a load of each word's
// lowest block). A largeBuckets gets them at its first close fit
// (summarize) and keeps them from then on: insert, remove and move keep
// the counts and lower the lowest block in O(1) (for the classes from
// sumsAt: none before the sums exist); removing the lowest block forgets
// it (nil), and the next close fit that reads the word finds it again.
//
// Invariants (checked by checkSums): below sumsFrom's word m[w] is zero;
// from it, m[w].cnt is the number of blocks of the classes of word w;
// m[w].low is nil or the block of the lowest address among them, and nil
// when m[w].cnt is 0; m[w].ptr is m[w].low's address when m[w].low is
// not nil; largeBuckets.sumsAt is sumsFrom once the sums exist.
type wordSums [largeWords]wordSum

// A wordSum is the entry of one word of l0 in wordSums.
type wordSum struct {
	low *Block
	ptr device.Ptr // low's
	cnt uint32
}

// added counts b, just filed in a class of word w.
func (m *wordSums) added(w int, b *Block) {
	e := &m[w&(largeWords-1)] // no bounds check
	if e.cnt == 0 || e.low != nil && b.ptr < e.ptr {
		e.low, e.ptr = b, b.ptr
	}
	e.cnt++
}

// removed uncounts b, just taken out of a class of word w.
func (m *wordSums) removed(w int, b *Block) {
	e := &m[w&(largeWords-1)] // no bounds check
	e.cnt--
	if e.low == b {
		e.low = nil // found again when a close fit needs it
	}
}

// summarize gives s its word sums, counted from its classes.
func (s *largeBuckets) summarize() {
	m := new(wordSums)
	s.eachBucket(func(bk *bucket) bool {
		if int(bk.class-1) >= sumsFrom {
			m[(bk.class-1)>>6].cnt += uint32(max(1, len(bk.heap)))
		}
		return true
	})
	s.sums, s.sumsAt = m, sumsFrom
}

// findLow finds the lowest block among the classes of word w, which holds
// blocks, when its sums forgot it: it remembers it in the sums and
// returns its address and it.
func (s *largeBuckets) findLow(w int) (device.Ptr, *Block) {
	var low *Block
	for m := s.l0[w&(largeWords-1)]; m != 0; m &= m - 1 {
		if f := s.find(w<<6 | bits.TrailingZeros64(m)).first; low == nil || f.ptr < low.ptr {
			low = f
		}
	}
	s.sums[w&(largeWords-1)] = wordSum{low: low, ptr: low.ptr, cnt: s.sums[w&(largeWords-1)].cnt}
	return low.ptr, low
}

// closeFit is the policy's close fit over the classes from c up: it
// visits the lowest address of each class in order, counting the
// class's blocks, while the class's size is at most limit and fewer than
// window blocks were counted, and returns the block of the lowest address
// visited whose size is below below, or best if none is lower; the
// blocks counted; and whether the walk ended here (a size above limit,
// or the window full) rather than at the last class.
//
// It reads the classes of c's word one by one, then the non-empty words
// above it (found through l1 and l2) up to the last class within limit:
// a word whose classes are all within limit and below below, and whose
// blocks leave the window unfilled, is read from its sums (its count and
// its lowest block), as visiting its classes one by one would end; any
// other word is read class by class. When limit is below the largest
// class's size, ending there when no class is left is ending at the last
// class: the caller's walk on, through the blocks above 128 MiB, would
// stop at the first of them, which is larger than limit.
func (s *largeBuckets) closeFit(c int, limit, below uint64, window int, best *Block) (*Block, int, bool) {
	top := int(min(limit/MinBlockSize, largeClasses)) - 1 // the last class within limit
	if top == largeClasses-1 || c < sumsFrom {
		return s.closeFitAll(c, limit, below, window, best) // class by class: the sums count no word below sumsFrom's
	}
	if s.sums == nil {
		s.summarize()
	}
	// The words up to topW hold classes within limit; those up to wholeW
	// only classes within limit and below below ((c+1) * 512 < below):
	// those its sums may cover.
	whole := top
	if below <= uint64(top+1)*MinBlockSize {
		whole = int((below+MinBlockSize-1)/MinBlockSize) - 2
	}
	topW, wholeW := top>>6, (whole+1)>>6-1
	n, full, w := 0, false, c>>6
	if k := int(s.sums[w&(largeWords-1)].cnt); w <= wholeW && k < window && s.l0[w]&(1<<(c&63)-1) == 0 {
		n = k // c's word holds no class below c: its sums are those of the classes from c
		e := &s.sums[w&(largeWords-1)]
		p, l := e.ptr, e.low
		if l == nil {
			p, l = s.findLow(w)
		}
		if p < best.ptr {
			best = l
		}
	} else if best, n, full = s.closeFitWord(w, c, top, below, window, best, n); full {
		return best, n, true
	}
	sums, bp := s.sums, best.ptr
	// The non-empty words above w, a word of l1 at a time: ws holds the
	// bits of those of l1's word w1 not read yet.
	w1 := w >> 6
	ws := s.l1[w1] & (^uint64(1) << (w & 63))
	for {
		for ws == 0 {
			m2 := s.l2 & (^uint64(1) << w1)
			if m2 == 0 {
				return best, n, true // no class above
			}
			w1 = bits.TrailingZeros64(m2)
			ws = s.l1[w1]
		}
		w = (w1<<6 | bits.TrailingZeros64(ws)) & (largeWords - 1)
		ws &= ws - 1
		if w > topW {
			return best, n, true
		}
		if w <= wholeW {
			if e := &sums[w]; n+int(e.cnt) < window {
				n += int(e.cnt)
				p, l := e.ptr, e.low
				if l == nil {
					p, l = s.findLow(w)
				}
				if p < bp {
					best, bp = l, p
				}
				continue
			}
		}
		if best, n, full = s.closeFitWord(w, w<<6, top, below, window, best, n); full {
			return best, n, true
		}
		bp = best.ptr
	}
}

// noneAboveWord reports whether no class of the words of l0 above w, up
// to top's, holds blocks: from the first word of l0 with classes above
// w; when that word is top's, it reports false.
func (s *largeBuckets) noneAboveWord(w, top int) bool {
	w1 := w >> 6 & (largeWords/64 - 1)
	if m := s.l1[w1] & (^uint64(1) << (w & 63)); m != 0 {
		return w1<<6|bits.TrailingZeros64(m) > top>>6
	}
	m := s.l2 & (^uint64(1) << w1)
	if m == 0 {
		return true // no class above w
	}
	w1 = bits.TrailingZeros64(m)
	return w1<<6|bits.TrailingZeros64(s.l1[w1]) > top>>6
}

// closeFitWord is closeFit's walk of the classes from c to the end of
// word w or to top, one by one, with n blocks counted before: it returns
// the best block, the blocks counted and whether the window filled.
func (s *largeBuckets) closeFitWord(w, c, top int, below uint64, window int, best *Block, n int) (*Block, int, bool) {
	m := s.l0[w] & (^uint64(0) << (c & 63))
	if top < w<<6|63 {
		m &= ^uint64(0) >> (63 - top&63)
	}
	for ; m != 0; m &= m - 1 {
		c = w<<6 | bits.TrailingZeros64(m)
		bk := s.find(c)
		n += max(1, len(bk.heap))
		if uint64(c+1)*MinBlockSize < below && bk.first.ptr < best.ptr {
			best = bk.first
		}
		if n >= window {
			return best, n, true
		}
	}
	return best, n, false
}

// checkSums verifies the word sums, if s has them, and returns a
// description of the first fault found, or "".
func (s *largeBuckets) checkSums() string {
	m := s.sums
	if (m == nil && s.sumsAt != largeClasses) || (m != nil && s.sumsAt != sumsFrom) {
		return "the first class the word sums count is wrong"
	}
	if m == nil {
		return ""
	}
	var cnt [largeWords]uint32
	var low [largeWords]*Block
	s.eachBucket(func(bk *bucket) bool {
		if int(bk.class-1) < sumsFrom {
			return true // not counted: its entry stays zero
		}
		w := (bk.class - 1) >> 6
		cnt[w] += uint32(max(1, len(bk.heap)))
		if low[w] == nil || bk.first.ptr < low[w].ptr {
			low[w] = bk.first
		}
		return true
	})
	for w := range cnt {
		e := &m[w]
		if e.cnt != cnt[w] {
			return "a word's count of blocks is wrong"
		}
		if e.low != nil && (e.low != low[w] || e.ptr != e.low.ptr) {
			return "a word's lowest block is not the lowest of its classes, or not at its address"
		}
	}
	return ""
}
