package freeindex

import (
	"testing"

	"pgregory.net/rapid"

	"github.com/gpumem/gpumem/device"
)

// TestPtrTableMatchesMap drives PtrTable and a Go map with the same random
// operations, with addresses drawn from a small range so that probe runs
// collide and wrap, and requires identical answers.
func TestPtrTableMatchesMap(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		var tab PtrTable
		ref := map[device.Ptr]*Block{}
		ptr := rapid.Custom(func(t *rapid.T) device.Ptr {
			return device.Ptr(rapid.IntRange(1, 300).Draw(t, "slot")) << 9
		})
		for range rapid.IntRange(0, 600).Draw(t, "ops") {
			p := ptr.Draw(t, "ptr")
			switch rapid.IntRange(0, 2).Draw(t, "op") {
			case 0:
				if ref[p] != nil {
					break // put takes addresses that are not in the table
				}
				b := &Block{ptr: p, Allocated: true}
				// PutHome first, as the hot path does, or Put alone.
				if n := tab.Len(); !rapid.Bool().Draw(t, "home") || !tab.PutHome(b) {
					if tab.Len() != n {
						t.Fatalf("PutHome(%v) refused but changed the table", p)
					}
					tab.Put(b)
				} else if tab.slots[tab.home(p)] != b {
					t.Fatalf("PutHome(%v) did not file the block in its home slot", p)
				}
				ref[p] = b
				if tab.n > tab.limit {
					t.Fatalf("%d entries, more than the table's limit %d", tab.n, tab.limit)
				}
			case 1:
				// RemoveHome first, as the hot path does, or Remove alone.
				var got *Block
				if rapid.Bool().Draw(t, "home") {
					n, home := tab.Len(), tab.Get(p) != nil && tab.slots[tab.home(p)] == ref[p]
					if got = tab.RemoveHome(p); got == nil {
						if tab.Len() != n {
							t.Fatalf("RemoveHome(%v) refused but changed the table", p)
						}
					} else if !home {
						t.Fatalf("RemoveHome(%v) removed a block that was not in its home slot", p)
					}
				}
				if got == nil {
					got = tab.Remove(p)
				}
				if want := ref[p]; got != want {
					t.Fatalf("remove(%v) = %p, want %p", p, got, want)
				}
				delete(ref, p)
			case 2:
				if got, want := tab.Get(p), ref[p]; got != want {
					t.Fatalf("get(%v) = %p, want %p", p, got, want)
				}
			}
			if tab.Len() != len(ref) {
				t.Fatalf("len %d, want %d", tab.Len(), len(ref))
			}
		}
		n := 0
		for _, b := range tab.slots {
			if b == nil {
				continue
			}
			n++
			if ref[b.ptr] != b {
				t.Fatalf("slot: %v -> %p, want %p", b.ptr, b, ref[b.ptr])
			}
		}
		if n != len(ref) {
			t.Fatalf("slots hold %d, want %d", n, len(ref))
		}
	})
}

// TestPtrTableLongRuns files 300 blocks whose addresses all hash to one
// slot near the table's end, so that one probe run wraps past it, and
// removes them all, in an order rapid draws: after each removal every
// block left must be found, the removed one not, and no empty slot may lie
// between an entry and its home.
func TestPtrTableLongRuns(t *testing.T) {
	var tab PtrTable
	tab.init(2048) // a quarter full at 512 entries: room for the run
	var ptrs []device.Ptr
	for p := device.Ptr(512); len(ptrs) < 300; p += 512 {
		if tab.home(p) == 2040 { // the run wraps past the table's end
			ptrs = append(ptrs, p)
		}
	}
	rapid.Check(t, func(t *rapid.T) {
		tab.init(2048)
		blocks := map[device.Ptr]*Block{}
		for _, p := range ptrs {
			b := &Block{ptr: p, Allocated: true}
			blocks[p] = b
			tab.Put(b)
		}
		for i, p := range rapid.Permutation(ptrs).Draw(t, "order") {
			if got := tab.Remove(p); got != blocks[p] {
				t.Fatalf("remove %d (%v) = %p, want %p", i, p, got, blocks[p])
			}
			delete(blocks, p)
			if tab.Get(p) != nil {
				t.Fatalf("get(%v) after its removal found a block", p)
			}
			for j, b := range tab.slots {
				for k := uint64(j); b != nil && k != tab.home(b.ptr); {
					if k = (k - 1) & tab.mask; tab.slots[k] == nil {
						t.Fatalf("an empty slot between the home of %v and its slot", b.ptr)
					}
				}
			}
			for p, b := range blocks {
				if got := tab.Get(p); got != b {
					t.Fatalf("get(%v) = %p, want %p", p, got, b)
				}
			}
		}
		if tab.Len() != 0 {
			t.Fatalf("%d entries left", tab.Len())
		}
	})
}
