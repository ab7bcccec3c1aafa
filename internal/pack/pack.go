// Package pack assigns offsets to blocks whose lifetimes are known in
// advance, so that no two blocks in use at the same time share a byte:
// the greedy packing shared by the offline planner (trace/plan/offline)
// and the allocator's planned policy.
//
// # Model
//
// An Item is in use during [Start, End) (op indices, half open: an item
// ending at op i and one starting at op i may share memory) and occupies
// Bytes. Greedy places items one by one in a given order, each in a gap
// between the already placed items that overlap it in time that holds
// it, or else above them all ("greedy by size", Pisarchyk and Lee,
// 2020, where the gap is the smallest that holds it). The placed items
// that overlap an item in time are found through buckets of time, each
// holding the placed items that touch it in address order, so a pass
// costs about the number of pairs of items in use at the same time
// rather than n^2; or, where most pairs are in use at once (a training
// step's blocks), by reading the placed items in address order, in
// chunks that are skipped whole where no item of theirs is in use in
// the item's time, and settled from their highest top down where no gap
// can start in them (each placed item keeps the lifetime of the item it
// was placed on), which costs less then.
//
// A pass takes, among the gaps that hold an item, the smallest (BestFit,
// the classic rule; the lowest of those on a tie) or the lowest
// (FirstFit), whose search stops at the first it finds. On a training
// step greedy by size packs to the bound either way (BERT's step:
// 1,313,811,968 bytes, the most it has in use at once), and first fit
// reads less: more than half of the step's blocks land in a gap, and a
// best fit reads on past the first gap to the end.
//
// TimeOrder packs in another way: in the order the items come into use,
// each in the smallest free gap that holds it, as an allocator that knew
// no lifetime would, in O(n log n) whatever the lifetimes, and a little
// looser (the allocator's planned policy packs a step the program marks
// so first: BERT's step in about a quarter of first fit's instructions).
// Within packs by size unless Greedy's model of its reads (which grow as
// the square of the items in use at once) passes a budget, and in time
// order then: a caller that packs while others wait bounds the wait so.
//
// Orders lists the passes tried: greedy by size first; sizes grouped in
// classes (powers of 4 by start, powers of 2 by lifetime) and lifetime
// first pack items of random sizes and lifetimes tighter. Best runs the
// first order and, unless it meets a lower bound no packing can beat,
// the others, and keeps the smallest footprint (the earliest order on a
// tie, so the answer does not depend on the schedule).
//
// The package prints nothing and starts goroutines only when Best is
// asked to run the passes in parallel.
package pack

import (
	"cmp"
	"context"
	"math"
	"math/bits"
	"runtime"
	"slices"
	"sync"
)

// An Item is one block to place: in use during [Start, End), Bytes long.
// Items with Bytes 0 or Start >= End take no memory and get offset 0.
type Item struct {
	Start, End int
	Bytes      uint64
}

// A Fit is the gap a greedy pass takes among those that hold an item.
type Fit uint8

const (
	// BestFit takes the smallest gap that holds the item, the lowest of
	// those on a tie (greedy by size's rule).
	BestFit Fit = iota
	// FirstFit takes the lowest gap that holds the item.
	FirstFit
)

// An Order is one greedy pass: Less sorts items into the order they are
// placed in (negative when a goes first).
type Order struct {
	Name string
	Less func(a, b *Item) int
}

// Orders are the passes Best tries, the classic greedy by size first.
var Orders = []Order{
	{"size", func(a, b *Item) int {
		return cmp.Or(cmp.Compare(b.Bytes, a.Bytes), cmp.Compare(b.End-b.Start, a.End-a.Start), cmp.Compare(a.Start, b.Start))
	}},
	{"size class x4, start", func(a, b *Item) int {
		return cmp.Or(cmp.Compare(bits.Len64(b.Bytes)/2, bits.Len64(a.Bytes)/2), cmp.Compare(a.Start, b.Start), cmp.Compare(b.Bytes, a.Bytes))
	}},
	{"size class x2, lifetime", func(a, b *Item) int {
		return cmp.Or(cmp.Compare(bits.Len64(b.Bytes), bits.Len64(a.Bytes)), cmp.Compare(b.End-b.Start, a.End-a.Start), cmp.Compare(a.Start, b.Start))
	}},
	{"lifetime", func(a, b *Item) int {
		return cmp.Or(cmp.Compare(b.End-b.Start, a.End-a.Start), cmp.Compare(b.Bytes, a.Bytes), cmp.Compare(a.Start, b.Start))
	}},
}

// Best packs items, whose Start and End are in [0, ops] and whose Bytes
// sum to at most 2^64 - 1 (so that no offset overflows), by first fit:
// it runs the first of Orders; unless that footprint is at most bound,
// it runs the others (at once on the available CPUs when parallel is
// set) and keeps the smallest footprint. (By first fit, the best of the
// four passes packed every trace of the project as tight as by best fit
// or tighter: random_mixed 1.024 times its bound against 1.034,
// random_mixed_2000 1.0000003 against 1.004, eor_cnn its bound against
// 1.00001; the others their bound either way.) It returns an offset per
// item, the footprint (the highest end of an item) and the index in
// Orders of the pass that gave it. A done ctx stops every pass early
// (checked every 1024 items placed); the result is then meaningless and
// the caller discards it.
func Best(ctx context.Context, items []Item, ops int, bound uint64, parallel bool) (offsets []uint64, footprint uint64, order int) {
	if len(items) == 0 {
		return nil, 0, 0
	}
	fps := make([]uint64, len(Orders))
	offs := make([][]uint64, len(Orders))
	pass := func(k int) {
		if ctx.Err() != nil {
			return
		}
		idx := Sorted(items, k)
		offs[k] = make([]uint64, len(items))
		fps[k] = Greedy(ctx, items, ops, idx, offs[k], FirstFit, nil)
	}
	pass(0)
	n := 1
	if fps[0] > bound && ctx.Err() == nil {
		n = len(Orders)
		if parallel {
			var wg sync.WaitGroup
			sem := make(chan struct{}, runtime.GOMAXPROCS(0))
			for k := 1; k < n; k++ {
				wg.Go(func() {
					sem <- struct{}{}
					defer func() { <-sem }()
					pass(k)
				})
			}
			wg.Wait()
		} else {
			for k := 1; k < n; k++ {
				pass(k)
			}
		}
	}
	if ctx.Err() != nil {
		return offs[0], 0, 0
	}
	best := 0
	for k := 1; k < n; k++ {
		if fps[k] < fps[best] {
			best = k
		}
	}
	return offs[best], fps[best], best
}

// Sorted returns the indices of items in the order Orders[k] places them,
// ties by index. The first order, by size, which the allocator's planned
// policy uses alone, sorts keys that hold the whole comparison
// (sortedBySize) where they fit in 64 bits, else compares directly (a
// third of the instructions of its Less, which evaluates every key,
// through a function value).
func Sorted(items []Item, k int) []int32 {
	idx := make([]int32, len(items))
	for i := range idx {
		idx[i] = int32(i)
	}
	if k != 0 {
		slices.SortFunc(idx, func(x, y int32) int {
			return cmp.Or(Orders[k].Less(&items[x], &items[y]), cmp.Compare(x, y))
		})
		return idx
	}
	if sortedBySize(items, idx) {
		return idx
	}
	slices.SortFunc(idx, func(x, y int32) int {
		a, b := &items[x], &items[y]
		switch {
		case a.Bytes != b.Bytes:
			return cmp.Compare(b.Bytes, a.Bytes)
		case a.End-a.Start != b.End-b.Start:
			return cmp.Compare(b.End-b.Start, a.End-a.Start)
		case a.Start != b.Start:
			return cmp.Compare(a.Start, b.Start)
		}
		return cmp.Compare(x, y)
	})
	return idx
}

// sortedBySize sorts idx (0 to len(items)-1) in the first order, ties
// by index, and reports true, when each item's keys fit in one 64-bit
// number that sorts as they do: the size below the largest, the
// lifetime below the longest, the start above the earliest and the
// index, each in as many bits as its range needs (BERT's step: 59). A
// sort of numbers compares without calls. It reports false, leaving
// idx as it was, when the keys take more bits.
func sortedBySize(items []Item, idx []int32) bool {
	if len(items) == 0 {
		return true
	}
	minB, maxB := items[0].Bytes, items[0].Bytes
	minL, maxL := items[0].End-items[0].Start, items[0].End-items[0].Start
	minS, maxS := items[0].Start, items[0].Start
	for i := range items {
		b := &items[i]
		minB, maxB = min(minB, b.Bytes), max(maxB, b.Bytes)
		minL, maxL = min(minL, b.End-b.Start), max(maxL, b.End-b.Start)
		minS, maxS = min(minS, b.Start), max(maxS, b.Start)
	}
	wi := bits.Len64(uint64(len(items) - 1))
	ws := bits.Len64(uint64(maxS) - uint64(minS))
	wl := bits.Len64(uint64(maxL) - uint64(minL))
	if bits.Len64(maxB-minB)+wl+ws+wi > 64 {
		return false
	}
	keys := make([]uint64, len(items))
	for i := range items {
		b := &items[i]
		keys[i] = (maxB-b.Bytes)<<(wl+ws+wi) | (uint64(maxL)-uint64(b.End-b.Start))<<(ws+wi) |
			(uint64(b.Start)-uint64(minS))<<wi | uint64(i)
	}
	slices.Sort(keys)
	for i, k := range keys {
		idx[i] = int32(k & (1<<wi - 1))
	}
	return true
}

// Greedy places the items in the order idx (a permutation of their
// indices), each at the gap that fit chooses among the placed items that
// overlap it in time (else above them all), writes their offsets in
// offsets (it reads the items only) and returns the footprint.
//
// It finds the placed items that overlap an item in one of two ways,
// which place every item alike: by reading the placed items in address
// order (greedyScan), or through an index of time buckets
// (greedyBuckets), whichever reads fewer: the first reads at most n^2/2
// items in all, each cheaply (a chunk of 16 whose items are all out of
// use in the item's time is skipped whole, and most of the others are
// settled by the first of their items, from the highest top down, in
// use then); the second about the items of the buckets that each item's
// lifetime touches, at about 4 times the cost each (its lists are
// merged). On a training step, where most blocks are in use at once
// (BERT's 1,004 blocks: 195,781 of 503,506 pairs overlap; the scan looks
// at 48,606 chunks, skips 17,371, settles 7,684 by their item of the
// highest top and 19,223 by 40,800 items read from the highest top down,
// and reads 4,328 item by item), the scan costs about an eighth of the
// index's 29.9 M instructions; on a trace of 10^5 blocks whose lifetimes are short
// beside it, the index reads a sliver of the n^2.
//
// If order is not nil, it must have len(items) entries: Greedy lists in
// it the items by offset, those that take memory from the lowest offset
// up (items at one offset, never in use at once, in no given order),
// then the others by index. The scan holds the placed items in that
// order at its end, so it costs no sort there (the allocator's planned
// policy walks a step's blocks by offset to find the block below each).
//
// It stops early, leaving the rest unplaced (and order meaningless), once
// ctx is done (checked every 1024 items).
func Greedy(ctx context.Context, items []Item, ops int, idx []int32, offsets []uint64, fit Fit, order []int32) uint64 {
	if len(items) == 0 {
		return 0
	}
	return greedy(ctx, items, ops, idx, offsets, fit, order, scanCheaper(items, ops))
}

// greedy is Greedy, by the scan (greedyScan) if scan, else through the
// buckets of time (greedyBuckets).
func greedy(ctx context.Context, items []Item, ops int, idx []int32, offsets []uint64, fit Fit, order []int32, scan bool) uint64 {
	if scan {
		return greedyScan(ctx, items, idx, offsets, fit, order)
	}
	fp := greedyBuckets(ctx, items, ops, idx, offsets, fit)
	if order != nil {
		n := 0
		for i := range items {
			if takesMemory(&items[i]) {
				order[n] = int32(i)
				n++
			}
		}
		slices.SortFunc(order[:n], func(x, y int32) int {
			return cmp.Or(cmp.Compare(offsets[x], offsets[y]), cmp.Compare(x, y))
		})
		listUnplaced(items, order[n:])
	}
	return fp
}

// takesMemory reports whether b is placed: it has bytes and a lifetime.
func takesMemory(b *Item) bool {
	return b.Bytes > 0 && b.Start < b.End
}

// Peak returns the most bytes that items take at once (no packing
// takes less), for items whose Start and End are in [0, ops]: by the
// changes of the bytes in use at each op, in O(n + ops). An item that
// takes no memory, or lies outside [0, ops], counts for nothing.
func Peak(items []Item, ops int) uint64 {
	if ops <= 0 {
		return 0
	}
	delta := make([]int64, ops+1)
	for i := range items {
		if b := &items[i]; takesMemory(b) && b.Start >= 0 && b.End <= ops {
			delta[b.Start] += int64(b.Bytes)
			delta[b.End] -= int64(b.Bytes)
		}
	}
	var live, peak int64
	for _, d := range delta {
		live += d
		peak = max(peak, live)
	}
	return uint64(peak)
}

// listUnplaced writes in rest the indices of the items that take no
// memory, in order: the tail of Greedy's order.
func listUnplaced(items []Item, rest []int32) {
	n := 0
	for i := range items {
		if !takesMemory(&items[i]) && n < len(rest) {
			rest[n] = int32(i)
			n++
		}
	}
}

// scanCosts is how many items greedyBuckets reads for the cost of one
// that greedyScan reads (callgrind on BERT's step: 29.9 M instructions
// for 405,692 items read through the index, 7.2 M for 503,506 read in
// address order, about 74 and 14 each, before greedyScan skipped chunks
// (5.7 M since, then 5.05 M skipping too the chunks that their item of
// the highest top settles, 3.96 M settling the chunks where no gap can
// start); 4 rather than 5 leaves to the index the cases near the line,
// where it reads less memory).
const scanCosts = 4

// scanCheaper reports whether greedyScan reads the items for less than
// greedyBuckets would: n^2/2 items against, for each item, half of the
// items that touch the buckets it touches (the placed half, on average).
// Ops past 2^32 - 1, which greedyScan's packed lifetimes do not hold,
// take the index.
func scanCheaper(items []Item, ops int) bool {
	scan, _ := searchCost(items, ops)
	return scan
}

// searchCost returns whether greedyScan is the cheaper search
// (scanCheaper) and the reads of the cheaper, in items read in address
// order: n^2/2 for the scan, half the buckets' model at scanCosts each
// for the index.
func searchCost(items []Item, ops int) (scan bool, cost int) {
	n, read, ok := scanReads(items, ops)
	if ok && n*n < scanCosts*read {
		return true, n * n / 2
	}
	return false, scanCosts * read / 2
}

// scanReads returns the number n of items that take memory and the reads
// of greedyBuckets' model: for each, the items that touch the buckets it
// touches, summed; ok is false where an item's ops lie outside [0,
// 2^32 - 1].
func scanReads(items []Item, ops int) (n, read int, ok bool) {
	w, nb := bucketWidth(items, ops)
	touch := make([]int, nb+1) // items touching each bucket, as differences
	bucket := func(t int) int { return min(t/w, nb-1) }
	for i := range items {
		if b := &items[i]; takesMemory(b) {
			if b.Start < 0 || uint64(b.End) > math.MaxUint32 {
				return 0, 0, false
			}
			touch[bucket(b.Start)]++
			touch[bucket(b.End-1)+1]--
			n++
		}
	}
	// Summed over the items, the items touching each bucket they touch
	// are each bucket's count times itself.
	for k, d := 0, 0; k < nb; k++ {
		d += touch[k]
		read += d * d
	}
	return n, read, true
}

// bucketWidth returns greedyBuckets' width of a bucket of time (the mean
// lifetime, at least 1) and the number of buckets, for items whose Start
// and End are in [0, ops].
func bucketWidth(items []Item, ops int) (w, nb int) {
	var sum int
	for i := range items {
		sum += max(0, items[i].End-items[i].Start)
	}
	w = max(1, sum/max(1, len(items)))
	return w, ops/w + 1
}

// greedyBuckets is Greedy through an index of time buckets: bucket k
// holds, in address order, every placed item in use at some op in [k*w,
// (k+1)*w), with its lifetime and place, so that a search reads memory
// in order. An item is looked up in the buckets its lifetime touches;
// one found in several of them is taken from the first only (the bucket
// of the later of the two starts). w is the mean lifetime, so that an
// item touches about two buckets and a bucket holds about the items live
// at once. The items found in each bucket are in address order, and are
// merged into those of the buckets before it.
func greedyBuckets(ctx context.Context, items []Item, ops int, idx []int32, offsets []uint64, fit Fit) uint64 {
	type entry struct {
		start, end int32
		off, top   uint64
	}
	w, nb := bucketWidth(items, ops)
	buckets := make([][]entry, nb)
	bucketOf := func(t int) int { return min(t/w, len(buckets)-1) }
	type used struct{ off, top uint64 }
	var cand, merged []used
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
		start, end := int32(b.Start), int32(b.End)
		first, last := bucketOf(b.Start), bucketOf(b.End-1)
		// Each bucket's items, in address order, merged into cand.
		cand = cand[:0]
		for k := first; k <= last; k++ {
			n := len(cand)
			from := int32(k * w) // an item starting before is taken from an earlier bucket
			if k == first {
				from = math.MinInt32
			}
			for _, c := range buckets[k] {
				if start < c.end && c.start < end && c.start >= from {
					cand = append(cand, used{c.off, c.top})
				}
			}
			if n == 0 || n == len(cand) {
				continue
			}
			merged = merged[:0]
			i, j := 0, n
			for i < n && j < len(cand) {
				if cand[i].off <= cand[j].off {
					merged = append(merged, cand[i])
					i++
				} else {
					merged = append(merged, cand[j])
					j++
				}
			}
			merged = append(append(merged, cand[i:n]...), cand[j:]...)
			cand, merged = merged, cand
		}
		// The smallest gap that holds the item (the lowest, under
		// FirstFit), else the top.
		var top uint64
		bestGap, at := uint64(math.MaxUint64), uint64(0)
		found := false
		for _, c := range cand {
			if c.off > top {
				if gap := c.off - top; gap >= b.Bytes && gap < bestGap {
					bestGap, at, found = gap, top, true
					if fit == FirstFit {
						break
					}
				}
			}
			top = max(top, c.top)
		}
		if !found {
			at = top
		}
		offsets[x] = at
		footprint = max(footprint, at+b.Bytes)
		e := entry{start, end, at, at + b.Bytes}
		for k := first; k <= last; k++ {
			list := buckets[k]
			i, _ := slices.BinarySearchFunc(list, at, func(c entry, at uint64) int { return cmp.Compare(c.off, at) })
			buckets[k] = slices.Insert(list, i, e)
		}
	}
	return footprint
}
