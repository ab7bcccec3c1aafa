package freeindex

import (
	"math/bits"
	"slices"
	"testing"

	"pgregory.net/rapid"

	"github.com/gpumem/gpumem/device"
)

// closeFitWalk is the close fit as it was before the word sums: every
// non-empty class from c up to the last within limit, one table lookup
// each. TestCloseFitAsTheWalk holds closeFit to its answers.
func closeFitWalk(s *largeBuckets, c int, limit, below uint64, window int, best *Block) (*Block, int, bool) {
	top := int(min(limit/MinBlockSize, largeClasses)) - 1 // the last class within limit
	if top == largeClasses-1 {
		return s.closeFitAll(c, limit, below, window, best)
	}
	n := 0
	for c >= 0 && c <= top {
		bk := s.find(c)
		n += max(1, len(bk.heap))
		if uint64(c+1)*MinBlockSize < below && bk.first.ptr < best.ptr {
			best = bk.first
		}
		if n >= window {
			break
		}
		w := c >> 6
		m := s.l0[w] & (^uint64(1) << (c & 63)) // the classes above c in its word
		for m == 0 {
			w1 := w >> 6
			if m1 := s.l1[w1] & (^uint64(1) << (w & 63)); m1 != 0 {
				w = w1<<6 | bits.TrailingZeros64(m1)
			} else if m2 := s.l2 & (^uint64(1) << w1); m2 != 0 {
				w1 = bits.TrailingZeros64(m2)
				w = w1<<6 | bits.TrailingZeros64(s.l1[w1])
			} else {
				return best, n, true // no class above c
			}
			if w<<6 > top {
				return best, n, true
			}
			m = s.l0[w]
		}
		c = w<<6 | bits.TrailingZeros64(m)
	}
	return best, n, true
}

// TestCloseFitAsTheWalk runs random inserts, removes and splits (a
// pending split, settled by the next change) on a free index with large
// buckets, blocks of sizes that spread over many words of the bitmap, and
// asks a close fit between changes: closeFit, with its word sums, must
// return the block, the count and the ending of the walk over every class
// (closeFitWalk), and the index's check (the word sums' counts and lowest
// blocks included) must pass after each change. It fails if a word read
// from its sums gives another block than its classes would.
func TestCloseFitAsTheWalk(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		p := &Pool{idx: 1}
		seg := testSeg(p, SmallBuffer) // expandable: no list of whole segments
		var x Index
		x.Init(0, new(Spares), 0, p, KindLarge)
		if rapid.Bool().Draw(t, "direct") {
			x.KeepPages() // classes in pages, not the table
		}
		// Classes from base up over spread classes: 64 classes a word, so
		// a spread of thousands covers many words, some whole.
		base := rapid.IntRange(1, 1<<14).Draw(t, "base")
		spread := rapid.SampledFrom([]int{8, 64, 300, 3000, 30000}).Draw(t, "spread")
		size := func(label string) uint64 {
			return uint64(base+rapid.IntRange(0, spread).Draw(t, label)) * MinBlockSize
		}
		var live []*Block
		next := device.Ptr(0)
		fail := func(format string, args ...any) { t.Fatalf(format, args...) }
		for i, n := 0, rapid.IntRange(1, 300).Draw(t, "ops"); i < n; i++ {
			switch op := rapid.IntRange(0, 9).Draw(t, "op"); {
			case op < 5 || len(live) == 0:
				// Addresses 4 GiB apart in a random order: a split's rest
				// moves up by less than that and stays unique.
				next++
				ptr := device.Ptr(rapid.IntRange(0, 1<<20).Draw(t, "ptr"))<<44 | next<<32
				b := onSeg(&Block{ptr: ptr, size: size("size"), pool: p}, seg)
				x.Insert(b)
				live = append(live, b)
			case op < 8:
				j := rapid.IntRange(0, len(live)-1).Draw(t, "victim")
				x.Remove(live[j])
				live = slices.Delete(live, j, j+1)
			default:
				b := live[rapid.IntRange(0, len(live)-1).Draw(t, "split")]
				if x.pend != nil {
					x.settle() // as every fit does before a take
				}
				if b.size > MinBlockSize {
					f := x.Take(b, uint64(rapid.IntRange(1, int(b.size/MinBlockSize)-1).Draw(t, "front"))*MinBlockSize, true)
					f.Allocated = true // handed out: the check wants the front busy
				}
			}
			x.Check(fail)
			if rapid.IntRange(0, 2).Draw(t, "ask") != 0 {
				continue
			}
			from := size("from")
			may := x.MayFit(from) // before Fit settles a pending split
			first := x.Fit(from)
			if first != nil && !may {
				t.Fatalf("MayFit(%d): false, where %v fits", from, KeyOf(first))
			}
			if first == nil || !x.inLarge(first.size) {
				continue
			}
			limit := first.size + first.size/8
			if rapid.Bool().Draw(t, "any limit") {
				limit = first.size + uint64(rapid.IntRange(0, 4*spread).Draw(t, "slack"))*MinBlockSize
			}
			below := ^uint64(0)
			if rapid.Bool().Draw(t, "max split") {
				below = size("below")
			}
			window := rapid.IntRange(1, 40).Draw(t, "window")
			c := classOf(first.size)
			start := first // or another block of its class: the walk starts from any
			if h := x.large.find(c).heap; len(h) > 1 && rapid.Bool().Draw(t, "not the first") {
				start = h[len(h)-1]
			}
			wb, wn, wd := closeFitWalk(x.large, c, limit, below, window, start)
			gb, gn, gd := x.large.closeFit(c, limit, below, window, start)
			if gb != wb || gn != wn || gd != wd {
				t.Fatalf("closeFit(%v, limit %d, below %d, window %d) = %v, %d, %v; the walk: %v, %d, %v",
					KeyOf(start), limit, below, window, KeyOf(gb), gn, gd, KeyOf(wb), wn, wd)
			}
			// FitClose: the fit and then the close fit, in one call.
			shift := uint(rapid.IntRange(0, 6).Draw(t, "shift"))
			if got, want := x.FitClose(from, shift, below, window), x.CloseFit(first, first.size+first.size>>shift, below, window); got != want {
				t.Fatalf("FitClose(%d, shift %d, below %d, window %d) = %v; Fit and CloseFit: %v", from, shift, below, window, KeyOf(got), KeyOf(want))
			}
			x.Check(fail)
		}
	})
}

// TestEmptyWordsKeepTheirPages follows the pages of a paged index as
// words empty: a word of classes up to 2 MiB keeps its page, zero, and
// has it again when it fills; a larger word gives its page to the spares,
// and the next word to need one takes it. Both by remove and by a
// settle's move, with the index's check after each step.
func TestEmptyWordsKeepTheirPages(t *testing.T) {
	p := &Pool{idx: 1}
	seg := testSeg(p, SmallBuffer)
	var x Index
	x.Init(0, new(Spares), 0, p, KindLarge)
	x.KeepPages()
	s := x.large
	check := func(step string) {
		t.Helper()
		x.Check(func(format string, args ...any) { t.Fatalf(step+": "+format, args...) })
	}
	small, large := 64*1024, 8*1024*1024 // words 1 and 256
	ws, wl := classOf(uint64(small))>>6, classOf(uint64(large))>>6
	b := onSeg(&Block{ptr: 1 << 32, size: uint64(small), pool: p}, seg)
	x.Insert(b)
	kept := s.pages[ws]
	x.Remove(b)
	check("a small block removed")
	if s.pages[ws] != kept || kept == nil {
		t.Fatalf("a word of small classes let its page go when it emptied")
	}
	x.Insert(b)
	if s.pages[ws] != kept {
		t.Fatalf("a word of small classes took another page when it filled again")
	}
	x.Remove(b)
	c := onSeg(&Block{ptr: 2 << 32, size: uint64(large), pool: p}, seg)
	x.Insert(c)
	given := s.pages[wl]
	x.Remove(c)
	check("a large block removed")
	if s.pages[wl] != nil || len(s.spareP) != 1 || s.spareP[0] != given {
		t.Fatalf("a word of large classes kept its page when it emptied (spares %d)", len(s.spareP))
	}
	// A settle's move from a large word to another: the old word's page
	// serves the new one, and none goes to the spares.
	x.Insert(c)
	f := x.Take(c, uint64(large/2), true) // c's rest, 4 MiB, pends under 8 MiB's key
	f.Allocated = true
	x.Flush() // the move, word 256 to word 128
	check("a large block's rest settled")
	if w := classOf(uint64(large/2)) >> 6; s.pages[w] == nil || s.pages[wl] != nil || len(s.spareP) != 0 {
		t.Fatalf("after a move from a large word: page of the new word %v, of the old %v, spares %d",
			s.pages[w] != nil, s.pages[wl] != nil, len(s.spareP))
	}
}
