package freeindex

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/gpumem/gpumem/device"
)

// TestTreeRekey moves blocks of trees of one leaf and of several levels
// to new keys, below and above every other key (the first and the last
// leaf's ends, where rekey moves a block within its leaf) as well as
// between, and checks the structure and the order against a sorted list.
func TestTreeRekey(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for _, n := range []int{1, 2, 5, 31, 32, 33, 200, 3000} {
		var tr freeTree
		blocks := make([]*Block, n)
		for i := range blocks {
			blocks[i] = &Block{ptr: device.Ptr(i+1) << 30, size: (rng.Uint64N(1<<10) + 1024) * MinBlockSize}
			tr.insert(blocks[i])
		}
		for step := range 4 * n {
			b := blocks[rng.IntN(n)]
			old := KeyOf(b)
			switch step % 4 {
			case 0: // below every other key
				b.size = rng.Uint64N(1000) + 1
			case 1: // above every other key
				b.size = (rng.Uint64N(1<<10) + 1<<20) * MinBlockSize
			case 2: // a little smaller, as a carve of the block's front
				b.size = max(1, b.size-rng.Uint64N(4)*MinBlockSize)
			default:
				b.size = (rng.Uint64N(1<<10) + 1024) * MinBlockSize
			}
			tr.rekey(b, old)
			if msg := tr.check(); msg != "" {
				t.Fatalf("n %d, step %d: %s", n, step, msg)
			}
		}
		want := slices.Clone(blocks)
		slices.SortFunc(want, func(x, y *Block) int {
			if KeyOf(x).less(KeyOf(y)) {
				return -1
			}
			return 1
		})
		var got []*Block
		for l := tr.first; l != nil; l = l.next {
			for i := range l.n {
				if l.keys[i] != KeyOf(l.vals[i]) {
					t.Fatalf("n %d: a leaf's key %v is not its block's %v", n, l.keys[i], KeyOf(l.vals[i]))
				}
				got = append(got, l.vals[i])
			}
		}
		if !slices.Equal(got, want) || tr.n != n {
			t.Fatalf("n %d: the tree holds %d blocks out of order, want %d", n, len(got), n)
		}
		for _, b := range blocks {
			if tr.lowerBound(b.size) == nil || KeyOf(tr.lowerBound(b.size)).less(Key{b.size, 0}) {
				t.Fatalf("n %d: lowerBound(%d) wrong", n, b.size)
			}
		}
	}
}
