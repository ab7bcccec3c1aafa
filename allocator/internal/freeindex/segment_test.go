package freeindex

import (
	"testing"

	"github.com/gpumem/gpumem/device"
)

// TestSegmentPagesMapAndUnmap follows an expandable segment of four pages
// through NewSegment, MapPages, UnmapPages and ForgetSegment: after each
// step its blocks tile it with the expected states, the pool's unmapped
// index holds exactly its unmapped ranges, and the index's check passes.
func TestSegmentPagesMapAndUnmap(t *testing.T) {
	const page = SmallBuffer
	const base = device.Ptr(1 << 30)
	x, p := largeIndex()
	// want lists the blocks of the segment from its head: 'u' an unmapped
	// page, 'f' a free one, each run of one letter one block.
	expect := func(step string, seg *Segment, want string) {
		t.Helper()
		var got string
		unmapped := 0
		ptr := seg.Ptr()
		for b := seg.Head(); b != nil; b = b.Next() {
			if b.Ptr() != ptr || b.Size()%page != 0 || b.Seg() != seg || b.Stream() != 7 || b.Pool() != p {
				t.Fatalf("%s: block %v+%d of segment %v is misplaced", step, b.Ptr(), b.Size(), seg.Ptr())
			}
			c := "f"
			if b.Unmapped() {
				c = "u"
				unmapped++
				if !p.HasUnmapped(b) {
					t.Fatalf("%s: unmapped block %v is not in the pool's unmapped index", step, b.Ptr())
				}
			} else if !b.Indexed() {
				t.Fatalf("%s: free block %v is not in the free index", step, b.Ptr())
			}
			for range b.Size() / page {
				got += c
			}
			ptr += device.Ptr(b.Size())
		}
		if got != want || ptr != seg.Ptr()+device.Ptr(seg.Size()) {
			t.Fatalf("%s: segment pages %q, want %q", step, got, want)
		}
		if p.UnmappedLen() != unmapped {
			t.Fatalf("%s: the unmapped index holds %d ranges, the segment %d", step, p.UnmappedLen(), unmapped)
		}
		var bad []string
		x.Check(func(f string, _ ...any) { bad = append(bad, f) })
		if len(bad) > 0 {
			t.Fatalf("%s: index check: %v", step, bad)
		}
	}

	u := x.NewSegment(base, 4*page, page)
	seg := u.Seg()
	x.SegmentAdded()
	if !seg.Expandable() || seg.Page() != page || seg.Free() != x || seg.Head() != u {
		t.Fatalf("new segment: expandable %v, page %d, free index %p (want %p), head %p (want %p)", seg.Expandable(), seg.Page(), seg.Free(), x, seg.Head(), u)
	}
	expect("new", seg, "uuuu")

	x.Put(x.MapPages(u, page, 2*page)) // the middle pages
	expect("map the middle", seg, "uffu")
	x.Put(x.MapPages(seg.Head(), 0, page)) // merges with the free pages after it
	expect("map the first", seg, "fffu")
	if b := seg.Head(); b.Size() != 3*page {
		t.Fatalf("map the first: the first block has %d bytes, want the 3 free pages merged", b.Size())
	}

	x.Put(x.UnmapPages(seg.Head(), base+device.Ptr(page), page))
	expect("unmap the second", seg, "fufu")
	x.Put(x.UnmapPages(seg.Head(), base, page)) // merges with the unmapped page after it
	expect("unmap the first", seg, "uufu")
	x.Put(x.UnmapPages(seg.Head().Next(), base+device.Ptr(2*page), page)) // merges with both
	expect("unmap the third", seg, "uuuu")
	if u := seg.Head(); u.Next() != nil || u.Size() != seg.Size() {
		t.Fatalf("unmap the third: the segment's head %v+%d is not its one block", u.Ptr(), u.Size())
	}

	x.ForgetSegment(seg.Head())
	x.SegmentRemoved()
	if p.UnmappedLen() != 0 || x.NSeg() != 0 || p.NumOwners() != 0 {
		t.Fatalf("forgotten segment: %d unmapped ranges, %d segments, %d owners; want none", p.UnmappedLen(), x.NSeg(), p.NumOwners())
	}
}
