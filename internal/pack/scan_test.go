package pack

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"math/bits"
	"math/rand/v2"
	"slices"
	"testing"
)

// checkLists checks scanLists' invariants after items placed (in s)
// at offsets: the items in address order across chunks of 1 to
// scanChunk each, each with its lifetime and place; byTop of each chunk
// its positions by top, highest first; weak and the times exactly as
// its items say; and every item's support the lifetime of a placed item
// in use with it whose top is the item's offset (the whole of time at
// offset 0).
func checkLists(s *scanLists, items []Item, offsets []uint64) error {
	var last uint64
	tops := map[uint64][][2]uint32{} // top: the lifetimes of the items placed up to it
	for _, r := range s.chunks {
		for _, it := range r.items[:r.n] {
			tops[it.top] = append(tops[it.top], [2]uint32{it.start, it.end})
		}
	}
	for c, r := range s.chunks {
		if r.n < 1 || r.n > scanChunk {
			return fmt.Errorf("chunk %d holds %d items", c, r.n)
		}
		var weak uint16
		var times, exposed uint64
		seen := 0
		prevTop := uint64(math.MaxUint64)
		for k := range r.n {
			p := int(r.byTop >> (4 * k) & 15)
			if p >= r.n || seen&(1<<p) != 0 {
				return fmt.Errorf("chunk %d: byTop %x is no order of its %d positions", c, r.byTop, r.n)
			}
			seen |= 1 << p
			t := r.items[p].top
			if t > prevTop {
				return fmt.Errorf("chunk %d: byTop %x lists top %d after %d", c, r.byTop, t, prevTop)
			}
			prevTop = t
		}
		for i := range r.items[:r.n] {
			it, x := &r.items[i], r.ids[i]
			b := &items[x]
			if it.off < last {
				return fmt.Errorf("chunk %d, item %d: offset %d below %d, before it", c, x, it.off, last)
			}
			last = it.off
			if it.start != uint32(b.Start) || it.end != uint32(b.End) || it.off != offsets[x] || it.top != it.off+b.Bytes {
				return fmt.Errorf("chunk %d, item %d %+v: listed in use during [%d, %d) at [%d, %d), placed at %d", c, x, *b, it.start, it.end, it.off, it.top, offsets[x])
			}
			if it.sup[0] > it.start || it.sup[1] < it.end {
				weak |= 1 << i
				exposed |= s.exposed(it.start, it.end, it.sup)
			}
			times |= s.times(it.start, it.end)
			if it.off == 0 {
				if it.sup != [2]uint32{0, math.MaxUint32} {
					return fmt.Errorf("item %d at 0 has support %v", x, it.sup)
				}
				continue
			}
			found := false
			for _, l := range tops[it.off] {
				found = found || l == it.sup && l[0] < it.end && l[1] > it.start
			}
			if !found {
				return fmt.Errorf("item %d at %d: its support %v is no lifetime of an item in use with it up to %d", x, it.off, it.sup, it.off)
			}
		}
		if weak != r.weak || times != r.times || exposed != r.exposed {
			return fmt.Errorf("chunk %d: weak %b, times %x, exposed %x; its items make %b, %x, %x", c, r.weak, r.times, r.exposed, weak, times, exposed)
		}
	}
	return nil
}

// placeChecked places items in the order idx, as greedyScan does (first:
// by first fit), and checks the lists after each placement (checkLists).
func placeChecked(items []Item, idx []int32, first bool) error {
	s := newScanLists(items)
	offsets := make([]uint64, len(items))
	for _, x := range idx {
		b := &items[x]
		if !takesMemory(b) {
			continue
		}
		at, sup := s.fit(uint32(b.Start), uint32(b.End), b.Bytes, first)
		s.insert(uint32(b.Start), uint32(b.End), at, at+b.Bytes, sup, x)
		offsets[x] = at
		if err := checkLists(&s, items, offsets); err != nil {
			return fmt.Errorf("after item %d: %w", x, err)
		}
	}
	return nil
}

// TestScanListsKeepTheirInvariants places random step-like items and
// random ones, in every order and by each fit, one by one, and checks
// the lists after each (checkLists): chunks split, byTop kept through
// insertions and splits, weak and times as the items say.
func TestScanListsKeepTheirInvariants(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 12))
	for round := range 60 {
		items, _ := scanRound(r, round, 200)
		for k, o := range Orders {
			for _, first := range []bool{false, true} {
				if err := placeChecked(items, orderOf(items, o), first); err != nil {
					t.Fatalf("round %d, order %d, first fit %v: %v", round, k, first, err)
				}
			}
		}
	}
}

// TestScanReadsCountsTheModel holds scanReads to its definition, counted
// item by item: for each item that takes memory, the items that take
// memory and touch each bucket of time it touches, on random items.
func TestScanReadsCountsTheModel(t *testing.T) {
	r := rand.New(rand.NewPCG(13, 14))
	for round := range 200 {
		n := 1 + r.IntN(300)
		ops := 1 + r.IntN(3*n)
		items := make([]Item, n)
		for i := range items {
			s := r.IntN(ops)
			items[i] = Item{Start: s, End: min(ops, s+r.IntN(1+r.IntN(ops))), Bytes: uint64(r.IntN(3)) * 512}
		}
		w, nb := bucketWidth(items, ops)
		bucket := func(t int) int { return min(t/w, nb-1) }
		wantN, wantRead := 0, 0
		for i := range items {
			a := &items[i]
			if !takesMemory(a) {
				continue
			}
			wantN++
			for k := bucket(a.Start); k <= bucket(a.End-1); k++ {
				for j := range items {
					if b := &items[j]; takesMemory(b) && bucket(b.Start) <= k && k <= bucket(b.End-1) {
						wantRead++
					}
				}
			}
		}
		if gotN, gotRead, ok := scanReads(items, ops); !ok || gotN != wantN || gotRead != wantRead {
			t.Fatalf("round %d: %d items, %d reads (ok %v); want %d, %d", round, gotN, gotRead, ok, wantN, wantRead)
		}
	}
	if bits.UintSize == 64 {
		var past uint64 = math.MaxUint32 + 1
		if _, _, ok := scanReads([]Item{{Start: 0, End: int(past), Bytes: 512}}, int(past)); ok {
			t.Fatal("scanReads took an item ending past 2^32 - 1")
		}
	}
}

// FuzzGreedy decodes items from the input, four bytes each (start,
// lifetime, size in 512-byte units, and the order's key), and holds
// both of Greedy's searches, by each fit, to the model (greedyPairs):
// the same offsets and footprint, Greedy's order by offset
// (checkOrder), and the scan's chunks' invariants after every
// placement (checkLists); and TimeOrder to its model (timeOrderModel),
// its packing valid (checkPacked) and its order by offset, with its gaps
// in slices and moved to its tree past a few (gapSlicesMax).
//
//	go test ./internal/pack -run '^$' -fuzz '^FuzzGreedy$' -fuzztime 5m
func FuzzGreedy(f *testing.F) {
	f.Add([]byte{0, 4, 1, 0, 1, 2, 2, 1, 2, 5, 1, 2, 4, 1, 3, 3})
	f.Add([]byte{0, 255, 8, 0, 0, 255, 8, 1, 10, 20, 0, 2, 30, 0, 4, 3, 30, 1, 4, 4})
	f.Fuzz(func(t *testing.T, data []byte) {
		n := min(len(data)/4, 300)
		items := make([]Item, n)
		keys := make([]byte, n)
		ops := 1
		for i := range items {
			d := data[4*i:]
			items[i] = Item{Start: int(d[0]), End: int(d[0]) + int(d[1]%64), Bytes: uint64(d[2]%16) * 512}
			keys[i] = d[3]
			ops = max(ops, items[i].End)
		}
		idx := make([]int32, n)
		for i := range idx {
			idx[i] = int32(i)
		}
		slices.SortStableFunc(idx, func(x, y int32) int { return cmp.Compare(keys[x], keys[y]) })
		for _, fit := range []Fit{BestFit, FirstFit} {
			want, wantFP := greedyPairs(items, idx, fit)
			got, order := make([]uint64, n), make([]int32, n)
			if fp := greedyScan(context.Background(), items, idx, got, fit, order); fp != wantFP || !slices.Equal(got, want) {
				t.Fatalf("fit %d, greedyScan: footprint %d, want %d; offsets %v, want %v", fit, fp, wantFP, got, want)
			}
			if err := checkOrder(items, got, order); err != nil {
				t.Fatalf("fit %d, greedyScan: %v", fit, err)
			}
			if fp := greedyBuckets(context.Background(), items, ops, idx, got, fit); fp != wantFP || !slices.Equal(got, want) {
				t.Fatalf("fit %d, greedyBuckets: footprint %d, want %d; offsets %v, want %v", fit, fp, wantFP, got, want)
			}
			if err := placeChecked(items, idx, fit == FirstFit); err != nil {
				t.Fatalf("fit %d: %v", fit, err)
			}
		}
		want, wantFP := timeOrderModel(items)
		got, order := make([]uint64, n), make([]int32, n)
		// With its gaps in slices, and moved to the tree past a few.
		for _, most := range []int{gapSlicesMax, len(data) % 8} {
			restore := setGapSlicesMax(most)
			fp := TimeOrder(items, got, order)
			restore()
			if fp != wantFP || !slices.Equal(got, want) {
				t.Fatalf("TimeOrder, at most %d gaps in slices: footprint %d, want %d; offsets %v, want %v", most, fp, wantFP, got, want)
			}
			if err := checkPacked(items, ops, got, wantFP); err != nil {
				t.Fatalf("TimeOrder, at most %d gaps in slices: %v", most, err)
			}
			if err := checkOrder(items, got, order); err != nil {
				t.Fatalf("TimeOrder, at most %d gaps in slices: %v", most, err)
			}
		}
	})
}
