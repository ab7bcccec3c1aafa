// This file holds the planned policy's record of a step (policy_plan.go
// has the policy's model): the log of what the step allocates and frees,
// or under a plan only the count of the plan's sizes it keeps, and the
// step boundary that keeps the plan, plans the step or ends the plan.

package allocator

import (
	"slices"

	"github.com/gpumem/gpumem/allocator/internal/freeindex"
	"github.com/gpumem/gpumem/device"
)

// sideSize stands, in the sizes of a step (the record's, the envelope's,
// a plan's), for an allocation on another stream than the step's main
// one: a side stream's, such as an input batch copied on a stream of its
// own. It is served online and is no block of the arena; a step fits a
// pattern only with its side allocations at the same positions. No
// rounded size is 1 (they are multiples of 512).
const sideSize = 1

// planAllocatedLocked logs the allocation of b, of rounded bytes on
// stream s, in the step being recorded; the ledger's hand-out asks
// countSameLocked first and logs the common cases in line. A step with
// an envelope (or a plan) has its stream as its main one, and logs an
// allocation on another stream as sideSize; a step without one (the
// first of a pattern) logs each allocation's stream too (recStreams), and
// its boundary chooses its main stream (mainStreamLocked).
func (a *Allocator) planAllocatedLocked(b *freeindex.Block, rounded uint64, s device.Stream) {
	p := a.pol.plan
	if !p.recording {
		return
	}
	if p.same != nil {
		p.spellSameLocked()
	}
	k := len(p.recSize)
	if len(p.prevSize) == 0 {
		p.logStream(s, k)
		p.recSize = append(p.recSize, rounded)
		return // no envelope: no operation logged
	}
	v := rounded
	if s != p.recStream {
		v = sideSize
	}
	if p.logOps {
		if k < len(p.prevSize) && fitsAt(v, p.prevSize[k]) {
			p.rec = append(p.rec, planOp{ptr: b.Ptr(), pos: int32(k)})
		} else {
			p.stopOpsLocked()
		}
	}
	p.recSize = append(p.recSize, v)
}

// logStream logs s, the stream of the k-th allocation of a step without
// an envelope: recStream is the first allocation's, and recStreams stays
// empty while every allocation is on it (the common case); from the
// first on another stream, it holds every allocation's.
func (p *planState) logStream(s device.Stream, k int) {
	if k == 0 {
		p.recStream = s
	}
	if len(p.recStreams) == 0 {
		if s == p.recStream {
			return
		}
		for range k {
			p.recStreams = append(p.recStreams, p.recStream)
		}
	}
	p.recStreams = append(p.recStreams, s)
}

// fitsAt reports whether an allocation logged as size fits a pattern's
// size at its position, want: a side allocation where the pattern has
// one, else one on the main stream no larger.
func fitsAt(size, want uint64) bool {
	return size <= want && (size == sideSize) == (want == sideSize)
}

// stopOpsLocked stops logging the step's operations, and forgets those
// logged, once the step cannot fit the envelope (fitsPlan: an allocation
// past its count, larger than its size at the position, or on another
// stream than the envelope's there): such a step is never packed, and
// what the boundary reads of it (its sizes, its stream) is logged apart.
// A step that cannot be planned pays for the sizes alone: the first step
// of all, which has no envelope, logs no operation, and BERT's second
// step stops at its 698th allocation (where AdamW's first step, the
// envelope, made its state).
func (p *planState) stopOpsLocked() {
	p.logOps = false
	p.rec = p.rec[:0]
}

// mainStreamLocked, at the boundary of a step that had no envelope (its
// allocations' streams in recStreams, or none there where all were on
// recStream: logStream), makes the stream with the most of its
// allocations its main one (the first of them on a tie), and logs the
// others as sideSize: the step is then as those with an envelope log
// themselves. A program that copies its next input on a stream of
// its own before its step plans the step all the same.
func (p *planState) mainStreamLocked() {
	if len(p.recStreams) == 0 {
		return
	}
	main, most := p.recStreams[0], 0 // two streams or more
	for i, s := range p.recStreams {
		if slices.Contains(p.recStreams[:i], s) {
			continue // counted at its first allocation
		}
		if n := countOf(p.recStreams[i:], s); n > most {
			main, most = s, n
		}
	}
	for k, s := range p.recStreams {
		if s != main {
			p.recSize[k] = sideSize
		}
	}
	p.recStream = main
	p.recStreams = p.recStreams[:0]
}

// countOf counts v in xs.
func countOf[T comparable](xs []T, v T) int {
	n := 0
	for _, x := range xs {
		if x == v {
			n++
		}
	}
	return n
}

// countSameLocked counts an allocation of rounded bytes on stream s as
// the plan's (recSame) and reports true when the step so far has the
// plan's sizes and this one is the plan's next: of its size on the
// plan's stream, or a side allocation where the plan has one; small
// enough to be inlined into the ledger's hand-out, which logs the
// allocation (planAllocatedLocked) otherwise.
func (p *planState) countSameLocked(rounded uint64, s device.Stream) bool {
	if k := p.recSame; k < len(p.same) && (p.same[k] == rounded && s == p.stream || p.same[k] == sideSize && s != p.stream) {
		p.recSame++
		return true
	}
	return false
}

// spellSameLocked copies the recSame sizes that the step shares with the
// plan into recSize, its stream into recStream.
func (p *planState) spellSameLocked() {
	if p.recSame > 0 {
		p.recSize = append(p.recSize[:0], p.same[:p.recSame]...)
		p.recStream = p.stream
		p.recSame = 0
	}
	p.same = nil
}

// freesHeard reports whether the planned policy hears the frees the
// caller asks for (planFreedLocked): while it logs a step's operations,
// or while it searches for steps; a step that follows a plan, or one
// that cannot fit the envelope, pays this test alone.
func (p *policyState) freesHeard() bool {
	return p != nil && p.plan != nil && (p.plan.logOps || p.plan.auto != nil)
}

// planFreedLocked logs the free of the block at ptr, which shard sh
// held, in the step being recorded, and tells the search for steps
// whether the free brought sh back to the floor of the period found
// (floorFreedLocked), when it hears them (freesHeard).
func (a *Allocator) planFreedLocked(sh *shard, ptr device.Ptr) {
	p := a.pol.plan
	if p.logOps {
		p.rec = append(p.rec, planOp{ptr: ptr, pos: -1})
	}
	if p.auto != nil {
		a.floorFreedLocked(sh) // steps found without marks, at their floor
	}
}

// planStepLocked runs at a step boundary under the planned policy: a step
// with the plan's pattern (served from the arena or not), one that fits
// it (fitsPlan: the plan's main stream, as many allocations, side ones
// where the plan has them, none larger than the plan's), or one that
// allocated nothing, keeps it; a step that
// fits the envelope of the steps before it (prevSize: the step before
// it, or the largest sizes of the last steps with as many allocations on
// the stream) is planned with the envelope's sizes, so that steps whose
// sizes go up and down (batches of varying length) are served once the
// largest has been seen, and a step that repeats the one before it is
// planned as it was; a step of another shape than the plan's (another
// count of allocations, or another main stream) after one that kept the
// plan spares it (planState.spared); any other ends the plan, which is
// kept (keepPlanLocked), and takes up a kept plan that it fits (training
// back after an evaluation), or grows the envelope (a step with as many
// allocations on its stream, side ones at the same positions) or is the
// envelope the next step is compared with, unless most of it ran on
// other streams than the envelope's: the next step then has no envelope,
// and chooses its main stream (mainStreamLocked).
// Planning costs more than a step served saves (BERT's step of 1,004
// blocks: 0.64 M instructions to pack in time order, 2.4 M by first fit,
// 3.9 M by best fit, the blocks below and the arena besides), so a step
// is planned only once its pattern has repeated: the first step of a
// training loop, which also makes the optimizer's state, is seldom the
// one that repeats. A plan packed in time order or by first fit, under
// which the step skipped a request, is packed again by best fit, as
// every plan after it is (packReqs). The arena is then found for the
// next step (a plan in time order whose arena finds no room is packed
// again by first fit, tighter, and its arena sought again), and
// recording starts again.
func (a *Allocator) planStepLocked() {
	p := a.pol.plan
	// A step that had the plan's sizes whole has nothing in recSize; the
	// envelope (prevSize) is the plan's sizes already.
	same := p.same != nil && p.recSame > 0 && p.recSame == len(p.same)
	if !same {
		p.spellSameLocked()
	}
	p.same, p.recSame = nil, 0
	if p.packing.packedLow() && p.skips > p.stepSkips {
		p.bestFit = true // the plan is packed again below, if it goes on
	}
	if p.reqs != nil && p.skips-p.stepSkips > p.served-p.stepServed {
		// A crowded plan (planState.crowded) is dropped, not kept, and
		// quiet steps follow: the step that ended counts for nothing.
		p.crowded++
		p.reqs, p.sizes, p.packing = nil, nil, packBest
		p.prevSize, p.recSize, p.rec = p.prevSize[:0], p.recSize[:0], p.rec[:0]
		p.quiet = 1 << min(p.crowded, quietShifts-1)
		same = false
	}
	p.stepSkips, p.stepServed = p.skips, p.served
	p.mainStreamLocked()
	// A step found without marks (autoSteps) with side allocations is no
	// pattern: where the search puts a program's boundaries, the other
	// streams' allocations fall at other places from one step to the
	// next (offload's copy streams, depth layers ahead: 13 plans and 132
	// device calls, against none and 34, with them planned).
	mixed := p.auto != nil && slices.Contains(p.recSize, sideSize)
	kept := same || p.reqs != nil && !mixed && p.recStream == p.stream && fitsPlan(p.recSize, p.sizes)
	// A step of another shape than the plan's (another count of
	// allocations, or another main stream), after one that kept the
	// plan, spares it for the step after it: an optimizer's step every
	// few accumulated micro-batches, an evaluation every few steps. The
	// next step that does not fit the plan ends it.
	spare := !kept && p.reqs != nil && !p.spared && len(p.recSize) > 0 &&
		(mixed || p.recStream != p.stream || len(p.recSize) != len(p.sizes))
	p.spared = spare
	if spare {
		p.spares++
	}
	missed, planned := false, false
	if kept || spare {
		p.misses = 0
	} else if p.recording && len(p.recSize) > 0 {
		if p.reqs != nil {
			p.keepPlanLocked() // the plan ends; a step that comes back takes it up
		}
		switch {
		case !mixed && p.logOps && p.recStream == p.prevStream && fitsPlan(p.recSize, p.prevSize):
			// The pattern repeats, or the step fits the envelope of the
			// steps before it: planned with the envelope's sizes, or by
			// a kept plan that covers them, packed already.
			if i := p.keptForLocked(p.prevSize, p.prevStream, nil, p.prevStream); i >= 0 {
				p.takeUpLocked(i)
			} else {
				a.buildPlanLocked(p.prevSize)
				if p.reqs != nil {
					p.dropCoveredLocked(p.sizes, p.stream)
				}
			}
			p.misses, planned = 0, true
		case !mixed && len(p.kept) > 0:
			// A step of a kept plan's pattern, come back (training after
			// an evaluation): that plan again, from the next step on.
			if i := p.keptForLocked(p.recSize, p.recStream, p.prevSize, p.prevStream); i >= 0 {
				p.takeUpLocked(i)
				p.misses, planned = 0, true
				break
			}
			fallthrough
		default:
			p.misses, missed = p.misses+1, true // a new pattern: planned once a step fits it
		}
	}
	if p.reqs != nil && p.packing.packedLow() && p.bestFit {
		a.repackLocked(packBest) // the plan, or a kept plan taken up, packed in time order or by first fit
	}
	p.grew = false
	switch {
	case kept || planned || spare:
		// The envelope stays: the plan's sizes, under a plan.
	case mixed:
		p.prevSize = p.prevSize[:0] // the next step is compared with none
	case len(p.recSize) == 0:
	case mostlySide(p.recSize):
		// Most of the step ran on another stream than the envelope's:
		// the next step, with no envelope, chooses its main stream.
		p.prevSize = p.prevSize[:0]
	case p.recStream == p.prevStream && len(p.recSize) == len(p.prevSize) && sidesAgree(p.recSize, p.prevSize):
		// As many allocations on the stream as the envelope,
		// some larger: the envelope grows to hold both.
		for k, size := range p.recSize {
			p.prevSize[k] = max(p.prevSize[k], size)
		}
		p.grew = true
	default:
		p.prevSize, p.recSize = p.recSize, p.prevSize
		p.prevStream = p.recStream
	}
	p.rec, p.recSize = p.rec[:0], p.recSize[:0]
	p.recording = true
	if p.reqs == nil && p.quietLocked(missed) {
		p.recording = false // a quiet step: nothing is logged
	}
	p.logOps = p.reqs == nil && p.recording && len(p.prevSize) > 0 // without an envelope, nothing to fit
	if p.logOps {
		// A step that may fit the envelope is about as long: its logs
		// are made that long at once (an allocation and a free each),
		// rather than doubled up to it.
		p.rec = slices.Grow(p.rec, 2*len(p.prevSize))
		p.recSize = slices.Grow(p.recSize, len(p.prevSize))
	}
	if p.reqs != nil {
		p.same = p.sizes
	}
	if len(p.prevSize) > 0 {
		p.recStream = p.prevStream // the main stream (the plan's, under a plan)
	}
	p.pos = 0
	p.sinceMove++
	p.follow = p.reqs != nil && a.arenaLocked()
	if p.reqs != nil && !p.follow && p.packing == packTime {
		// No room for the arena in time order: by first fit it packs
		// tighter (a training step at its peak), and may fit.
		a.repackLocked(packFirst)
		p.follow = a.arenaLocked()
	}
}

// fitsPlan reports whether a step of the rounded sizes step fits a plan,
// or an envelope, of the rounded sizes plan: as many allocations, each no
// larger than the plan's at its position. Such a step (a last batch that
// is smaller, whose activations and temporaries shrink with it) is
// served from the plan and keeps it; with no plan, it is planned with
// the envelope's sizes.
func fitsPlan(step, plan []uint64) bool {
	if len(step) != len(plan) {
		return false
	}
	for k, size := range step {
		if !fitsAt(size, plan[k]) {
			return false
		}
	}
	return true
}

// sidesAgree reports whether two steps of as many allocations have their
// side allocations (sideSize) at the same positions.
func sidesAgree(a, b []uint64) bool {
	for k, size := range a {
		if (size == sideSize) != (b[k] == sideSize) {
			return false
		}
	}
	return true
}

// mostlySide reports whether most of a step's allocations are side ones.
func mostlySide(sizes []uint64) bool {
	return 2*countOf(sizes, sideSize) > len(sizes)
}

// fitsSoFar reports whether a step whose rounded sizes so far are step
// may still fit the envelope env: no more allocations, none larger.
func fitsSoFar(step, env []uint64) bool {
	return len(step) <= len(env) && fitsPlan(step, env[:len(step)])
}

// maxQuiet bounds a run of quiet steps (planState.quiet): 1 << quietShifts.
const (
	quietShifts = 6
	maxQuiet    = 1 << quietShifts
)

// quietLocked reports whether the next step is quiet, at a boundary
// without a plan; missed says whether the step that ended was a miss (a
// step recorded with allocations that fit no envelope). From the fourth
// miss in a row, every second one starts a run of quiet steps twice as
// long as the one before, up to maxQuiet; a step without allocations is
// no miss and starts none.
func (p *planState) quietLocked(missed bool) bool {
	if p.quiet > 0 {
		p.quiet--
		return true
	}
	if missed && p.misses >= 4 && p.misses%2 == 0 {
		// Runs of 1, 2, 4, ... steps, the doubling bounded before the shift:
		// misses grows without bound where nothing repeats.
		p.quiet = 1<<min(p.misses/2-2, quietShifts) - 1 // this step is the first
		p.prevSize = p.prevSize[:0]                     // the next recorded step is compared with none
		return true
	}
	return false
}
