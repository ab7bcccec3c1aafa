// This file holds the plans the planned policy keeps once they end
// (policy_plan.go has the policy's model): a program whose steps change
// shape for a while and come back (an evaluation of several steps every
// so many training steps, then training again) finds its plan again at
// the first step back, without packing it again.

package allocator

import (
	"slices"

	"github.com/gpumem/gpumem/device"
)

// maxKeptPlans bounds the plans kept: the oldest goes first. A training
// loop with an evaluation and a test pass has three shapes of step.
const maxKeptPlans = 3

// keptPlan is a plan that ended, as it was: its requests (the offsets,
// the blocks below), their sizes and stream, and its arena's bytes. Its
// arena is not held: a plan taken up again finds one (arenaLocked).
type keptPlan struct {
	reqs    []planReq
	sizes   []uint64
	stream  device.Stream
	foot    uint64
	packing packing
}

// keepPlanLocked keeps the current plan, which ends: the planned policy
// has no plan after it. A kept plan that this one covers (the same
// stream and count of requests, none larger) goes: this one serves
// every step it would.
func (p *planState) keepPlanLocked() {
	k := keptPlan{reqs: p.reqs, sizes: p.sizes, stream: p.stream, foot: p.foot, packing: p.packing}
	for i := range k.reqs {
		k.reqs[i].at = nil // blocks of the steps it served: a walk starts elsewhere
	}
	p.dropCoveredLocked(k.sizes, k.stream)
	if len(p.kept) == maxKeptPlans {
		p.kept = slices.Delete(p.kept, 0, 1)
	}
	p.kept = append(p.kept, k)
	p.reqs, p.sizes, p.packing = nil, nil, packBest // the sizes are the kept plan's now
}

// dropCoveredLocked forgets the kept plans that a plan of sizes on stream
// s covers.
func (p *planState) dropCoveredLocked(sizes []uint64, s device.Stream) {
	p.kept = slices.DeleteFunc(p.kept, func(k keptPlan) bool {
		return k.stream == s && fitsPlan(k.sizes, sizes)
	})
}

// keptForLocked returns the kept plan that serves a step of the rounded
// sizes step on stream s and covers the envelope env of the steps before
// it on stream es where the envelope has as many sizes (the envelope the
// step grows), -1 when there is none: of those, the one with the
// smallest arena.
func (p *planState) keptForLocked(step []uint64, s device.Stream, env []uint64, es device.Stream) int {
	best := -1
	for i, k := range p.kept {
		if k.stream != s || !fitsPlan(step, k.sizes) {
			continue
		}
		if es == s && len(env) == len(step) && !fitsPlan(env, k.sizes) {
			continue
		}
		if best < 0 || k.foot < p.kept[best].foot {
			best = i
		}
	}
	return best
}

// takeUpLocked makes kept plan i the plan again, its sizes the envelope.
func (p *planState) takeUpLocked(i int) {
	k := p.kept[i]
	p.kept = slices.Delete(p.kept, i, i+1)
	p.reqs, p.sizes, p.stream, p.foot, p.packing = k.reqs, k.sizes, k.stream, k.foot, k.packing
	p.moves = 0
	p.prevSize = append(p.prevSize[:0], k.sizes...)
	p.prevStream = k.stream
	p.reuses++
}

// checkKeptLocked adds the kept plans to checkPlanLocked: at most
// maxKeptPlans, each whole (a size for each request, every block of its
// arena within it, no block of a step it served), none sharing its
// requests or sizes with the plan.
func (a *Allocator) checkKeptLocked(bad func(format string, args ...any)) {
	p := a.pol.plan
	if len(p.kept) > maxKeptPlans {
		bad("the planned policy keeps %d plans, more than %d", len(p.kept), maxKeptPlans)
	}
	for i, k := range p.kept {
		if len(k.sizes) != len(k.reqs) || len(k.reqs) == 0 {
			bad("kept plan %d has %d sizes for %d requests", i, len(k.sizes), len(k.reqs))
			continue
		}
		if p.reqs != nil && &p.reqs[0] == &k.reqs[0] || len(p.sizes) > 0 && &p.sizes[0] == &k.sizes[0] {
			bad("kept plan %d shares its requests or sizes with the plan", i)
		}
		for j, r := range k.reqs {
			if r.size != k.sizes[j] || r.arena && r.off+r.size > k.foot || r.at != nil {
				bad("kept plan %d: request %d of %d bytes (size %d) at offset %d of an arena of %d bytes, a block of a step: %v", i, j, r.size, k.sizes[j], r.off, k.foot, r.at != nil)
				break
			}
		}
	}
}
