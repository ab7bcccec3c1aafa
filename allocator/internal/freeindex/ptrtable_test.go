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
