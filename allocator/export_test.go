package allocator

import (
	"github.com/gpumem/gpumem/allocator/internal/freeindex"
	"github.com/gpumem/gpumem/device"
)

// SelfCheck tells the external tests whether this build checks the
// invariants after every operation (the gpumem_invariants tag), so that
// the long ones can shrink.
const SelfCheck = selfCheck

// liveBlock returns the allocated block at p, or nil, for tests that
// reach into the allocator (which must not run concurrently with them).
func (a *Allocator) liveBlock(p device.Ptr) *freeindex.Block {
	b, _ := a.liveBlockLocked(p, nil)
	return b
}

// Lent returns the number of blocks the low_fragmentation policy has lent
// across streams and that are still allocated, for the fault matrix.
func (a *Allocator) Lent() int {
	a.lockAll()
	defer a.unlockAll()
	if a.pol == nil {
		return 0
	}
	return a.pol.borrowed
}

// PlanCounts returns the planned policy's counts: steps planned, requests
// served from an arena, departures from the plan.
func (a *Allocator) PlanCounts() (plans, served, departures int64) {
	a.lockAll()
	defer a.unlockAll()
	p := a.pol.plan
	return p.plans, p.served, p.departures
}

// PlanSkips returns how many requests the planned policy served online
// because their place in the arena was not wholly free.
func (a *Allocator) PlanSkips() int64 {
	a.lockAll()
	defer a.unlockAll()
	return a.pol.plan.skips
}

// PlanWalks returns how many requests the planned policy served from an
// arena without finding the place from the block just below it (the
// walk from another block of the arena).
func (a *Allocator) PlanWalks() int64 {
	a.lockAll()
	defer a.unlockAll()
	return a.pol.plan.walks
}
