package freeindex

import (
	"fmt"
	"strings"
	"testing"

	"github.com/gpumem/gpumem/device"
)

// TestHeldArena carves blocks out of a mapped expandable segment in a
// large index and frees them: the carves hold the free block's range
// out of the index, the frees merge within it, Check passes after each
// step, and any other use of the index (a fit) files the range's free
// blocks back, merged as Put would have left them, with their age bases.
func TestHeldArena(t *testing.T) {
	const page = SmallBuffer
	const base = device.Ptr(1 << 30)
	x, p := largeIndex()
	check := func(step string) {
		t.Helper()
		var bad []string
		x.Check(func(f string, a ...any) { bad = append(bad, fmt.Sprintf(f, a...)) })
		if len(bad) > 0 {
			t.Fatalf("%s: %s", step, strings.Join(bad, "; "))
		}
	}
	u := x.NewSegment(base, 64*page, page)
	seg := u.Seg()
	x.SegmentAdded()
	whole := x.Put(x.MapPages(u, 0, 64*page))
	check("mapped")

	p.GCCalls = 5
	a := x.Carve(whole, base+4096, 8192) // inside: a front and a rest
	a.Allocated = true
	if !x.HoldsArena() || whole.Indexed() || a.Ptr() != base+4096 || a.Size() != 8192 {
		t.Fatalf("carve: held %v, first block indexed %v, block %v+%d", x.HoldsArena(), whole.Indexed(), a.Ptr(), a.Size())
	}
	check("carve inside")
	b := x.Carve(a.Next(), a.Next().Ptr(), 4096) // at the rest's start: the rest's struct handed out
	b.Allocated = true
	check("carve at a start")
	c := x.Carve(seg.Head(), base, 4096) // the arena's first block, at its start
	c.Allocated = true
	if c != whole || seg.Head() != whole {
		t.Fatal("a carve at the arena's start hands out the first block's struct")
	}
	check("carve the first")
	if !x.InArena(b.Next()) || x.InArena(onSeg(&Block{ptr: base + 64*page}, seg)) {
		t.Fatal("InArena: the range is the first free block's")
	}

	p.GCCalls = 9
	a.Allocated = false
	if m := x.Put(a); !x.HoldsArena() || m.Indexed() || m.Ptr() != base+4096 || m.Size() != 8192 {
		t.Fatalf("free within the arena: held %v, merged %v+%d indexed %v", x.HoldsArena(), m.Ptr(), m.Size(), m.Indexed())
	}
	check("free of a block between two busy ones")
	b.Allocated = false
	m := x.Put(b) // merges with a below and the rest above
	if m.Ptr() != base+4096 || m.Next() != nil || m.Indexed() || m.GCCountBase() != 9 {
		t.Fatalf("free merging both ways: %v+%d, next %v, indexed %v, age base %d", m.Ptr(), m.Size(), m.Next(), m.Indexed(), m.GCCountBase())
	}
	check("free merging both ways")

	p.GCCalls = 12
	if !x.MayFit(1 << 20) { // the arena's free blocks are in no structure
		t.Fatal("MayFit: an index that holds an arena with a free block of 1 MiB holds none")
	}
	if f := x.Fit(1 << 20); f != m || !f.Indexed() || x.HoldsArena() || f.GCCountBase() != 9 {
		t.Fatalf("a fit files the arena back first: found %v, held %v, age base %d", f, x.HoldsArena(), m.GCCountBase())
	}
	check("filed back")
	c.Allocated = false
	if m := x.Put(c); m.Size() != 64*page || m.Next() != nil || !m.Indexed() {
		t.Fatalf("the last free: %v+%d indexed %v", m.Ptr(), m.Size(), m.Indexed())
	}
	check("whole again")
}

// TestMayFitWithAnArenaHeld: an arena carved from a free block above 128
// MiB (filed in the tree, not in the large buckets, whose bound of
// classes stays at 0) leaves both empty while held, yet a fit files its
// free blocks back and finds one: MayFit must not say none.
func TestMayFitWithAnArenaHeld(t *testing.T) {
	const page = SmallBuffer
	const base = device.Ptr(1 << 30)
	x, _ := largeIndex()
	u := x.NewSegment(base, 256*page, page)
	x.SegmentAdded()
	whole := x.Put(x.MapPages(u, 0, 256*page)) // 512 MiB, in the tree
	if !x.MayFit(64 << 20) {
		t.Fatal("MayFit: none, with a free block of 512 MiB in the tree")
	}
	a := x.Carve(whole, base, 4096)
	a.Allocated = true
	if !x.HoldsArena() {
		t.Fatal("the carve holds no arena")
	}
	if !x.MayFit(64 << 20) {
		t.Fatal("MayFit: none, with a free block of about 512 MiB held in the arena")
	}
	if f := x.Fit(64 << 20); f == nil || f.Size() != 256*page-4096 {
		t.Fatalf("Fit after the carve: %v", f)
	}
}

// largeIndex returns an empty index of the large kind, of stream 7, and
// its pool of expandable segments, for the tests of a segment's blocks.
func largeIndex() (*Index, *Pool) {
	p := NewPool(true, true)
	x := new(Index)
	x.Init(0, new(Spares), 7, p, KindLarge)
	return x, p
}
