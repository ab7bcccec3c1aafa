// This file holds the planned policy's packing of a step (policy_plan.go
// has the policy's model): the offsets of the arena's blocks, in time
// order (a step the program marks) or by best fit (a step the policy
// finds), and the packings again: by first fit, of a plan in time order
// whose arena finds no room, and by best fit, of a plan whose steps
// skip.

package allocator

import (
	"fmt"

	"github.com/gpumem/gpumem/internal/pack"
)

// A packing is how a plan's arena is packed (packReqs), which decides
// whether it is packed again.
type packing uint8

const (
	// packBest: greedy by size, best fit (the smallest gap that holds
	// each block). A step the policy finds, and every plan after a step
	// that skipped.
	packBest packing = iota
	// packFirst: greedy by size, first fit (the lowest gap). A marked
	// step's plan whose arena in time order found no room.
	packFirst
	// packTime: in the order the blocks come into use (pack.TimeOrder).
	// A marked step's plan, first.
	packTime
	// packLarge: in time order, a step that greedy by size would take
	// more than packBudget reads to pack. Never packed again.
	packLarge
)

// packedLow reports whether a plan packed so is packed again by best fit
// once a step under it skips: in time order or by first fit, which pack
// the blocks low, where a block that outlives its place meets more of
// those after it.
func (k packing) packedLow() bool { return k == packTime || k == packFirst }

// timeOrderSlack bounds a packing in time order of a step the program
// marks: one that lies more than peak/timeOrderSlack bytes above the
// step's peak of bytes in use is made by first fit instead. BERT's steps pack in time
// order 0.04 to 0.51 % above their peaks and stay so; offload's compute
// step (484 blocks, each stream's KV blocks kept across it) 62 % above
// first fit's 74 MB, which first fit then packs.
const timeOrderSlack = 100

// markedPacking is how a step the program marks is packed first: in time
// order; a variable for the measurements that compare it with first fit
// (TestPlannedBoundaryWait, TestPlannedPacksALargeStepInTimeOrder).
var markedPacking = packTime

// packReqs packs the arena requests of reqs, with their rounded sizes and
// their lifetimes (the step's operations, which end at the last free of
// one of them), as want asks (packTime, packFirst or packBest): in time
// order, or greedy by size (the other orders of internal/pack gain
// little on a step and cost as much each: the arena is whole pages), by
// first or best fit, unless greedy by size would take more than
// packBudget reads of placed blocks, and then in time order
// (pack.Within). It sets their offsets and their
// blocks below (planBelow, from the packing's order of the blocks by
// offset), forgets the blocks handed out for them (at), and returns the
// footprint in bytes and how it packed.
//
// A step the program marks is packed in time order first: an allocator
// that knew no lifetime would place them so, each block at its start in
// the smallest free gap that holds it. That costs O(n log n), where
// greedy by size reads the placed blocks in use with each block: BERT's
// step of 1,004 blocks in 0.64 M instructions, against 2.43 M by first
// fit and 3.9 M by best fit (internal/pack's BenchmarkGreedyStep), and
// packs a few tenths of a percent looser (BERT's steps 0.04 to 0.51 %
// above their peaks, which greedy by size meets or comes within 0.09 %
// of). A packing in time order more than 1 % above the step's peak
// (timeOrderSlack) is made by first fit instead, at once; and where the
// arena in time order finds no room on the device, the plan is packed
// again by first fit, which packs a training step as tight as best fit,
// for less work (planStepLocked). Where a step is not as the plan has
// it, the packings differ: first fit packs the blocks low, where a block
// that lives on past its place in the plan, or one served online in the
// arena, meets more of the blocks after it. On eor_cnn's steps, which
// the policy finds without marks, first fit skipped 33 requests where
// best fit skips 8: a block of 512 bytes still in use at a place planned
// for one of 7.5 MiB, which, served online, landed in the arena on the
// places of others. So the steps the policy finds itself are packed by
// best fit (buildPlanLocked), and a plan in time order or by first fit
// under which a step skips is packed again by best fit, as every plan
// after it is (planStepLocked).
func packReqs(reqs []planReq, want packing) (uint64, packing) {
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
		return 0, want
	}
	offsets := make([]uint64, len(items))
	byOff := make([]int32, len(items))
	var fp uint64
	got := want
	if want == packTime {
		fp = pack.TimeOrder(items, offsets, byOff)
		if peak := pack.Peak(items, ops); fp-min(fp, peak) > peak/timeOrderSlack {
			got = packFirst // too loose: by first fit, to the peak
		}
	}
	if got != packTime {
		fit := pack.BestFit
		if got == packFirst {
			fit = pack.FirstFit
		}
		var bySize bool
		if fp, bySize = pack.Within(items, ops, offsets, fit, byOff, packBudget); !bySize {
			got = packLarge
		}
	}
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
	return fp, got
}

// packBudget bounds a packing by size (a step the policy finds, a plan
// packed again), which runs at a step boundary under the allocator's
// lock, to 2^24 reads of placed blocks by internal/pack's model
// (pack.Within): about 80 M instructions, where BERT's step of 1,004
// blocks takes 0.5 M reads (2.4 M instructions by first fit). The reads
// grow as the square of the blocks in use at once: a step of more than
// about 5,800 blocks all in use together would hold the lock for longer
// (a step of 50,000 such blocks, for seconds), and is packed in time
// order instead, as a marked step is first.
const packBudget = 1 << 24

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

// repackLocked packs the plan again as want asks, at a boundary: its
// arena's bytes may change, and arenaLocked then finds its place.
func (a *Allocator) repackLocked(want packing) {
	p := a.pol.plan
	fp, got := packReqs(p.reqs, want)
	p.foot, p.packing = pagesFor(fp, a.pol.largePage), got
	p.repacks++
	if got == packLarge {
		p.timeOrdered++
	}
}
