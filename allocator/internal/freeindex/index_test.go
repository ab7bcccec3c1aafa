package freeindex

import (
	"cmp"
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
		seg := &Segment{page: SmallBuffer} // expandable: no list of whole segments
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
			b := &Block{ptr: ptr, size: rapid.SampledFrom(sizes).Draw(t, "size"), seg: seg, pool: p}
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
