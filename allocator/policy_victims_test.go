package allocator

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/gpumem/gpumem/allocator/internal/freeindex"
	"github.com/gpumem/gpumem/device"
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
