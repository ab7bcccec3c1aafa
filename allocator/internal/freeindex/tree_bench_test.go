package freeindex

import (
	"math/rand/v2"
	"strconv"
	"testing"

	"github.com/google/btree"

	"github.com/gpumem/gpumem/device"
)

// BenchmarkFreeTree compares freeTree with github.com/google/btree (degree
// 32, the unmapped indexes' choice) on what a free index does with a tree:
// a best-fit search (the first block of at least a size), the block's
// removal and the insertion of another, among n free blocks of random
// sizes. The figure is in freeTree's doc comment (tree.go).
func BenchmarkFreeTree(b *testing.B) {
	for _, n := range []int{64, 4096, 262144} {
		blocks := make([]*Block, n)
		rng := rand.New(rand.NewPCG(1, 2))
		for i := range blocks {
			blocks[i] = &Block{ptr: device.Ptr(i+1) << 21, size: (rng.Uint64N(1<<18) + 1) * MinBlockSize}
		}
		sizes := make([]uint64, 1024)
		for i := range sizes {
			sizes[i] = (rng.Uint64N(1<<18) + 1) * MinBlockSize
		}
		b.Run("freeTree/"+strconv.Itoa(n), func(b *testing.B) {
			var t freeTree
			for _, x := range blocks {
				t.insert(x)
			}
			b.ResetTimer()
			for i := range b.N {
				x := t.lowerBound(sizes[i&1023])
				if x == nil {
					x = t.min()
				}
				t.remove(x)
				t.insert(x)
			}
		})
		b.Run("btree/"+strconv.Itoa(n), func(b *testing.B) {
			t := btree.NewG(32, func(x, y *Block) bool {
				return x.size < y.size || x.size == y.size && x.ptr < y.ptr
			})
			for _, x := range blocks {
				t.ReplaceOrInsert(x)
			}
			key := &Block{}
			b.ResetTimer()
			for i := range b.N {
				key.size = sizes[i&1023]
				var x *Block
				t.AscendGreaterOrEqual(key, func(y *Block) bool { x = y; return false })
				if x == nil {
					x, _ = t.Min()
				}
				t.Delete(x)
				t.ReplaceOrInsert(x)
			}
		})
	}
}
