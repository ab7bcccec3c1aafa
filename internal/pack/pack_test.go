package pack

import (
	"context"
	"math/rand/v2"
	"testing"
)

// overlap reports whether items i and j are in use at once and share a
// byte at the offsets given.
func overlap(items []Item, off []uint64, i, j int) bool {
	a, b := &items[i], &items[j]
	if a.Bytes == 0 || b.Bytes == 0 || a.Start >= a.End || b.Start >= b.End {
		return false
	}
	return a.Start < b.End && b.Start < a.End && off[i] < off[j]+b.Bytes && off[j] < off[i]+a.Bytes
}

func TestBestIsValidAndAtLeastTheBound(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for round := range 200 {
		n := 1 + r.IntN(60)
		ops := 2 * n
		items := make([]Item, n)
		for i := range items {
			s := r.IntN(ops)
			items[i] = Item{Start: s, End: s + r.IntN(ops-s+1), Bytes: uint64(r.IntN(8)) * 512}
		}
		// The bound: the peak of live bytes.
		var bound uint64
		for t := 0; t < ops; t++ {
			var live uint64
			for _, it := range items {
				if it.Start <= t && t < it.End {
					live += it.Bytes
				}
			}
			bound = max(bound, live)
		}
		for _, parallel := range []bool{false, true} {
			off, fp, order := Best(context.Background(), items, ops, bound, parallel)
			if fp < bound {
				t.Fatalf("round %d: footprint %d below the bound %d", round, fp, bound)
			}
			if order < 0 || order >= len(Orders) {
				t.Fatalf("round %d: order %d", round, order)
			}
			for i := range items {
				if items[i].Bytes > 0 && items[i].Start < items[i].End && off[i]+items[i].Bytes > fp {
					t.Fatalf("round %d: item %d ends at %d above the footprint %d", round, i, off[i]+items[i].Bytes, fp)
				}
				for j := range i {
					if overlap(items, off, i, j) {
						t.Fatalf("round %d: items %d %+v at %d and %d %+v at %d overlap", round, i, items[i], off[i], j, items[j], off[j])
					}
				}
			}
		}
	}
}

func TestBestReusesFreedMemory(t *testing.T) {
	// Three blocks one after another need the memory of the largest.
	items := []Item{{0, 1, 1024}, {1, 2, 2048}, {2, 3, 512}}
	off, fp, _ := Best(context.Background(), items, 3, 2048, false)
	if fp != 2048 || off[0] != 0 || off[1] != 0 || off[2] != 0 {
		t.Fatalf("footprint %d, offsets %v; want 2048 and all 0", fp, off)
	}
}

func TestBestStopped(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	items := []Item{{0, 1, 1024}}
	if _, fp, _ := Best(ctx, items, 1, 0, false); fp != 0 {
		t.Fatalf("a stopped packing gave footprint %d", fp)
	}
}
