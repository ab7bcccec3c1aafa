// This file holds the planned policy's record of a step (policy_plan.go
// has the policy's model): the log of what the step allocates and frees,
// or under a plan only the count of the plan's sizes it keeps, and the
// step boundary that keeps the plan, plans the step or ends the plan.

package allocator

import (
	"github.com/gpumem/gpumem/allocator/internal/freeindex"
	"github.com/gpumem/gpumem/device"
)

// planAllocatedLocked logs the allocation of b, of rounded bytes on
// stream s, in the step being recorded; the ledger's hand-out asks
// countSameLocked first. A step on a second stream is no pattern: from
// then on it logs nothing (recMixed).
func (a *Allocator) planAllocatedLocked(b *freeindex.Block, rounded uint64, s device.Stream) {
	p := a.pol.plan
	if !p.recording || p.recMixed {
		return
	}
	if p.same != nil {
		p.spellSameLocked()
	}
	if len(p.recSize) == 0 {
		p.recStream = s
	} else if s != p.recStream {
		p.recMixed = true
		p.stopOpsLocked()
		return
	}
	if p.logOps {
		if k := len(p.recSize); k < len(p.prevSize) && rounded <= p.prevSize[k] && s == p.prevStream {
			p.rec = append(p.rec, planOp{ptr: b.Ptr(), pos: int32(k)})
		} else {
			p.stopOpsLocked()
		}
	}
	p.recSize = append(p.recSize, rounded)
}

// stopOpsLocked stops logging the step's operations, and forgets those
// logged, once the step cannot fit the envelope (fitsPlan: an allocation
// past its count, larger than its size at the position, or on another
// stream) or allocates on a second stream: such a step is never packed,
// and what the boundary reads of it (its sizes, its stream) is logged
// apart. A step that cannot be planned pays for the sizes alone: the
// first step of all, which has no envelope, logs no operation, and
// BERT's second step stops at its 698th allocation (where AdamW's first
// step, the envelope, made its state).
func (p *planState) stopOpsLocked() {
	p.logOps = false
	p.rec = p.rec[:0]
}

// countSameLocked counts an allocation of rounded bytes on stream s as
// the plan's (recSame) and reports true when the step so far has the
// plan's sizes and this one is the plan's next on its stream; small
// enough to be inlined into the ledger's hand-out, which logs the
// allocation (planAllocatedLocked) otherwise.
func (p *planState) countSameLocked(rounded uint64, s device.Stream) bool {
	if k := p.recSame; k < len(p.same) && p.same[k] == rounded && s == p.stream {
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
	if p.logOps { // never in a step on several streams (stopOpsLocked)
		p.rec = append(p.rec, planOp{ptr: ptr, pos: -1})
	}
	if p.auto != nil {
		a.floorFreedLocked(sh) // steps found without marks, at their floor
	}
}

// planStepLocked runs at a step boundary under the planned policy: a step
// with the plan's pattern (served from the arena or not), one that fits
// it (fitsPlan: the plan's stream, as many allocations, none larger than
// the plan's), or one that allocated nothing, keeps it; a step that
// fits the envelope of the steps before it (prevSize: the step before
// it, or the largest sizes of the last steps with as many allocations on
// the stream) is planned with the envelope's sizes, so that steps whose
// sizes go up and down (batches of varying length) are served once the
// largest has been seen, and a step that repeats the one before it is
// planned as it was; a step of another shape than the plan's (another
// count of allocations, another stream or several) after one that kept
// the plan spares it (planState.spared); any other ends the plan, which
// is kept (keepPlanLocked), and takes up a kept plan that it fits
// (training back after an evaluation), or grows the envelope (a step
// with as many allocations on its stream) or is the envelope the next
// step is compared with, unless it allocated on several streams: that is
// no pattern, and the next step fits nothing.
// Planning costs up to n^2/2 reads of blocks for a step whose blocks are
// mostly in use at once (internal/pack's Greedy: about 4 M instructions
// for BERT's 1,004-block step), so a step is planned only once its
// pattern has repeated: the first step of a training loop, which also
// makes the optimizer's state, is seldom the one that repeats. The arena
// is then found for the next step, and recording starts again.
func (a *Allocator) planStepLocked() {
	p := a.pol.plan
	// A step that had the plan's sizes whole has nothing in recSize; the
	// envelope (prevSize) is the plan's sizes already.
	same := p.same != nil && p.recSame > 0 && p.recSame == len(p.same)
	if !same {
		p.spellSameLocked()
	}
	p.same, p.recSame = nil, 0
	kept := same || p.reqs != nil && !p.recMixed && p.recStream == p.stream && fitsPlan(p.recSize, p.sizes)
	// A step of another shape than the plan's (another count of
	// allocations, another stream, or several), after one that kept the
	// plan, spares it for the step after it: an optimizer's step every
	// few accumulated micro-batches, an evaluation every few steps. The
	// next step that does not fit the plan ends it.
	spare := !kept && p.reqs != nil && !p.spared && len(p.recSize) > 0 &&
		(p.recMixed || p.recStream != p.stream || len(p.recSize) != len(p.sizes))
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
		case p.logOps && !p.recMixed && p.recStream == p.prevStream && fitsPlan(p.recSize, p.prevSize):
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
		case !p.recMixed && len(p.kept) > 0:
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
	p.grew = false
	switch {
	case kept || planned || spare:
		// The envelope stays: the plan's sizes, under a plan.
	case p.recMixed:
		p.prevSize = p.prevSize[:0] // its log stopped at its second stream
	case len(p.recSize) == 0:
	case p.recStream == p.prevStream && len(p.recSize) == len(p.prevSize):
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
	p.recMixed, p.recording = false, true
	if p.reqs == nil && p.quietLocked(missed) {
		p.recording = false // a quiet step: nothing is logged
	}
	p.logOps = p.reqs == nil && p.recording && len(p.prevSize) > 0 // without an envelope, nothing to fit
	if p.reqs != nil {
		p.same = p.sizes
	}
	p.pos = 0
	p.follow = p.reqs != nil && a.arenaLocked()
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
		if size > plan[k] {
			return false
		}
	}
	return true
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
