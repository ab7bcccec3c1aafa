// This file holds the planned policy's packing of a step (policy_plan.go
// has the policy's model): the offsets of the arena's blocks, by first
// fit where that packs the step as tight as any packing can, else by
// best fit, and the packing again by best fit of a plan whose steps
// skip.

package allocator

import (
	"context"

	"github.com/gpumem/gpumem/internal/pack"
)

// packReqs packs the arena requests of reqs, with their rounded sizes and
// their lifetimes among ops operations, greedy by size (the other orders
// of internal/pack gain little on a step and cost as much each: the
// arena is whole pages): it sets their offsets and their blocks below
// (planBelow), forgets the blocks handed out for them (at), and returns
// the footprint in bytes and whether first fit gave it.
//
// With first set, the packing is by first fit where that meets the peak
// of the bytes in use at once, which no packing beats (BERT's training
// step: first fit reads about half of what best fit does, for the same
// footprint); else, and with first unset, by best fit, the classic rule.
// Where a step is not as the plan has it, the two differ: first fit packs
// the blocks low, where a block that lives on past its place in the plan,
// or one served online in the arena, meets more of the blocks after it.
// On eor_cnn's steps, which the policy finds without marks, first fit
// skipped 33 requests where best fit skips 8: a block of 512 bytes still
// in use at a place planned for one of 7.5 MiB, which, served online,
// landed in the arena on the places of others. So the steps the policy
// finds itself are packed by best fit (buildPlanLocked), and a plan
// packed by first fit under which a step skips is packed again by best
// fit, as every plan after it is (planStepLocked).
func packReqs(reqs []planReq, ops int, first bool) (uint64, bool) {
	var items []pack.Item
	var which []int32
	for k := range reqs {
		if r := &reqs[k]; r.arena {
			items = append(items, pack.Item{Start: int(r.start), End: int(r.end), Bytes: r.size})
			which = append(which, int32(k))
		}
	}
	if len(items) == 0 {
		return 0, false
	}
	idx := pack.Sorted(items, 0)
	offsets := make([]uint64, len(idx))
	var fp uint64
	if first {
		fp = pack.Greedy(context.Background(), items, ops, idx, offsets, pack.FirstFit)
		first = fp <= pack.Peak(items, ops)
	}
	if !first {
		fp = pack.Greedy(context.Background(), items, ops, idx, offsets, pack.BestFit)
	}
	for i, k := range which {
		reqs[k].off, reqs[k].at = offsets[i], nil
	}
	planBelow(reqs, ops)
	return fp, first
}

// repackLocked packs the plan again by best fit, at a boundary: its
// arena's bytes may change, and arenaLocked then finds its place.
func (a *Allocator) repackLocked() {
	p := a.pol.plan
	fp, _ := packReqs(p.reqs, p.ops, false)
	p.foot, p.first = pagesFor(fp, a.pol.largePage), false
	p.repacks++
}
