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

// PlanCounts returns three of PlanStats: steps planned, requests served
// from an arena, departures from the plan.
func (a *Allocator) PlanCounts() (plans, served, departures int64) {
	st, _ := a.PlanStats()
	return st.Plans, st.Served, st.Departures
}

// PlanWalkStart returns the block a walk to the arena's first address
// starts from (planState.walkStart): its address and size, and whether
// it is its segment's first block; and the arena's address. False with
// no plan.
func (a *Allocator) PlanWalkStart() (from device.Ptr, size uint64, first bool, addr device.Ptr, ok bool) {
	a.lockAll()
	defer a.unlockAll()
	p := a.pol.plan
	if p.reqs == nil || p.seg == nil {
		return 0, 0, false, 0, false
	}
	b := p.walkStart(p.addr)
	return b.Ptr(), b.Size(), b == p.seg.Head(), p.addr, true
}

// PlanWalks returns how many requests the planned policy served from an
// arena without finding the place from the block just below it (the
// walk from another block of the arena).
func (a *Allocator) PlanWalks() int64 {
	a.lockAll()
	defer a.unlockAll()
	return a.pol.plan.walks
}

// SetMarkedPacking sets how a marked step is packed first (markedPacking)
// to "time" order or "first" fit, and returns a function that restores
// it.
func SetMarkedPacking(how string) func() {
	old := markedPacking
	markedPacking = map[string]packing{"time": packTime, "first": packFirst}[how]
	return func() { markedPacking = old }
}

// PlanPacking reports how the current plan was packed (packReqs): "best"
// or "first" fit, in "time" order, or in time order as "large", and
// whether there is a plan.
func (a *Allocator) PlanPacking() (string, bool) {
	a.lockAll()
	defer a.unlockAll()
	if a.pol == nil || a.pol.plan == nil || a.pol.plan.reqs == nil {
		return "", false
	}
	return [...]string{packBest: "best", packFirst: "first", packTime: "time", packLarge: "large"}[a.pol.plan.packing], true
}
