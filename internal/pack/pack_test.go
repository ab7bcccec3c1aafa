package pack

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"testing"
)

// overlap reports whether items i and j are in use at once and share a
// byte at the offsets given.
func overlap(items []Item, off []uint64, i, j int) bool {
	a, b := &items[i], &items[j]
	if a.Bytes == 0 || b.Bytes == 0 || a.Start >= a.End || b.Start >= b.End {
		return false
	}
	return a.Start < b.End && b.Start < a.End && off[i] < off[j]+b.Bytes && off[j] < off[i]+a.Bytes
}

func TestBestIsValidAndAtLeastTheBound(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for round := range 200 {
		n := 1 + r.IntN(60)
		ops := 2 * n
		items := make([]Item, n)
		for i := range items {
			s := r.IntN(ops)
			items[i] = Item{Start: s, End: s + r.IntN(ops-s+1), Bytes: uint64(r.IntN(8)) * 512}
		}
		bound := peakOf(items, ops)
		for _, parallel := range []bool{false, true} {
			off, fp, order := Best(context.Background(), items, ops, bound, parallel)
			if fp < bound {
				t.Fatalf("round %d: footprint %d below the bound %d", round, fp, bound)
			}
			if order < 0 || order >= len(Orders) {
				t.Fatalf("round %d: order %d", round, order)
			}
			for i := range items {
				if items[i].Bytes > 0 && items[i].Start < items[i].End && off[i]+items[i].Bytes > fp {
					t.Fatalf("round %d: item %d ends at %d above the footprint %d", round, i, off[i]+items[i].Bytes, fp)
				}
				for j := range i {
					if overlap(items, off, i, j) {
						t.Fatalf("round %d: items %d %+v at %d and %d %+v at %d overlap", round, i, items[i], off[i], j, items[j], off[j])
					}
				}
			}
		}
	}
}

// peakOf returns the bound of a packing of items: the most bytes in use
// at one of ops ops.
func peakOf(items []Item, ops int) uint64 {
	var peak uint64
	for t := range ops {
		var live uint64
		for _, it := range items {
			if it.Start <= t && t < it.End {
				live += it.Bytes
			}
		}
		peak = max(peak, live)
	}
	return peak
}

func TestBestReusesFreedMemory(t *testing.T) {
	// Three blocks one after another need the memory of the largest.
	items := []Item{{0, 1, 1024}, {1, 2, 2048}, {2, 3, 512}}
	off, fp, _ := Best(context.Background(), items, 3, 2048, false)
	if fp != 2048 || off[0] != 0 || off[1] != 0 || off[2] != 0 {
		t.Fatalf("footprint %d, offsets %v; want 2048 and all 0", fp, off)
	}
}

func TestBestStopped(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	items := []Item{{0, 1, 1024}}
	if _, fp, _ := Best(ctx, items, 1, 0, false); fp != 0 {
		t.Fatalf("a stopped packing gave footprint %d", fp)
	}
}

// greedyPairs is Greedy as its model states it, with no index: each item
// in turn at the smallest gap (the lowest, under FirstFit) among all the
// placed items that overlap it in time, taken in address order, else
// above them.
func greedyPairs(items []Item, idx []int32, fit Fit) ([]uint64, uint64) {
	offsets := make([]uint64, len(items))
	var placed []int32
	var footprint uint64
	for _, x := range idx {
		b := &items[x]
		if b.Bytes == 0 || b.Start >= b.End {
			continue
		}
		var over []int32
		for _, y := range placed {
			if c := &items[y]; c.Start < b.End && b.Start < c.End {
				over = append(over, y)
			}
		}
		slices.SortStableFunc(over, func(p, q int32) int { return cmp.Compare(offsets[p], offsets[q]) })
		var top uint64
		bestGap, at, found := uint64(math.MaxUint64), uint64(0), false
		for _, y := range over {
			if offsets[y] > top {
				if gap := offsets[y] - top; gap >= b.Bytes && gap < bestGap && !(fit == FirstFit && found) {
					bestGap, at, found = gap, top, true
				}
			}
			top = max(top, offsets[y]+items[y].Bytes)
		}
		if !found {
			at = top
		}
		offsets[x] = at
		footprint = max(footprint, at+b.Bytes)
		placed = append(placed, x)
	}
	return offsets, footprint
}

// TestGreedyAgreesWithPairs holds Greedy's two searches, the index of
// time buckets and the scan in address order, and Greedy's choice between
// them to the packing they stand for: the same offset for every item, in
// every order, on random items (lifetimes short and long, which spread
// over many buckets or few) and on BERT's step.
func TestGreedyAgreesWithPairs(t *testing.T) {
	check := func(name string, items []Item, ops int) {
		t.Helper()
		for k, o := range Orders {
			idx := orderOf(items, o)
			for _, fit := range []Fit{BestFit, FirstFit} {
				want, wantFP := greedyPairs(items, idx, fit)
				for _, g := range []struct {
					name string
					run  func([]uint64, []int32) uint64
				}{
					{"Greedy", func(off []uint64, order []int32) uint64 {
						return Greedy(context.Background(), items, ops, idx, off, fit, order)
					}},
					{"greedyScan", func(off []uint64, order []int32) uint64 {
						return greedyScan(context.Background(), items, idx, off, fit, order)
					}},
					{"greedyBuckets", func(off []uint64, order []int32) uint64 {
						return greedyBuckets(context.Background(), items, ops, idx, off, fit)
					}},
				} {
					got := make([]uint64, len(items))
					var order []int32
					if g.name != "greedyBuckets" {
						order = make([]int32, len(items))
					}
					if fp := g.run(got, order); fp != wantFP || !slices.Equal(got, want) {
						t.Fatalf("%s, order %d, fit %d, %s: footprint %d, want %d; offsets equal: %v", name, k, fit, g.name, fp, wantFP, slices.Equal(got, want))
					}
					if order != nil {
						if err := checkOrder(items, got, order); err != nil {
							t.Fatalf("%s, order %d, fit %d, %s: %v", name, k, fit, g.name, err)
						}
					}
				}
			}
		}
	}
	r := rand.New(rand.NewPCG(3, 4))
	for round := range 300 {
		n := 1 + r.IntN(200)
		ops := 2 * n
		long := 1 + r.IntN(ops) // the longest lifetime of this round
		items := make([]Item, n)
		for i := range items {
			s := r.IntN(ops)
			items[i] = Item{Start: s, End: min(ops, s+r.IntN(long+1)), Bytes: uint64(r.IntN(16)) * 512}
		}
		check(fmt.Sprintf("round %d", round), items, ops)
	}
	items, ops := stepItems(t)
	check("BERT's step", items, ops)
}

// checkOrder checks Greedy's order of items whose offsets are offsets:
// each item once, those that take memory by offset, then the others by
// index.
func checkOrder(items []Item, offsets []uint64, order []int32) error {
	seen := make([]bool, len(items))
	rest := false
	for n, x := range order {
		if x < 0 || int(x) >= len(items) || seen[x] {
			return fmt.Errorf("order[%d] = %d: out of range or listed twice", n, x)
		}
		seen[x] = true
		switch placed := takesMemory(&items[x]); {
		case placed && rest:
			return fmt.Errorf("order[%d] = %d takes memory, after an item that takes none", n, x)
		case placed && n > 0 && offsets[x] < offsets[order[n-1]]:
			return fmt.Errorf("order[%d] = %d at %d, below the item before it, at %d", n, x, offsets[x], offsets[order[n-1]])
		case !placed && rest && x < order[n-1]:
			return fmt.Errorf("order[%d] = %d takes no memory, after %d", n, x, order[n-1])
		case !placed:
			rest = true
		}
	}
	return nil
}

// TestStepPacksToItsPeak holds the package's claim about BERT's step:
// greedy by size packs it to the bound, the most bytes it has in use at
// once, under either fit; and first fit places some of its blocks
// elsewhere than best fit, so that the two are not one rule.
func TestStepPacksToItsPeak(t *testing.T) {
	items, ops := stepItems(t)
	const peak = 1_313_811_968
	if got := peakOf(items, ops); got != peak {
		t.Fatalf("the peak of BERT's step: %d, want %d", got, peak)
	}
	idx := Sorted(items, 0)
	var offs [2][]uint64
	for i, fit := range []Fit{BestFit, FirstFit} {
		offs[i] = make([]uint64, len(items))
		if fp := Greedy(context.Background(), items, ops, idx, offs[i], fit, nil); fp != peak {
			t.Errorf("fit %d: footprint %d, want the peak %d", fit, fp, peak)
		}
	}
	if slices.Equal(offs[0], offs[1]) {
		t.Errorf("first fit placed every block where best fit did")
	}
}

// stepLike returns n items shaped like a training step's blocks, of a
// few sizes: activations allocated one after another in the forward
// pass and freed in the reverse order in the backward pass, each
// backward op's short-lived gradients and temporaries among them, and a
// few blocks in use for the whole step; and the number of ops.
func stepLike(r *rand.Rand, n int) ([]Item, int) {
	sizes := make([]uint64, 1+r.IntN(6))
	for i := range sizes {
		sizes[i] = uint64(1+r.IntN(64)) * 512
	}
	size := func() uint64 { return sizes[r.IntN(len(sizes))] }
	var items []Item
	var forward []int // the activations still held, by start
	t := 0
	for len(items) < n {
		switch k := r.IntN(10); {
		case k < 4 && t < 4*n: // forward: an activation, held
			forward = append(forward, len(items))
			items = append(items, Item{Start: t, End: -1, Bytes: size()})
		case k < 7 && len(forward) > 0: // backward: the last activation freed
			items[forward[len(forward)-1]].End = t + 1
			forward = forward[:len(forward)-1]
		case k < 9: // a temporary of a few ops
			items = append(items, Item{Start: t, End: t + 1 + r.IntN(4), Bytes: size()})
		default: // a block for the whole step
			items = append(items, Item{Start: 0, End: -2, Bytes: size()})
		}
		t += 1 + r.IntN(2)
	}
	ops := t + 8
	for i := range items {
		switch items[i].End {
		case -1: // an activation never freed: freed at the end, in reverse
			items[i].End = ops - 1 - i%4
		case -2:
			items[i].End = ops
		}
		items[i].End = min(items[i].End, ops)
	}
	return items, ops
}

// scanRound returns the items of a round of the scan's tests, up to
// most of them, and their ops: step-like items in even rounds, random
// items of a few sizes in odd ones.
func scanRound(r *rand.Rand, round, most int) ([]Item, int) {
	if round%2 == 0 {
		return stepLike(r, 1+r.IntN(most))
	}
	n := 1 + r.IntN(most)
	ops := 1 + r.IntN(3*n)
	items := make([]Item, n)
	for i := range items {
		s := r.IntN(ops)
		items[i] = Item{Start: s, End: min(ops, s+1+r.IntN(1+r.IntN(ops))), Bytes: uint64(1+r.IntN(3)) * 512}
	}
	return items, ops
}

// TestGreedyScanAgreesOnSteps holds greedyScan, whose chunks settle the
// running top without reading their items one by one where no gap can
// start at them, to the packing as its model states it (greedyPairs):
// the same offset for every item, in every order, on step-like items of
// a few sizes (most of them in use at once, the scan's case), and on
// random items of a few sizes, many of the same size placed at the same
// top, whose supports are often out of use.
func TestGreedyScanAgreesOnSteps(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	for round := range 200 {
		items, ops := scanRound(r, round, 300)
		for k, o := range Orders {
			idx := orderOf(items, o)
			for _, fit := range []Fit{BestFit, FirstFit} {
				want, wantFP := greedyPairs(items, idx, fit)
				got, order := make([]uint64, len(items)), make([]int32, len(items))
				if fp := greedyScan(context.Background(), items, idx, got, fit, order); fp != wantFP || !slices.Equal(got, want) {
					for i := range got {
						if got[i] != want[i] {
							t.Fatalf("round %d (%d items, %d ops), order %d, fit %d: item %d %+v at %d, want %d; footprint %d, want %d",
								round, len(items), ops, k, fit, i, items[i], got[i], want[i], fp, wantFP)
						}
					}
					t.Fatalf("round %d, order %d, fit %d: footprint %d, want %d", round, k, fit, fp, wantFP)
				}
				if err := checkOrder(items, got, order); err != nil {
					t.Fatalf("round %d, order %d, fit %d: %v", round, k, fit, err)
				}
			}
		}
	}
}

// TestGreedyScansTrainingSteps holds Greedy's choice of search to what
// it is for: BERT's step, most of whose blocks are in use at once, is
// read in address order; items whose lifetimes are short beside the
// trace go through the index.
func TestGreedyScansTrainingSteps(t *testing.T) {
	items, ops := stepItems(t)
	if !scanCheaper(items, ops) {
		t.Errorf("BERT's step (%d items) goes through the index", len(items))
	}
	short := make([]Item, 20000)
	for i := range short {
		short[i] = Item{Start: i, End: i + 1 + i%7, Bytes: 512}
	}
	if scanCheaper(short, len(short)+8) {
		t.Errorf("%d items of short lifetimes are read in address order", len(short))
	}
	if strconv.IntSize == 64 {
		// Lifetimes past 2^32 - 1 ops, which the scan's packed lifetimes
		// do not hold, go through the index.
		end := uint64(math.MaxUint32) + 1
		if huge := []Item{{Start: 0, End: int(end), Bytes: 512}}; scanCheaper(huge, int(end)) {
			t.Errorf("an item in use up to op %d is read in address order", end)
		}
	}
}

// TestSortedFollowsOrders holds Sorted to each order's Less, ties by
// index, on random items with many ties in each key, whose keys fit in
// 64 bits and, one round in four, do not.
func TestSortedFollowsOrders(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	for round := range 100 {
		items := make([]Item, 1+r.IntN(300))
		for i := range items {
			s := r.IntN(20)
			items[i] = Item{Start: s, End: s + r.IntN(8), Bytes: uint64(r.IntN(6)) * 512}
			if round%4 == 2 {
				items[i].End = s - r.IntN(4) // no memory, sorted all the same
			}
			if round%4 == 3 {
				// Sizes whose keys take more than 64 bits with the
				// rest: sorted by comparisons.
				items[i].Bytes = uint64(r.IntN(6)) << 58
			}
		}
		for k, o := range Orders {
			want := make([]int32, len(items))
			for i := range want {
				want[i] = int32(i)
			}
			slices.SortFunc(want, func(x, y int32) int { return cmp.Or(o.Less(&items[x], &items[y]), cmp.Compare(x, y)) })
			if got := Sorted(items, k); !slices.Equal(got, want) {
				t.Fatalf("order %d (%s): %v, want %v", k, o.Name, got, want)
			}
		}
	}
}

// orderOf returns the indices of items in the order o places them, ties
// by index, sorted here by o's Less alone: the tests' own account of an
// order, apart from Sorted's.
func orderOf(items []Item, o Order) []int32 {
	idx := make([]int32, len(items))
	for i := range idx {
		idx[i] = int32(i)
	}
	slices.SortFunc(idx, func(x, y int32) int { return cmp.Or(o.Less(&items[x], &items[y]), cmp.Compare(x, y)) })
	return idx
}
