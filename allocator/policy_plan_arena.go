// This file holds the planned policy's arena (policy_plan.go has the
// policy's model): where a boundary finds the address range a step that
// follows the plan is served from, and when it maps one anew.

package allocator

import (
	"github.com/gpumem/gpumem/allocator/internal/freeindex"
	"github.com/gpumem/gpumem/device"
)

// arenaLocked finds the plan's arena: an address range of p.foot bytes
// of the large pool, wholly free and mapped. It reports false when there
// is none and none can be mapped (the step then runs online).
func (a *Allocator) arenaLocked() bool {
	p := a.pol.plan
	xs := a.indexesLocked(p.stream)
	if xs == nil {
		return false
	}
	f := p.foot
	if f == 0 {
		return true
	}
	if seg := p.seg; seg != nil && a.segments[seg.Ptr()] == seg {
		if b := p.floor(); b != nil && b.IsFree() && b.Ptr()+device.Ptr(b.Size()) >= p.addr+device.Ptr(f) {
			return true // the arena is still whole
		}
	}
	x := &xs[qLarge]
	b := x.Fit(f)
	if b == nil && p.moves > 0 && p.sinceMove < 1<<min(p.moves, 20) {
		return false // broken again soon after a move: online this step
	}
	if b == nil {
		// The step's blocks are free again: give back their pages and
		// map the arena in one range, with no page ahead of it (the
		// arena is what a step that follows the plan needs; pages mapped
		// ahead would sit beside it unused, as the pages given back
		// did); unless the device's memory, with those pages, is short
		// of the arena (memory the free blocks' neighbours pin stays):
		// the step then runs online, in the memory as the last step left
		// it (unmapping everything first would leave the next step to
		// map it again, elsewhere).
		a.collected = a.collected[:0]
		for q := range xs {
			if xs[q].Kind() != freeindex.KindSmall {
				xs[q].AscendAtLeast(kSmallBuffer, func(b *freeindex.Block) bool {
					a.collected = append(a.collected, b)
					return true
				})
			}
		}
		var whole uint64
		for _, c := range a.collected {
			if c.Seg().Expandable() {
				whole += wholePages(c)
			}
		}
		if room := a.total - min(a.total, a.reservedLocked()) + whole; room >= f && (a.allowed == 0 || a.allowed-min(a.allowed, a.reservedLocked())+whole >= f) {
			for _, c := range a.collected {
				if c.Seg().Expandable() && wholePages(c) > 0 {
					_ = a.unmapLocked(c) // a refusal leaves it mapped
				}
			}
			clear(a.collected)
			a.collected = a.collected[:0]
			if b, _ = a.policyGrowLocked(x, f, false); b != nil {
				p.moves, p.sinceMove = p.moves+1, 0
			}
		}
		clear(a.collected)
		a.collected = a.collected[:0]
	}
	if b == nil {
		return false
	}
	// The top of b: the requests served online while the steps follow
	// the plan (the blocks they keep, the skips) carve b's low end, the
	// lowest address of the block that fits them, and leave the arena
	// whole for the next step (on eor_cnn, at b's bottom, they landed in
	// it, and the next boundary unmapped the free pages and mapped an
	// arena elsewhere: 10 device calls instead of 3).
	p.addr, p.seg = b.Ptr()+device.Ptr(b.Size()-f), b.Seg()
	p.last, p.bottom = nil, b
	return true
}
