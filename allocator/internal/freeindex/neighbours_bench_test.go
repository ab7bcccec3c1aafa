package freeindex

import (
	"math/rand/v2"
	"testing"
)

// BenchmarkNeighbourState measures, on this machine, what a design that
// keeps each block's neighbours' state in the block itself would save.
// A free reads both neighbours of the freed block for the merge (their
// first lines: Block.IsFree); with two bits of "my lower (upper)
// neighbour is free" in each block, it would read its own line and write
// the neighbours' bits instead, and every hand-out would write the bits
// of its block's neighbours too. Stores do not stall the way loads do,
// so the question is whether the writes at both ends cost less than the
// reads at one.
//
// The model: live blocks from Spares, linked into one random order (the
// order of a million live blocks' neighbours in memory after churn),
// and per op the work of the rest of an op (a chain of dependent
// multiplies, about the time of the allocator's own instructions at 1k
// live blocks), then:
//
//   - read: the free of a random block, which reads both neighbours'
//     IsFree, and the hand-out of another, which writes its block;
//   - bits: the same free testing its own bits and writing both
//     neighbours', and the hand-out writing its block and both of its
//     neighbours';
//   - none: neither reads nor writes a neighbour (the floor).
//
// BENCHMARKS.md, "Two ways to fewer misses at a million live blocks",
// gives the figures.
func BenchmarkNeighbourState(b *testing.B) {
	for _, n := range []struct {
		name string
		n    int
	}{{"live=1k", 1 << 10}, {"live=1M", 1 << 20}} {
		blocks := neighbourModel(n.n)
		picks := make([]int32, 1<<20)
		for i := range picks {
			picks[i] = int32(rand.IntN(n.n))
		}
		for _, v := range []string{"read", "bits", "none"} {
			b.Run(n.name+"/"+v, func(b *testing.B) { neighbourSink = neighbourOps(b.N, v, blocks, picks) })
		}
	}
}

// neighbourOps runs n ops of the variant v (read, bits or none) on
// blocks, the freed and the handed-out block of op i picked by picks.
// The variant is tested in the loop, a branch every op predicts.
func neighbourOps(n int, v string, blocks []*Block, picks []int32) uint64 {
	const mask = 1<<20 - 1
	read, bits := v == "read", v == "bits"
	s := uint64(0)
	for i := range n {
		s = otherWork(s)
		f := blocks[picks[i&mask]]
		if read {
			if f.prev.IsFree() {
				s++
			}
			if f.next.IsFree() {
				s++
			}
		} else if f.flags&(lowerFree|upperFree) != 0 {
			s++
		}
		if bits {
			f.prev.flags ^= upperFree
			f.next.flags ^= lowerFree
		}
		h := blocks[picks[(i+12345)&mask]]
		h.Requested = s
		if bits {
			h.prev.flags ^= upperFree
			h.next.flags ^= lowerFree
		}
	}
	return s
}

var neighbourSink uint64

// The model's bits of "my lower (upper) neighbour is free", in bits of
// Block.flags that the package does not use.
const (
	lowerFree = 1 << 6
	upperFree = 1 << 7
)

// neighbourModel returns n allocated blocks from Spares, each linked to a
// lower and an upper neighbour in one random cyclic order.
func neighbourModel(n int) []*Block {
	var sp Spares
	blocks := make([]*Block, n)
	for i := range blocks {
		blocks[i] = sp.get()
		blocks[i].Allocated = true
	}
	order := rand.Perm(n)
	for i, j := range order {
		b := blocks[j]
		b.prev = blocks[order[(i+n-1)%n]]
		b.next = blocks[order[(i+1)%n]]
	}
	return blocks
}

// otherWork is a chain of 150 dependent multiplies: the rest of an op.
//
//go:noinline
func otherWork(s uint64) uint64 {
	for range 150 {
		s = s*6364136223846793005 + 1442695040888963407
	}
	return s
}
