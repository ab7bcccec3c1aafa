// This file holds the planned policy's block below each place (planReq.below,
// policy_plan.go has the policy's model): worked out when a step is
// packed, it is where a served request's walk to its place starts; and,
// for a place with none below, the block such a walk starts from
// (walkStart).

package allocator

import (
	"math/bits"

	"github.com/gpumem/gpumem/allocator/internal/freeindex"
	"github.com/gpumem/gpumem/device"
)

// planBelow sets each arena request's below: the step's allocations
// and frees of the arena's blocks (at their operations start and end,
// of ops) are run again in order over the arena's blocks in use, a set
// of bits by the rank of their offsets among the arena's (blocks in use
// at once do not share an offset: each holds at least 512 bytes), and
// each request takes the one just below its place, the highest bit below
// its own. byOff lists the positions of the arena requests by offset
// (the packing's order, pack.Greedy's: no sort here).
func planBelow(reqs []planReq, ops int, byOff []int32) {
	rank := make([]int32, len(reqs)) // by position: the rank of its offset among the arena's distinct ones
	nr := 0
	for i, k := range byOff {
		if i == 0 || reqs[k].off != reqs[byOff[i-1]].off {
			nr++
		}
		rank[k] = int32(nr - 1)
	}
	inUse := make([]uint64, (nr+63)/64) // bit r: a block at the r-th offset in use
	owner := make([]int32, nr)          // the position in use at the r-th offset
	ev := make([]int32, ops)            // by operation: k+1 allocates the k-th arena block, -k-1 frees it, 0 neither
	for k := range reqs {
		if r := &reqs[k]; r.arena {
			r.below = -1
			ev[r.start], ev[r.end] = int32(k)+1, -int32(k)-1
		}
	}
	for _, e := range ev {
		switch {
		case e > 0:
			k := e - 1
			r := int(rank[k])
			if j := highestBelow(inUse, r); j >= 0 {
				reqs[k].below = owner[j]
			}
			inUse[r>>6] |= 1 << (r & 63)
			owner[r] = k
		case e < 0:
			k := -e - 1
			if r := int(rank[k]); owner[r] == k {
				inUse[r>>6] &^= 1 << (r & 63)
			}
		}
	}
}

// highestBelow returns the highest bit set in set below bit r, or -1.
func highestBelow(set []uint64, r int) int {
	w := r >> 6
	if m := set[w] & (1<<(r&63) - 1); m != 0 {
		return w<<6 | (63 - bits.LeadingZeros64(m))
	}
	for w--; w >= 0; w-- {
		if set[w] != 0 {
			return w<<6 | (63 - bits.LeadingZeros64(set[w]))
		}
	}
	return -1
}

// walkStart returns a block of the arena's segment, whose head is one of
// its blocks, to start a walk to ptr, an address of the arena, from, for
// a request that has no block below its place (or whose block below the
// caller freed early): of the block last handed out of the arena, while
// its struct is still a block of the segment (freed, a struct usually
// stays as the merged free block), and the block that holds the arena's
// address (floor), the nearer to ptr by address. Not the segment's first
// block: the blocks below the arena would be walked each time, a cache
// miss each (on BERT's repeated step, about 130 blocks a walk).
func (p *planState) walkStart(ptr device.Ptr) *freeindex.Block {
	f, l := p.floor(), p.last
	if !freeindex.InSegment(l, p.seg) {
		l = nil
	}
	switch {
	case f == nil && l == nil:
		return p.seg.Head()
	case f == nil || l != nil && l.Ptr() >= f.Ptr() && (l.Ptr() <= ptr || l.Ptr()-ptr < ptr-f.Ptr()):
		return l
	}
	return f
}

// floor returns the block of the arena's segment, whose head is one of
// its blocks, that holds the arena's address, or nil if the segment ends
// below it: the one found last while it still does; else found by a walk
// from that one, while its struct is a block of the segment (a carve at
// the arena's address splits it there: the next block holds it), else
// from the segment's first block (it merged with the block below it).
func (p *planState) floor() *freeindex.Block {
	f := p.bottom
	switch {
	case !freeindex.InSegment(f, p.seg):
		f = p.seg.Head()
	case f.Ptr() <= p.addr && p.addr < f.Ptr()+device.Ptr(f.Size()):
		return f
	}
	p.bottom = freeindex.Containing(f, p.addr)
	return p.bottom
}
