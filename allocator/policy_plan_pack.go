// This file holds the planned policy's packing of a step (policy_plan.go
// has the policy's model): the offsets of the arena's blocks, by first
// fit (a step the program marks) or best fit (a step the policy finds),
// and the packing again by best fit of a plan whose steps skip.

package allocator

import (
	"fmt"

	"github.com/gpumem/gpumem/internal/pack"
)

// packReqs packs the arena requests of reqs, with their rounded sizes and
// their lifetimes (the step's operations, which end at the last free of
// one of them), greedy by size (the other orders of internal/pack gain
// little on a step and cost as much each: the arena is whole pages), by
// first fit with first set, else by best fit: it sets their offsets and
// their blocks below (planBelow, from the packing's order of the blocks
// by offset), forgets the blocks handed out for them (at), and returns
// the footprint in bytes and whether it packed by size. A step that
// greedy by size would take more than packBudget reads of placed blocks
// to pack is packed in time order instead (pack.Within).
//
// First fit packs a step as tight as best fit, and reads less: BERT's
// step into its peak of bytes in use either way, in about 60 % of the
// time; the envelope of BERT's batches (bert_batches' second plan) into
// 1,314,950,656 bytes against best fit's 1,314,990,592; and on every
// whole real trace that trace/plan/offline packs it meets best fit or
// beats it. Where a step is not as the plan has it, the two differ:
// first fit packs the blocks low, where a block that lives on past its
// place in the plan, or one served online in the arena, meets more of
// the blocks after it. On eor_cnn's steps, which the policy finds
// without marks, first fit skipped 33 requests where best fit skips 8: a
// block of 512 bytes still in use at a place planned for one of 7.5 MiB,
// which, served online, landed in the arena on the places of others. So
// the steps the policy finds itself are packed by best fit
// (buildPlanLocked), and a plan packed by first fit under which a step
// skips is packed again by best fit, as every plan after it is
// (planStepLocked).
func packReqs(reqs []planReq, first bool) (uint64, bool) {
	n := 0
	for k := range reqs {
		if reqs[k].arena {
			n++
		}
	}
	items, which := make([]pack.Item, 0, n), make([]int32, 0, n)
	ops := 0
	for k := range reqs {
		if r := &reqs[k]; r.arena {
			items = append(items, pack.Item{Start: int(r.start), End: int(r.end), Bytes: r.size})
			which = append(which, int32(k))
			ops = max(ops, int(r.end)+1)
		}
	}
	if len(items) == 0 {
		return 0, true
	}
	offsets := make([]uint64, len(items))
	fit := pack.BestFit
	if first {
		fit = pack.FirstFit
	}
	byOff := make([]int32, len(items))
	fp, bySize := pack.Within(items, ops, offsets, fit, byOff, packBudget)
	for i, k := range which {
		reqs[k].off, reqs[k].at = offsets[i], nil
	}
	for i, x := range byOff {
		byOff[i] = which[x] // positions in reqs, by offset
	}
	if selfCheck {
		if err := checkPacking(reqs, fp); err != nil {
			panic("gpumem: " + err.Error())
		}
	}
	planBelow(reqs, ops, byOff)
	return fp, bySize
}

// packBudget bounds a packing by size, which runs at a step boundary
// under the allocator's lock, to 2^24 reads of placed blocks by
// internal/pack's model (pack.Within): about 80 M instructions, where
// BERT's step of 1,004 blocks takes 0.5 M reads (2.4 M instructions).
// The reads grow as the square of the blocks in use at once: a step of
// more than about 5,800 blocks all in use together would hold the lock
// for longer (a step of 50,000 such blocks, for seconds), and is packed
// in time order, in O(n log n), into a few tenths of a percent more
// (BERT's steps: 0.04 to 0.52 % above their peaks, against 0 to 0.09 %
// by size).
var packBudget = 1 << 24 // a variable for the measurement that compares the two packings (TestPlannedBoundaryWait)

// checkPacking checks a packing of reqs whose footprint is fp: each arena
// request is in use for an operation at least, no two in use at once
// share a byte, and each ends within fp.
// It reads every pair (n^2/2), so the self-check runs it once a packing,
// not after every operation.
func checkPacking(reqs []planReq, fp uint64) error {
	for i := range reqs {
		a := &reqs[i]
		if !a.arena {
			continue
		}
		if a.start >= a.end {
			return fmt.Errorf("the plan's request %d is in use during [%d, %d): no operation", i, a.start, a.end)
		}
		if a.off+a.size > fp {
			return fmt.Errorf("the plan's request %d, in use during [%d, %d), ends at %d, past the packing's %d bytes", i, a.start, a.end, a.off+a.size, fp)
		}
		for j := range i {
			b := &reqs[j]
			if b.arena && a.start < b.end && b.start < a.end && a.off < b.off+b.size && b.off < a.off+a.size {
				return fmt.Errorf("the plan's requests %d and %d, in use at once, share bytes: [%d, %d) and [%d, %d)", j, i, b.off, b.off+b.size, a.off, a.off+a.size)
			}
		}
	}
	return nil
}

// repackLocked packs the plan again by best fit, at a boundary: its
// arena's bytes may change, and arenaLocked then finds its place.
func (a *Allocator) repackLocked() {
	p := a.pol.plan
	fp, bySize := packReqs(p.reqs, false)
	p.foot, p.first = pagesFor(fp, a.pol.largePage), false
	p.repacks++
	if !bySize {
		p.timeOrdered++
	}
}
