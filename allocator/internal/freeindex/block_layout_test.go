package freeindex

import (
	"testing"
	"unsafe"
)

// TestBlockLayout holds Block to its layout: 128 bytes, made in groups
// that start every block on a cache line (Spares), with the fields that a
// search, a free and a merge read of a block and its neighbours in the
// first 64 (listed and Phase, read of fewer blocks, are in the second).
// A field added to the first line that pushes it past 64 bytes, one that
// grows the struct, or slabs made as one object (whose header shifts the
// blocks by 8 bytes) fail it.
func TestBlockLayout(t *testing.T) {
	var b Block
	if n := unsafe.Sizeof(b); n != 128 {
		t.Errorf("Block is %d bytes, want 128", n)
	}
	hot := map[string]uintptr{
		"ptr": unsafe.Offsetof(b.ptr) + unsafe.Sizeof(b.ptr), "size": unsafe.Offsetof(b.size) + unsafe.Sizeof(b.size),
		"prev": unsafe.Offsetof(b.prev) + unsafe.Sizeof(b.prev), "next": unsafe.Offsetof(b.next) + unsafe.Sizeof(b.next),
		"seg": unsafe.Offsetof(b.seg) + unsafe.Sizeof(b.seg), "Requested": unsafe.Offsetof(b.Requested) + unsafe.Sizeof(b.Requested),
		"heapIdx":    unsafe.Offsetof(b.heapIdx) + unsafe.Sizeof(b.heapIdx),
		"EventCount": unsafe.Offsetof(b.EventCount) + unsafe.Sizeof(b.EventCount), "Uses": unsafe.Offsetof(b.Uses) + unsafe.Sizeof(b.Uses),
		"Allocated": unsafe.Offsetof(b.Allocated) + 1, "indexed": unsafe.Offsetof(b.indexed) + 1,
		"unmapped": unsafe.Offsetof(b.unmapped) + 1, "flags": unsafe.Offsetof(b.flags) + 1,
	}
	for name, end := range hot {
		if end > 64 {
			t.Errorf("Block.%s ends at byte %d, past the first cache line", name, end)
		}
	}
	if n := unsafe.Sizeof([blockGroup]Block{}); n != 512 {
		t.Errorf("a group of blocks is %d bytes, not 512: Go would not start it on a cache line", n)
	}
	var sp Spares
	for i := range 3*blockSlab + 1 {
		if p := uintptr(unsafe.Pointer(sp.get())); p%64 != 0 {
			t.Fatalf("block struct %d is at %#x, %d bytes into a cache line", i, p, p%64)
		}
	}
	if sp.n != blockSlab-1 {
		t.Errorf("after three slabs and one struct handed out, %d spares are left, want %d", sp.n, blockSlab-1)
	}
}
