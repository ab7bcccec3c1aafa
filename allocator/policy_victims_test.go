package allocator

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/gpumem/gpumem/allocator/internal/freeindex"
	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/internal/simtest"
)

// TestReclaimChoosesAsTheSortedListDoes checks reclaim's victim choice
// (smallestSufficient, firstInOrder) against the whole list sorted by
// candidateBefore, on random lists with many equal page counts: the block
// that suffices alone is the last of the sorted list with at least want
// pages, and the first n are the sorted list's first n, in its order.
func TestReclaimChoosesAsTheSortedListDoes(t *testing.T) {
	r := rand.New(rand.NewPCG(26, 2))
	var x freeindex.Index // the candidates' blocks: each the one block of a segment of its own
	x.Init(0, new(freeindex.Spares), 0, freeindex.NewPool(false, false), freeindex.KindLarge)
	for range 2000 {
		k := r.IntN(40)
		list := make([]candidate, k)
		for i := range list {
			list[i] = candidate{x.NewSegment(device.Ptr(r.IntN(1000)*512+i), 512, 0), uint64(1+r.IntN(6)) << 21}
		}
		sorted := slices.Clone(list)
		slices.SortFunc(sorted, func(x, y candidate) int {
			if candidateBefore(x, y) {
				return -1
			}
			return 1
		})
		want := uint64(r.IntN(8)) << 21
		wantAlone := -1
		for i, c := range sorted {
			if c.pages >= want {
				wantAlone = i
			}
		}
		if i := smallestSufficient(list, want); (i < 0) != (wantAlone < 0) || i >= 0 && list[i] != sorted[wantAlone] {
			t.Fatalf("smallestSufficient(%v, %d) = %d, sorted %v: want its %d", list, want, i, sorted, wantAlone)
		}
		n := 1 + r.IntN(max(k, 1))
		if n > k {
			continue
		}
		if got := firstInOrder(slices.Clone(list), n); !slices.Equal(got, sorted[:n]) {
			t.Fatalf("firstInOrder(%v, %d) = %v, want %v", list, n, got, sorted[:n])
		}
	}
}

// TestReclaimBoundedChoosesAsTheWholeWalk checks that a bounded reclaim,
// whose two walks stop early (boundedCandidatesLocked), chooses the same
// victims in the same order as the choice from every candidate, found by
// walking every free block of a page or more: on random states of the
// low_fragmentation policy's free indexes (free blocks of many sizes,
// some freed too recently to go), for every unmapped range as the range
// about to be mapped and for wants from 512 bytes to beyond every block.
func TestReclaimBoundedChoosesAsTheWholeWalk(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		cfg, err := ParseConf("gpumem_policy:low_fragmentation")
		require.NoError(t, err)
		cfg.LowFrag.MinAge = rapid.IntRange(1, 10).Draw(t, "minAge")
		cfg.LowFrag.Victims = rapid.IntRange(1, 4).Draw(t, "victims")
		a, _ := newOn(t, cfg, simtest.Capacity(64*gib))
		var live []device.Ptr
		for range rapid.IntRange(1, 300).Draw(t, "ops") {
			if len(live) > 0 && rapid.Bool().Draw(t, "free") {
				i := rapid.IntRange(0, len(live)-1).Draw(t, "victim")
				require.NoError(t, a.Free(live[i]))
				live = slices.Delete(live, i, i+1)
				continue
			}
			size := uint64(512) << rapid.IntRange(11, 18).Draw(t, "shift")
			size += uint64(rapid.IntRange(0, 4).Draw(t, "odd")) * size / 4
			p, err := a.Alloc(size, 0)
			require.NoError(t, err)
			live = append(live, p)
		}
		a.lockAll()
		defer a.unlockAll()
		for k := range a.def.free {
			x := &a.def.free[k]
			var keeps []*freeindex.Block
			x.Pool().EachUnmapped(func(u *freeindex.Block) bool {
				keeps = append(keeps, u)
				return true
			})
			for _, keep := range keeps {
				for _, want := range []uint64{512, 1 << 20, 2 << 20, 3 << 20, 20 << 20, 21 << 20, 45 << 20, 100 << 20, 1 << 40} {
					got := slices.Clone(a.victimsLocked(x, want, keep, true))
					a.clearCandidates()
					if all := a.pol.candidates[:cap(a.pol.candidates)]; slices.ContainsFunc(all, func(c candidate) bool { return c.b != nil }) {
						t.Fatalf("pool %d, want %d: the cleared candidates still hold a block", k, want)
					}
					if w := wholeWalkVictims(a, x, want, keep); !slices.Equal(got, w) {
						t.Fatalf("pool %d, want %d beside %v: the bounded walks chose %v, every candidate gives %v", k, want, keep.Ptr(), got, w)
					}
				}
			}
		}
	})
}

// wholeWalkVictims is a bounded reclaim's choice from every candidate:
// every free block of x of a page or more, not beside keep, freed at
// least minAge searches ago, with whole pages.
func wholeWalkVictims(a *Allocator, x *freeindex.Index, want uint64, keep *freeindex.Block) []candidate {
	var list []candidate
	p := x.Pool()
	x.AscendAtLeast(keep.Seg().Page(), func(b *freeindex.Block) bool {
		if b != keep.Prev() && b != keep.Next() && p.GCCalls-b.GCCountBase() >= a.pol.minAge {
			if n := wholePages(b); n > 0 {
				list = append(list, candidate{b, n})
			}
		}
		return true
	})
	return chooseVictims(list, want, a.pol.victims, true)
}

// TestPagesBounds checks minPages and maxPages against pagesAt at every
// offset a block can have (a multiple of 512 within a page): each bounds
// the whole pages of every offset, and some offset has each.
func TestPagesBounds(t *testing.T) {
	for _, page := range []uint64{4 << 10, 20 << 10, 256 << 10} {
		for size := uint64(512); size <= 5*page; size += 512 {
			lo, hi := minPages(size, page), maxPages(size, page)
			seenLo, seenHi := false, false
			for off := uint64(0); off < page; off += 512 {
				n := pagesAt(off, size, page)
				if n < lo || n > hi {
					t.Fatalf("page %d, size %d at %d: %d bytes of whole pages, outside [%d, %d]", page, size, off, n, lo, hi)
				}
				seenLo, seenHi = seenLo || n == lo, seenHi || n == hi
			}
			if !seenLo || !seenHi {
				t.Fatalf("page %d, size %d: no offset has %d (seen: %v) or %d (seen: %v)", page, size, lo, seenLo, hi, seenHi)
			}
		}
	}
}
