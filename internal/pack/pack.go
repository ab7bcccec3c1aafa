// Package pack assigns offsets to blocks whose lifetimes are known in
// advance, so that no two blocks in use at the same time share a byte:
// the greedy packing shared by the offline planner (trace/plan/offline)
// and the allocator's planned policy.
//
// # Model
//
// An Item is in use during [Start, End) (op indices, half open: an item
// ending at op i and one starting at op i may share memory) and occupies
// Bytes. Greedy places items one by one in a given order, each at the
// best-fitting gap: the smallest hole between the already placed items
// that overlap it in time that holds it, or else above them all ("greedy
// by size", Pisarchyk and Lee, 2020). The placed items that overlap an
// item in time are found through buckets of time, each holding the
// placed items that touch it in address order, so a pass costs about the
// number of pairs of items in use at the same time rather than n^2; or,
// where most pairs are in use at once (a training step's blocks), by
// reading the placed items in address order, in chunks that are skipped
// whole where no item of theirs is in use in the item's time, and
// settled from their highest top down where no gap can start in them
// (each placed item keeps the lifetime of the item it was placed on),
// which costs less then.
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
// sum to at most 2^64 - 1 (so that no offset overflows): it runs the
// first of Orders; unless that footprint is at most bound, it runs the
// others (at once on the available CPUs when parallel is set) and keeps
// the smallest footprint. It returns an offset per item, the footprint
// (the highest end of an item) and the index in Orders of the pass that
// gave it. A done ctx stops every pass early (checked every 1024 items
// placed); the result is then meaningless and the caller discards it.
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
		fps[k] = Greedy(ctx, items, ops, idx, offs[k])
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
// indices), each at the best-fitting gap among the placed items that
// overlap it in time, writes their offsets in offsets (it reads the items
// only) and returns the footprint.
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
// It stops early, leaving the rest unplaced, once ctx is done (checked
// every 1024 items).
func Greedy(ctx context.Context, items []Item, ops int, idx []int32, offsets []uint64) uint64 {
	if len(items) == 0 {
		return 0
	}
	if scanCheaper(items, ops) {
		return greedyScan(ctx, items, idx, offsets)
	}
	return greedyBuckets(ctx, items, ops, idx, offsets)
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
	w, nb := bucketWidth(items, ops)
	touch := make([]int, nb+1) // items touching each bucket, as differences
	var n int
	bucket := func(t int) int { return min(t/w, nb-1) }
	for i := range items {
		if b := &items[i]; b.Bytes > 0 && b.Start < b.End {
			if b.Start < 0 || uint64(b.End) > math.MaxUint32 {
				return false
			}
			touch[bucket(b.Start)]++
			touch[bucket(b.End-1)+1]--
			n++
		}
	}
	prefix := make([]int, nb+1) // prefix[k]: items touching buckets 0..k-1, summed
	for k, d := 0, 0; k < nb; k++ {
		d += touch[k]
		prefix[k+1] = prefix[k] + d
	}
	var read int
	for i := range items {
		if b := &items[i]; b.Bytes > 0 && b.Start < b.End {
			read += prefix[bucket(b.End-1)+1] - prefix[bucket(b.Start)]
		}
	}
	return n*n < scanCosts*read
}

// bucketWidth returns greedyBuckets' width of a bucket of time (the mean
// lifetime) and the number of buckets, for items whose Start and End are
// in [0, ops].
func bucketWidth(items []Item, ops int) (w, nb int) {
	var sum int
	for i := range items {
		sum += max(0, items[i].End-items[i].Start)
	}
	w = max(1, sum/len(items))
	return w, ops/w + 1
}

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
func greedyScan(ctx context.Context, items []Item, idx []int32, offsets []uint64) uint64 {
	var last uint32
	for i := range items {
		if b := &items[i]; b.Bytes > 0 && b.Start < b.End {
			last = max(last, uint32(b.End))
		}
	}
	s := scanLists{shift: uint(max(0, bits.Len32(last)-6))}
	var footprint uint64
	for n, x := range idx {
		if n&1023 == 1023 && ctx.Err() != nil {
			break
		}
		b := &items[x]
		offsets[x] = 0
		if b.Bytes == 0 || b.Start >= b.End {
			continue
		}
		at, sup := s.fit(uint32(b.Start), uint32(b.End), b.Bytes)
		offsets[x] = at
		footprint = max(footprint, at+b.Bytes)
		s.insert(uint32(b.Start), uint32(b.End), at, at+b.Bytes, sup)
	}
	return footprint
}

// scanChunk is the most placed items a chunk of scanLists holds (at most
// 16: the bits of scanRun.weak, the 4-bit positions of its byTop): the
// fewer, the more chunks are skipped whole and the more are looked at.
const scanChunk = 16

// scanLists are the placed items of greedyScan in address order, in
// chunks: the i-th of a chunk in use during [starts[i], ends[i]) at the
// bytes [offs[i], tops[i]), its support in use during sups[i]; a chunk's
// times has bit k set where one of its items is in use at some op t with
// t>>shift == k (shift makes the last op's k less than 64).
type scanLists struct {
	chunks []*scanRun
	shift  uint
}

// scanRun is one chunk of scanLists: byTop lists its items' positions
// from the highest top down (the first on a tie), 4 bits each from the
// lowest; weak has bit i set where item i's support is out of use at
// some op of its lifetime, and exposed the bits of the times of those
// ops.
type scanRun struct {
	times      uint64
	exposed    uint64
	n          int
	weak       uint16
	byTop      uint64
	starts     [scanChunk]uint32
	ends       [scanChunk]uint32
	offs, tops [scanChunk]uint64
	sups       [scanChunk][2]uint32
}

// times returns the bits of the 64ths of the ops that [start, end)
// touches.
func (s *scanLists) times(start, end uint32) uint64 {
	a, b := start>>s.shift, (end-1)>>s.shift
	return ^uint64(0) >> (63 - (b - a)) << a
}

// insert adds an item in use during [start, end) at [off, top), whose
// support is in use during sup, after the items below off and before
// those at or above it.
func (s *scanLists) insert(start, end uint32, off, top uint64, sup [2]uint32) {
	// The chunk of the first item at or above off, else the last.
	c := len(s.chunks) - 1
	for lo, hi := 0, len(s.chunks); lo < hi; {
		m := int(uint(lo+hi) >> 1)
		if r := s.chunks[m]; r.offs[r.n-1] >= off {
			c, hi = m, m
		} else {
			lo = m + 1
		}
	}
	if c < 0 {
		s.chunks = append(s.chunks, &scanRun{})
		c = 0
	}
	r := s.chunks[c]
	i, _ := slices.BinarySearch(r.offs[:r.n], off)
	if r.n == scanChunk {
		// Split the chunk in two halves, and insert into the one that
		// holds the place.
		h := scanChunk / 2
		q := &scanRun{n: scanChunk - h}
		copy(q.starts[:], r.starts[h:])
		copy(q.ends[:], r.ends[h:])
		copy(q.offs[:], r.offs[h:])
		copy(q.tops[:], r.tops[h:])
		copy(q.sups[:], r.sups[h:])
		q.weak = r.weak >> h
		r.n = h
		r.weak &= 1<<h - 1
		r.times, q.times = s.timesOf(r), s.timesOf(q)
		r.exposed, q.exposed = s.exposedOf(r), s.exposedOf(q)
		r.rank()
		q.rank()
		s.chunks = slices.Insert(s.chunks, c+1, q)
		if i > h {
			r, i = q, i-h
		}
	}
	copy(r.starts[i+1:r.n+1], r.starts[i:r.n])
	copy(r.ends[i+1:r.n+1], r.ends[i:r.n])
	copy(r.offs[i+1:r.n+1], r.offs[i:r.n])
	copy(r.tops[i+1:r.n+1], r.tops[i:r.n])
	copy(r.sups[i+1:r.n+1], r.sups[i:r.n])
	r.starts[i], r.ends[i], r.offs[i], r.tops[i], r.sups[i] = start, end, off, top, sup
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
		if r.tops[by>>(4*m)&15] >= top {
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

// rank sets r.byTop: positions from the highest top down, the first on
// a tie.
func (r *scanRun) rank() {
	var by [scanChunk]uint8
	for i := range r.n {
		k := i
		for ; k > 0 && r.tops[by[k-1]] < r.tops[i]; k-- {
			by[k] = by[k-1]
		}
		by[k] = uint8(i)
	}
	r.byTop = 0
	for k, i := range by[:r.n] {
		r.byTop |= uint64(i) << (4 * k)
	}
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
		t |= s.exposed(r.starts[i], r.ends[i], r.sups[i])
	}
	return t
}

// timesOf returns the bits of the times of r's items.
func (s *scanLists) timesOf(r *scanRun) uint64 {
	var t uint64
	for i := range r.n {
		t |= s.times(r.starts[i], r.ends[i])
	}
	return t
}

// fit returns the offset for an item of bytes in use during [start,
// end), among the placed items: the smallest gap between those in use
// at some op of [start, end) that holds it, the lowest of those on a
// tie, else above them all; and the lifetime of the placed item whose
// top it is (the whole of time at 0). A gap of exactly bytes is the
// smallest there can be, and the lowest such is the first found: the
// search stops there.
func (s *scanLists) fit(start, end uint32, bytes uint64) (uint64, [2]uint32) {
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
		if h := r.byTop & 15; r.offs[h] < top+bytes {
			if r.tops[h] <= top {
				continue
			}
			if r.starts[h] < end && r.ends[h] > start {
				top, sup = r.tops[h], [2]uint32{r.starts[h], r.ends[h]}
				continue
			}
		}
		// A gap may start only at a weak item in use during [start,
		// end) whose support is not, which can be only where r's
		// exposed times meet the item's.
		if r.exposed&want != 0 {
			for u := r.weak; u != 0; u &= u - 1 {
				i := bits.TrailingZeros16(u)
				if (r.sups[i][0] >= end || r.sups[i][1] <= start) && r.starts[i] < end && r.ends[i] > start {
					goto read
				}
			}
		}
		// None: the running top rises to the highest top of r's items
		// in use during [start, end), if above it.
		for by, k := r.byTop, r.n; k > 0; by, k = by>>4, k-1 {
			i := by & 15
			if r.tops[i] <= top {
				break
			}
			if r.starts[i] < end && r.ends[i] > start {
				top, sup = r.tops[i], [2]uint32{r.starts[i], r.ends[i]}
				break
			}
		}
		continue
	read:
		starts, ends, offs, tops := r.starts[:r.n], r.ends[:r.n], r.offs[:r.n], r.tops[:r.n]
		for i, st := range starts {
			if st >= end || ends[i] <= start {
				continue
			}
			if o := offs[i]; o >= top+bytes && best.better(o-top-bytes, top, sup) {
				return top, sup
			}
			if tops[i] > top {
				top, sup = tops[i], [2]uint32{st, ends[i]}
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

// greedyBuckets is Greedy through an index of time buckets: bucket k
// holds, in address order, every placed item in use at some op in [k*w,
// (k+1)*w), with its lifetime and place, so that a search reads memory
// in order. An item is looked up in the buckets its lifetime touches;
// one found in several of them is taken from the first only (the bucket
// of the later of the two starts). w is the mean lifetime, so that an
// item touches about two buckets and a bucket holds about the items live
// at once. The items found in each bucket are in address order, and are
// merged into those of the buckets before it.
func greedyBuckets(ctx context.Context, items []Item, ops int, idx []int32, offsets []uint64) uint64 {
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
		if b.Bytes == 0 || b.Start >= b.End {
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
		// The best fit: the smallest gap that holds the item, else the
		// top.
		var top uint64
		bestGap, at := uint64(math.MaxUint64), uint64(0)
		found := false
		for _, c := range cand {
			if c.off > top {
				if gap := c.off - top; gap >= b.Bytes && gap < bestGap {
					bestGap, at, found = gap, top, true
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
