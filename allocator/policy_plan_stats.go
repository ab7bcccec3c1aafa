// This file holds PlanStats, the planned policy's figures for the program
// that runs it (policy_plan.go has the policy's model).

package allocator

// PlanStats are the planned policy's figures (Config.Policy
// PolicyPlanned): how its plans of repeated steps have served the program
// since the allocator was made. From them a program sees whether its
// steps are planned, and how much of each the plan serves.
type PlanStats struct {
	// Plans counts the steps packed into an arena: each one a step that
	// repeated the one before it, or fit the largest sizes of the steps
	// before it.
	Plans int64 `json:"plans"`
	// Served counts the requests handed a block at their place in an
	// arena: no search of the free blocks, no device call.
	Served int64 `json:"served"`
	// Skips counts the requests of a step following its plan whose place
	// was not wholly free: each was served online, and the step went on
	// following the plan.
	Skips int64 `json:"skips"`
	// Departures counts the steps that stopped following their plan at
	// a request larger than the plan's, on another stream than the
	// plan's at its position, or past the plan's end, or after the
	// arena's segment was released (EmptyCache): that request and the
	// rest of the step were served online.
	Departures int64 `json:"departures"`
	// Spared counts the steps of another shape than their plan's
	// (another count of requests, or another main stream) that kept
	// it all the same, each right after a step that kept it: an
	// optimizer's step every few micro-batches, an evaluation now and
	// then.
	Spared int64 `json:"spared"`
	// Reused counts the plans taken up again: a plan that ended is kept
	// (the last few), and a step of its pattern that comes back (training
	// after several steps of evaluation) makes it the plan again, with no
	// packing (Plans does not count it).
	Reused int64 `json:"reused"`
	// Repacks counts the plans packed again. The plan of a step the
	// program marks is packed in time order (each block, as it comes
	// into use, in the smallest free gap that holds it: the cheapest
	// packing, a few tenths of a percent looser than greedy by size on a
	// training step; by first fit at once where it lies more than 1 %
	// above the step's peak); where its arena finds no room, it is
	// packed again by first fit
	// (greedy by size, the lowest free place for each block, which packs
	// a training step to its peak). A step under a plan packed either way
	// that skipped a request makes it, and every plan after it, packed by
	// best fit, under which steps that vary from their plan skip less. A
	// step the policy finds itself is packed by best fit from the start.
	Repacks int64 `json:"repacks"`
	// TimeOrdered counts the packings by size, of Plans and Repacks,
	// made in time order instead: a step whose packing by size would
	// read more than 2^24 placed blocks (more than about 5,800 blocks in
	// use at once), which the boundary would spend long on under the
	// allocator's lock, is packed in time order, in O(n log n). (A marked
	// step's first packing, in time order by choice, is not counted.)
	TimeOrdered int64 `json:"time_ordered"`
	// ArenaBytes is the current plan's arena, in whole pages (0 with no
	// plan); Following reports whether the current step follows the plan
	// so far.
	ArenaBytes uint64 `json:"arena_bytes"`
	Following  bool   `json:"following"`
	// FoundPeriod is, in a program that marks no step, the number of
	// allocations of the steps the policy found itself (the period of
	// its allocations and frees; where the steps start from a floor of
	// their own, the boundaries follow it, and steps of another length,
	// an evaluation's, are delimited too): 0 while it has found none,
	// and once the program marks a step (MarkStep), whose marks then
	// delimit the steps.
	FoundPeriod int64 `json:"found_period"`
}

// PlanStats returns the planned policy's figures, and false under any
// other policy, where there are none. Without virtual memory the planned
// policy plans nothing, and its figures stay zero.
func (a *Allocator) PlanStats() (PlanStats, bool) {
	if !a.made() || a.pol == nil || a.pol.plan == nil {
		return PlanStats{}, false
	}
	a.lockAll()
	defer a.unlockAll()
	p := a.pol.plan
	st := PlanStats{Plans: p.plans, Served: p.served, Skips: p.skips, Departures: p.departures, Spared: p.spares, Reused: p.reuses, Repacks: p.repacks, TimeOrdered: p.timeOrdered, Following: p.follow}
	if p.reqs != nil {
		st.ArenaBytes = p.foot
	}
	if p.auto != nil {
		st.FoundPeriod = p.auto.period
	}
	return st, true
}
