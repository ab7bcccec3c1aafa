package freeindex

import (
	"cmp"
	"fmt"
	"slices"
	"testing"

	"pgregory.net/rapid"

	"github.com/gpumem/gpumem/device"
)

// TestIndexWalksFollowTheOrder checks the ordered walks of a free index
// with large buckets (classes of many blocks, read in address order from
// their heaps, then the tree above 128 MiB) and of a tree-only index
// against a sorted list of the same blocks: ascendFrom visits every block
// from a best fit on in (size, address) order, AscendAtLeast the blocks of at
// least a size, CloseFit the lowest address among close fits. A walk
// stopped early stops where it was told.
func TestIndexWalksFollowTheOrder(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		p := &Pool{idx: 1}
		seg := testSeg(p, SmallBuffer) // expandable: no list of whole segments
		var x Index
		kind := KindLarge
		if rapid.Bool().Draw(t, "treeOnly") {
			kind = KindTree
		}
		x.Init(0, new(Spares), 0, p, kind)
		if rapid.Bool().Draw(t, "direct") {
			x.KeepPages() // classes in pages (of large buckets)
		}
		var live []*Block
		// Few sizes and many addresses, so that classes hold several
		// blocks; some sizes above 128 MiB, in the tree.
		sizes := []uint64{512, 1024, 4096, 2 << 20, 2<<20 + 512, 20 << 20, maxLargeSize, maxLargeSize + 512, 1 << 30}
		used := map[device.Ptr]bool{}
		for i, n := 0, rapid.IntRange(0, 200).Draw(t, "ops"); i < n; i++ {
			if len(live) > 0 && rapid.IntRange(0, 3).Draw(t, "remove") == 0 {
				j := rapid.IntRange(0, len(live)-1).Draw(t, "victim")
				x.Remove(live[j])
				delete(used, live[j].ptr)
				live = slices.Delete(live, j, j+1)
				continue
			}
			ptr := device.Ptr(rapid.IntRange(1, 1<<12).Draw(t, "ptr")) << 12
			if used[ptr] {
				continue
			}
			used[ptr] = true
			b := onSeg(&Block{ptr: ptr, size: rapid.SampledFrom(sizes).Draw(t, "size"), pool: p}, seg)
			x.Insert(b)
			live = append(live, b)
		}
		want := slices.Clone(live)
		slices.SortFunc(want, func(a, b *Block) int {
			return cmp.Or(cmp.Compare(a.size, b.size), cmp.Compare(a.ptr, b.ptr))
		})
		if len(want) == 0 {
			return
		}
		size := rapid.SampledFrom(sizes).Draw(t, "from")
		i, _ := slices.BinarySearchFunc(want, size, func(b *Block, s uint64) int { return cmp.Compare(b.size, s) })
		if i == len(want) {
			if x.Fit(size) != nil {
				t.Fatalf("fit(%d) found a block; none is that large", size)
			}
			return
		}
		first := x.Fit(size)
		if first != want[i] {
			t.Fatalf("fit(%d) = %v+%d, want %v+%d", size, first.ptr, first.size, want[i].ptr, want[i].size)
		}
		stop := rapid.IntRange(1, len(want)-i+1).Draw(t, "stop")
		var got []*Block
		x.ascendFrom(first, func(b *Block) bool {
			got = append(got, b)
			return len(got) < stop
		})
		if exp := want[i:min(len(want), i+stop)]; !slices.Equal(got, exp) {
			t.Fatalf("ascendFrom visited %d blocks out of order or not all (want %d)", len(got), len(exp))
		}
		got = got[:0]
		x.AscendAtLeast(size, func(b *Block) bool { got = append(got, b); return true })
		if !slices.Equal(got, want[i:]) {
			t.Fatalf("ascendAtLeast(%d) visited %v, want %v", size, keys(got), keys(want[i:]))
		}
		// CloseFit against the rule it states, on the sorted list.
		limit := first.size + rapid.Uint64Range(0, first.size).Draw(t, "slack")
		below := rapid.SampledFrom(sizes).Draw(t, "below")
		window := rapid.IntRange(1, 20).Draw(t, "window")
		best := first
		for j, n := i, 0; j < len(want) && n < window && want[j].size <= limit; j++ {
			n++
			if c := want[j]; c.size < below && c.ptr < best.ptr {
				best = c
			}
		}
		if got := x.CloseFit(first, limit, below, window); got != best {
			t.Fatalf("closeFit(limit %d, below %d, window %d) = %v, want %v", limit, below, window, KeyOf(got), KeyOf(best))
		}
		// FitClose as Fit and then CloseFit, with the limit its shift gives.
		shift := uint(rapid.IntRange(0, 6).Draw(t, "shift"))
		best = first
		for j, n := i, 0; j < len(want) && n < window && want[j].size <= first.size+first.size>>shift; j++ {
			n++
			if c := want[j]; c.size < below && c.ptr < best.ptr {
				best = c
			}
		}
		if got := x.FitClose(size, shift, below, window); got != best {
			t.Fatalf("fitClose(%d, shift %d, below %d, window %d) = %v, want %v", size, shift, below, window, KeyOf(got), KeyOf(best))
		}
	})
}

// keys lists the (size, address) of blocks, for messages.
func keys(bs []*Block) []Key {
	out := make([]Key, len(bs))
	for i, b := range bs {
		out[i] = KeyOf(b)
	}
	return out
}

// TestExpandableBestFitFollowsTheRule holds ExpandableBestFit to its rule
// on the sorted list of the free blocks: from b, the lowest address of
// its size, passed over, keep each block that could grow less than the one
// kept, until one could grow as much or the one kept is of a plain
// segment. The blocks have unmapped ranges of random sizes after them
// (or none), some are of a plain segment, and some classes hold several
// blocks (heaps), some sizes are above 128 MiB (the tree). It fails if
// the walk written out for large buckets skips or reorders a block.
func TestExpandableBestFitFollowsTheRule(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		p := &Pool{idx: 1}
		expandable, plain := testSeg(p, SmallBuffer), testSeg(p, 0)
		var x Index
		kind := KindLarge
		if rapid.IntRange(0, 3).Draw(t, "kind") == 0 {
			kind = KindTree
		}
		x.Init(0, new(Spares), 0, p, kind)
		if rapid.Bool().Draw(t, "direct") {
			x.KeepPages()
		}
		// Sizes of the first few classes, of one block or several, and
		// unmapped ranges of a few classes, so that walks go on past
		// several blocks and meet ties; some sizes in the tree.
		big := []uint64{2 << 20, maxLargeSize, maxLargeSize + 512, maxLargeSize + 1024}
		var live []*Block
		used := map[device.Ptr]bool{}
		for i, n := 0, rapid.IntRange(1, 40).Draw(t, "blocks"); i < n; i++ {
			ptr := device.Ptr(rapid.IntRange(1, 1<<12).Draw(t, "ptr")) << 32
			if used[ptr] {
				continue
			}
			used[ptr] = true
			size := uint64(rapid.IntRange(1, 24).Draw(t, "classes")) * MinBlockSize
			if rapid.IntRange(0, 5).Draw(t, "big") == 0 {
				size = rapid.SampledFrom(big).Draw(t, "size")
			}
			b := onSeg(&Block{ptr: ptr, size: size, pool: p}, expandable)
			if rapid.IntRange(0, 4).Draw(t, "plain") == 0 {
				b.setSeg(plain)
			} else if rapid.Bool().Draw(t, "grows") {
				b.next = onSeg(&Block{ptr: ptr + device.Ptr(b.size), size: uint64(rapid.IntRange(1, 16).Draw(t, "unmapped")) * MinBlockSize, pool: p, unmapped: true}, expandable)
				b.setGrows(true)
			}
			x.Insert(b)
			live = append(live, b)
		}
		if len(live) == 0 {
			return
		}
		sorted := slices.Clone(live)
		slices.SortFunc(sorted, func(a, b *Block) int {
			return cmp.Or(cmp.Compare(a.size, b.size), cmp.Compare(a.ptr, b.ptr))
		})
		// Each size's lowest address, as a fit returns it.
		for i, b := range sorted {
			if i > 0 && sorted[i-1].size == b.size {
				continue
			}
			want := b
			if expandableSize(b) != b.size {
				for _, n := range sorted[i:] {
					if n == b {
						continue
					}
					if !want.seg.Expandable() || expandableSize(n) >= expandableSize(want) {
						break
					}
					want = n
				}
			}
			if got := ExpandableBestFit(&x, b); got != want {
				t.Fatalf("ExpandableBestFit(%v) = %v, want %v", KeyOf(b), KeyOf(got), KeyOf(want))
			}
		}
	})
}

// TestPutMergesIntoTheTree frees a block between neighbours of a large
// index, free or busy, of sizes in the large buckets or over
// maxLargeSize (in the tree), and checks the merged block: where it
// merges into a neighbour in the tree, that neighbour's struct, filed
// under its new key (mergeInto); else the freed block's; the index whole.
func TestPutMergesIntoTheTree(t *testing.T) {
	for _, c := range []struct {
		name         string
		below, above uint64 // the free neighbours' sizes, 0: busy
	}{
		{"into the block above", 2 << 20, 1 << 30},
		{"into the block below", 1 << 30, 2 << 20},
		{"into the block below alone", 1 << 30, 0},
		{"into the block above alone", 0, 1 << 30},
		{"both in the tree", 1 << 30, 1 << 30},
		{"both in large buckets", 2 << 20, 4 << 20},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := &Pool{idx: 1}
			seg := testSeg(p, SmallBuffer)
			var x Index
			x.Init(0, new(Spares), 0, p, KindLarge)
			sizes := []uint64{max(c.below, 2<<20), 4 << 20, max(c.above, 2<<20), 2 << 20}
			busy := []bool{c.below == 0, true, c.above == 0, true}
			var bs []*Block
			ptr := device.Ptr(1 << 40)
			for i, size := range sizes {
				b := onSeg(&Block{ptr: ptr, size: size, pool: p, Allocated: busy[i]}, seg)
				ptr += device.Ptr(size)
				if i == 0 {
					seg.head = b
				} else {
					bs[i-1].linkAfter(b)
				}
				bs = append(bs, b)
			}
			for _, b := range bs {
				if !b.Allocated {
					x.Insert(b)
				}
			}
			first, last := 1, 1
			if !busy[0] {
				first = 0
			}
			if !busy[2] {
				last = 2
			}
			var total uint64
			for _, b := range bs[first : last+1] {
				total += b.size
			}
			start := bs[first].ptr
			want, n := bs[1], bs[0] // the merged block's struct, the neighbour that may keep it
			if last == 2 {
				n = bs[2]
			}
			if (first == 0 || last == 2) && n.size > maxLargeSize {
				want = n
			}
			bs[1].Allocated = false
			m := x.Put(bs[1])
			if m.ptr != start || m.size != total || m != want {
				t.Fatalf("merged %v+%d (struct %p), want %v+%d (struct %p)", m.ptr, m.size, m, start, total, want)
			}
			var msgs []string
			x.Check(func(format string, args ...any) { msgs = append(msgs, fmt.Sprintf(format, args...)) })
			if len(msgs) > 0 {
				t.Fatal(msgs)
			}
			if got := x.Fit(total); got != m {
				t.Fatalf("fit(%d) = %p, want the merged block %p", total, got, m)
			}
			if m.prev != nil && m.prev.next != m || m.next != bs[last+1] || bs[last+1].prev != m {
				t.Fatal("the merged block is not linked in its segment")
			}
		})
	}
}

// TestFitBetweenChanges checks Fit against a sorted list of the same
// blocks after every insert and remove, so that a fit that found nothing
// (and lowered the large buckets' bound of their classes) is followed by
// blocks of larger classes, which a later fit must find, and that MayFit
// is true where a block fits. It fails if the bound is not raised as a
// class fills.
func TestFitBetweenChanges(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		p := &Pool{idx: 1}
		seg := testSeg(p, SmallBuffer)
		var x Index
		x.Init(0, new(Spares), 0, p, KindLarge)
		if rapid.Bool().Draw(t, "direct") {
			x.KeepPages()
		}
		sizes := []uint64{512, 4096, 2 << 20, 20 << 20, 100 << 20, maxLargeSize, maxLargeSize + 512}
		var live []*Block
		used := map[device.Ptr]bool{}
		for i, n := 0, rapid.IntRange(1, 100).Draw(t, "ops"); i < n; i++ {
			switch rapid.IntRange(0, 2).Draw(t, "op") {
			case 0:
				if len(live) > 0 {
					j := rapid.IntRange(0, len(live)-1).Draw(t, "victim")
					x.Remove(live[j])
					delete(used, live[j].ptr)
					live = slices.Delete(live, j, j+1)
				}
			case 1:
				ptr := device.Ptr(rapid.IntRange(1, 1<<10).Draw(t, "ptr")) << 12
				if !used[ptr] {
					used[ptr] = true
					b := onSeg(&Block{ptr: ptr, size: rapid.SampledFrom(sizes).Draw(t, "size"), pool: p}, seg)
					x.Insert(b)
					live = append(live, b)
				}
			case 2:
				size := rapid.SampledFrom(sizes).Draw(t, "fit")
				var want *Block
				for _, b := range live {
					if b.size >= size && (want == nil || b.size < want.size || b.size == want.size && b.ptr < want.ptr) {
						want = b
					}
				}
				if !x.MayFit(size) && want != nil {
					t.Fatalf("MayFit(%d): false, where %v fits", size, KeyOf(want))
				}
				if got := x.Fit(size); got != want {
					t.Fatalf("Fit(%d) = %v, want %v", size, KeyOf(got), KeyOf(want))
				}
			}
		}
		if msg := x.large.check(); msg != "" {
			t.Fatal(msg)
		}
	})
}
