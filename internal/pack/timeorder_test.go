package pack

import (
	"cmp"
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/gpumem/gpumem/trace"
)

// timeOrderModel is TimeOrder as its comment states it, written the
// plain way: the free gaps in a list by offset, each search reading all
// of them, the events found by scanning every item at every op.
func timeOrderModel(items []Item) ([]uint64, uint64) {
	off := make([]uint64, len(items))
	type span struct{ off, size uint64 }
	var free []span // by offset, none touching another
	var top uint64
	last := 0
	for i := range items {
		last = max(last, items[i].End)
	}
	for t := 0; t <= last; t++ {
		for i := range items {
			if b := &items[i]; takesMemory(b) && b.End == t {
				free = append(free, span{off[i], b.Bytes})
				slices.SortFunc(free, func(x, y span) int { return cmp.Compare(x.off, y.off) })
				for k := 0; k+1 < len(free); {
					if free[k].off+free[k].size == free[k+1].off {
						free[k].size += free[k+1].size
						free = slices.Delete(free, k+1, k+2)
						continue
					}
					k++
				}
			}
		}
		for i := range items {
			b := &items[i]
			if !takesMemory(b) || b.Start != t {
				continue
			}
			best := -1
			for k, s := range free {
				if s.size >= b.Bytes && (best < 0 || s.size < free[best].size) {
					best = k
				}
			}
			switch {
			case best >= 0:
				off[i] = free[best].off
				free[best].off += b.Bytes
				free[best].size -= b.Bytes
				if free[best].size == 0 {
					free = slices.Delete(free, best, best+1)
				}
			case len(free) > 0 && free[len(free)-1].off+free[len(free)-1].size == top:
				off[i] = free[len(free)-1].off
				free = free[:len(free)-1]
				top = off[i] + b.Bytes
			default:
				off[i] = top
				top += b.Bytes
			}
		}
	}
	return off, top
}

// checkPacked checks a packing: no two items in use at once share a
// byte, each ends within the footprint, and the footprint is at least
// the peak of bytes in use (and is the highest end, where some item
// takes memory).
func checkPacked(items []Item, ops int, off []uint64, fp uint64) error {
	var high uint64
	for i := range items {
		if !takesMemory(&items[i]) {
			continue
		}
		high = max(high, off[i]+items[i].Bytes)
		for j := range i {
			if overlap(items, off, i, j) {
				return fmt.Errorf("items %d %+v at %d and %d %+v at %d overlap", i, items[i], off[i], j, items[j], off[j])
			}
		}
	}
	if high != fp {
		return fmt.Errorf("footprint %d, but the highest item ends at %d", fp, high)
	}
	if peak := peakOf(items, ops); fp < peak {
		return fmt.Errorf("footprint %d below the peak %d", fp, peak)
	}
	return nil
}

// TestTimeOrderAgreesWithItsModel holds TimeOrder to its model
// (timeOrderModel): the same offset for every item and the same
// footprint, on step-like items and on random ones, many of which end
// where others start, with its gaps in slices and in its tree
// (gapSlicesMax); the packing valid, and its order by offset.
func TestTimeOrderAgreesWithItsModel(t *testing.T) {
	r := rand.New(rand.NewPCG(21, 22))
	for round := range 300 {
		items, ops := scanRound(r, round, 200)
		want, wantFP := timeOrderModel(items)
		// The gaps in slices throughout, and moved to the tree past a
		// few, at once or as they grow.
		for _, most := range []int{gapSlicesMax, 0, round % 7} {
			restore := setGapSlicesMax(most)
			got, order := make([]uint64, len(items)), make([]int32, len(items))
			for i := range got {
				got[i] = 1 // TimeOrder writes every offset
			}
			fp := TimeOrder(items, got, order)
			restore()
			if fp != wantFP || !slices.Equal(got, want) {
				t.Fatalf("round %d (%d items), at most %d gaps in slices: footprint %d, want %d; offsets %v, want %v", round, len(items), most, fp, wantFP, got, want)
			}
			if err := checkPacked(items, ops, got, fp); err != nil {
				t.Fatalf("round %d, at most %d gaps in slices: %v", round, most, err)
			}
			if err := checkOrder(items, got, order); err != nil {
				t.Fatalf("round %d, at most %d gaps in slices: %v", round, most, err)
			}
		}
	}
	if fp := TimeOrder(nil, nil, nil); fp != 0 {
		t.Fatalf("no items: footprint %d", fp)
	}
}

// setGapSlicesMax sets gapSlicesMax to n and returns a function that
// restores it.
func setGapSlicesMax(n int) func() {
	old := gapSlicesMax
	gapSlicesMax = n
	return func() { gapSlicesMax = old }
}

// TestTimeOrderReusesAFreedGap: a gap given back is taken again by the
// smallest item that fits it, before the top grows; a gap at the top is
// grown rather than left below a new block.
func TestTimeOrderReusesAFreedGap(t *testing.T) {
	items := []Item{
		{Start: 0, End: 2, Bytes: 2048}, // [0, 2048), freed at 2
		{Start: 1, End: 9, Bytes: 512},  // [2048, 2560)
		{Start: 2, End: 9, Bytes: 1024}, // into the freed gap, at 0
		{Start: 3, End: 9, Bytes: 4096}, // the top: 2560
		{Start: 4, End: 9, Bytes: 1024}, // the rest of the gap: 1024
	}
	off := make([]uint64, len(items))
	fp := TimeOrder(items, off, nil)
	if want := []uint64{0, 2048, 0, 2560, 1024}; !slices.Equal(off, want) || fp != 6656 {
		t.Fatalf("offsets %v footprint %d, want %v and 6656", off, fp, want)
	}
	grown := []Item{
		{Start: 0, End: 9, Bytes: 512},  // [0, 512)
		{Start: 0, End: 1, Bytes: 1024}, // [512, 1536), freed at 1: the gap at the top
		{Start: 1, End: 9, Bytes: 2048}, // the gap at the top, grown: 512
	}
	off = make([]uint64, len(grown))
	if fp := TimeOrder(grown, off, nil); off[2] != 512 || fp != 2560 {
		t.Fatalf("offsets %v footprint %d, want the third at 512 and 2560", off, fp)
	}
}

// TestTimeOrderPacksBERTsSteps holds TimeOrder's comment's figures:
// BERT's steps at batches 2, 4 and 8, packed in time order, take at most
// 0.52 % more than their peaks of bytes in use; greedy by size comes
// within 0.09 %.
func TestTimeOrderPacksBERTsSteps(t *testing.T) {
	for _, b := range []int{2, 4, 8} {
		ops, err := trace.ReadFile(fmt.Sprintf("../../trace/replay/testdata/bert_b%d.trace.gz", b))
		if err != nil {
			t.Fatal(err)
		}
		items, n := stepOf(ops, 1)
		peak := peakOf(items, n)
		off := make([]uint64, len(items))
		fp := TimeOrder(items, off, nil)
		if err := checkPacked(items, n, off, fp); err != nil {
			t.Fatalf("batch %d: %v", b, err)
		}
		gfp := Greedy(context.Background(), items, n, Sorted(items, 0), off, FirstFit, nil)
		t.Logf("batch %d: %d items, peak %d, in time order %d (%.3f %%), by size %d (%.3f %%)", b, len(items), peak,
			fp, 100*(float64(fp)/float64(peak)-1), gfp, 100*(float64(gfp)/float64(peak)-1))
		if float64(fp) > 1.0052*float64(peak) {
			t.Errorf("batch %d: in time order %d, more than 0.52 %% above the peak %d", b, fp, peak)
		}
		if float64(gfp) > 1.0009*float64(peak) {
			t.Errorf("batch %d: by size %d, more than 0.09 %% above the peak %d", b, gfp, peak)
		}
	}
}

// stepOf returns the blocks that step k of ops (from 0, counted by their
// marks) allocates and frees within the step, as the allocator's planned
// policy packs them (sizes rounded up to 512 bytes), and the step's
// number of operations.
func stepOf(ops []trace.Op, k int) ([]Item, int) {
	marks, t := 0, 0
	start := map[uint64]int{}
	size := map[uint64]uint64{}
	var items []Item
	for _, op := range ops {
		if op.Kind == trace.Mark {
			marks++
			continue
		}
		if marks != k+1 {
			continue
		}
		switch op.Kind {
		case trace.Alloc:
			start[op.ID], size[op.ID] = t, op.Size
		case trace.Free:
			if s, ok := start[op.ID]; ok {
				items = append(items, Item{Start: s, End: t, Bytes: (size[op.ID] + 511) / 512 * 512})
			}
		}
		t++
	}
	return items, t
}

// TestWithinKeepsToTheBudget: within the budget Within packs as Greedy
// does, by size; past it, in time order; an empty list packs to 0.
func TestWithinKeepsToTheBudget(t *testing.T) {
	r := rand.New(rand.NewPCG(13, 14))
	for round := range 100 {
		items, ops := scanRound(r, round, 200)
		n, read, _ := scanReads(items, ops)
		cost := min(n*n, scanCosts*read) / 2
		want := make([]uint64, len(items))
		wantFP := Greedy(context.Background(), items, ops, Sorted(items, 0), want, FirstFit, nil)
		got, order := make([]uint64, len(items)), make([]int32, len(items))
		fp, bySize := Within(items, ops, got, FirstFit, order, cost)
		if !bySize || fp != wantFP || !slices.Equal(got, want) {
			t.Fatalf("round %d, budget %d = the model's cost: by size %v, footprint %d, want Greedy's %d", round, cost, bySize, fp, wantFP)
		}
		if err := checkOrder(items, got, order); err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		wantT, wantTFP := timeOrderModel(items)
		fp, bySize = Within(items, ops, got, FirstFit, order, cost-1)
		if bySize || fp != wantTFP || !slices.Equal(got, wantT) {
			t.Fatalf("round %d, budget %d: by size %v, footprint %d, want in time order, %d", round, cost-1, bySize, fp, wantTFP)
		}
	}
	if fp, bySize := Within(nil, 0, nil, FirstFit, nil, 0); fp != 0 || !bySize {
		t.Fatalf("no items: %d, %v", fp, bySize)
	}
}

// TestSortBy holds sortBy to a comparison sort by key, then index, on
// indices in and out of order, keys with ties, narrow and wide, some
// alike in their low bits, and lists short (a comparison sort of
// numbers) and long (by radix), and keys too wide to share a number
// with the index (a comparison sort).
func TestSortBy(t *testing.T) {
	r := rand.New(rand.NewPCG(31, 32))
	for round := range 400 {
		n := r.IntN(300)
		width := []uint{1, 8, 13, 40, 56, 64}[round%6]
		keys := make([]uint64, 512)
		for i := range keys {
			keys[i] = r.Uint64() >> (64 - width)
			if round%4 == 1 {
				keys[i] = keys[i]<<9 + 1000 // low bits alike in every key, as offsets of whole 512 bytes
			}
		}
		idx := r.Perm(512)[:n]
		if round%3 == 0 {
			slices.Sort(idx) // indices in order, as TimeOrder's ends are
		}
		got := make([]int32, n)
		for i, x := range idx {
			got[i] = int32(x)
		}
		want := slices.Clone(got)
		slices.SortFunc(want, func(x, y int32) int { return cmp.Or(cmp.Compare(keys[x], keys[y]), cmp.Compare(x, y)) })
		sortBy(got, keys)
		if !slices.Equal(got, want) {
			t.Fatalf("round %d (%d indices, keys of %d bits): %v, want %v", round, n, width, got, want)
		}
	}
}

// TestPeak holds Peak to the plain count (peakOf) on step-like and
// random items, many ending where others start, and on BERT's step; items
// outside [0, ops] count for nothing.
func TestPeak(t *testing.T) {
	r := rand.New(rand.NewPCG(41, 42))
	for round := range 300 {
		items, ops := scanRound(r, round, 200)
		if got, want := Peak(items, ops), peakOf(items, ops); got != want {
			t.Fatalf("round %d (%d items): %d, want %d", round, len(items), got, want)
		}
	}
	items, n := stepItems(t)
	if got := Peak(items, n); got != 1_313_811_968 {
		t.Fatalf("BERT's step: %d, want its peak 1,313,811,968", got)
	}
	out := []Item{{Start: -1, End: 2, Bytes: 512}, {Start: 0, End: 9, Bytes: 1024}, {Start: 0, End: 1, Bytes: 2048}}
	if got := Peak(out, 4); got != 2048 {
		t.Fatalf("items outside [0, 4]: %d, want 2048", got)
	}
	if Peak(nil, 0) != 0 || Peak(out, -1) != 0 {
		t.Fatal("no ops: a peak")
	}
}
