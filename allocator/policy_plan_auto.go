// This file holds the planned policy's steps found without marks: a
// program that never calls MarkStep gets step boundaries where its
// allocations repeat (policy_plan.go has the policy's model).

package allocator

import (
	"github.com/gpumem/gpumem/allocator/internal/freeindex"
	"github.com/gpumem/gpumem/stats"
)

// autoSteps finds the period of a program's allocations, for the planned
// policy on a program that marks no step, and then marks a step boundary
// before every allocation that starts a step, as MarkStep would mark it
// for the plan (not for the step counts of Leaks): where the shard comes
// back to the period's floor (below), else a period after the last.
//
// The model: allocation n has a token (its stream and the frees since
// the allocation before it) and a level (the number of blocks its
// stream's shard held just before it). A training or serving loop
// repeats its step: the same tokens at the same levels, period after
// period, whatever the sizes of its blocks, which a batch of another
// size or length changes while the order of its allocations and frees
// stays. A period c is found when the last c allocations have the
// tokens and levels of the c before them, and the bytes allocated at the
// boundary (below) are those of a period before: a step leaves what it
// keeps as it found it (the weights, the optimizer's state), while a
// loop whose memory grows from one repeat to the next (a generation
// loop's cache, a token a step) is no step.
// Candidates come from a table of recent contexts (an allocation's token
// and level and the two tokens before it), filed by position for one
// allocation in four, chosen by its token and level, so that the same
// ones are filed in every period: an allocation whose context was filed
// c allocations ago makes c the candidate, and the allocations after it
// confirm it one by one or drop it. The level keeps out the shorter periods inside a
// step: a training step's layers repeat their tokens, but each layer's
// forward pass holds its activations, so the levels climb; a repeat of
// tokens and levels is a whole step (or, where levels return between
// layers, as in inference without gradients, a layer, which the plan
// then serves). The boundary goes where the bytes allocated are lowest
// within the period (its first allocation with that few): where a
// training step's temporaries are all freed, as a step mark puts it.
// Where no other allocation of the period has its level and bytes before
// it, that state is the period's floor: every step of the loop starts
// from it, an evaluation's steps too, so the boundaries after the first
// go where the shard comes back to it, and steps of another length keep
// them at the steps' starts. A step that does not come back within four
// periods drops the period at once: the memory the program keeps has
// changed, and the search finds its steps again.
//
// The first boundary starts the plan's record, the second finds nothing
// to repeat (or a kept plan that the step fits, taken up again), and the
// third plans the step if it repeated (as with marks): a step is planned
// two periods later than marks would have it. A
// boundary whose step fit nothing counts as a miss, unless the tokens
// and levels of its period repeated the period before and the step only
// grew the envelope of the steps before it (a larger batch: the plan
// machinery's own rule plans the next step that fits it); after
// autoMisses in a row without a plan the period is dropped, the plan's
// record stops, and the search starts again (the program's pattern
// changed, or the boundaries drifted).
//
// The search costs a hand-out the record of its token and levels, and
// one in four a table lookup (takeLocked calls searchStepsLocked); a
// free, nothing: the levels are read from the shard's counters. It holds
// 64 KiB of contexts and a history that doubles as allocations come, to
// 384 KiB at autoHistory of them; periods of up to autoHistory-1
// allocations are found. A first MarkStep drops the search for good:
// marks are the program's own word (a program that marks its steps
// after a few hundred allocations pays for a few KiB of history).
//
// What it cannot find: a loop whose allocations and frees alternate one
// by one throughout, every position the same to the search (its sizes
// alone tell them apart), is no pattern to it; the cache serves such a
// loop, one block in use at a time, as well as a plan would. (Before
// the search compared the order of operations it compared sizes, and
// found only steps that repeated exactly.)
type autoSteps struct {
	hist  []autoRec           // by allocation, modulo its length (a power of two, autoHistory once grown)
	slots [autoSlots]autoSlot // recent contexts: the last allocation of each

	held int64 // the level before the last allocation: its token's frees follow from it

	n int64 // allocations seen

	cand, run int64 // the candidate period and the allocations that confirmed it in a row
	period    int64 // the period found, 0 while searching
	next      int64 // while a period is found: the allocation that starts the next step
	misses    int   // boundaries in a row whose step fit nothing, without a plan
	broken    bool  // an allocation since the last boundary differs from the one a period before
	low       autoLow

	// The floor: where the period's first allocation with the fewest
	// bytes is the only one of the period with its level and bytes
	// before it, the boundaries go where the shard comes back to them
	// (floorHeld blocks of floorBytes, in 512 bytes), after a free or an
	// allocation, so that steps of another length between them (an
	// evaluation) keep them at the steps' starts; a step that never
	// comes back gets one at next, four periods after its start, which
	// drops the period (the memory the program keeps has changed: the
	// search finds its steps again). start is the allocation that
	// started the step.
	floor      bool // from the first boundary on, where the period has one (hasFloor)
	hasFloor   bool
	floorHeld  uint32
	floorBytes uint32
	start      int64
	forced     bool // the boundary due is one four periods after the step's start, not at the floor
}

// An autoLow is, while a candidate period is confirmed, the first of the
// allocations that confirmed it with the fewest bytes allocated before
// it (n), those bytes, and the bytes before the allocation a period
// earlier, in 512 bytes.
type autoLow struct {
	n             int64
	bytes, before uint32
}

// An autoRec is what the search keeps of an allocation: its token, the
// level before it (blocks held) and the bytes allocated before it, in
// 512 bytes (exact to 2 TiB).
type autoRec struct {
	tok, lvl, bytes uint32
}

// An autoSlot files the last allocation of a context (its position
// modulo 2^32: the difference of two is right while it is below that).
type autoSlot struct {
	key, pos uint32
}

const (
	autoHistory   = 1 << 15 // allocations remembered: the longest period found is one less
	autoSlots     = 1 << 13 // contexts remembered
	autoMinPeriod = 16      // shorter periods are left to the cache
	autoMisses    = 3       // boundaries that fit nothing before the period is dropped
)

// allocated records an allocation on stream s (a small number: the
// token keeps its low 24 bits) made when its shard held held blocks of
// bytes bytes, and reports whether the next allocation starts a step.
// While it searches, one allocation in four, chosen by its token and
// level (so the same ones in every period), files its context and looks
// for it; the others cost the record and a multiplication.
func (d *autoSteps) allocated(s uint32, held, bytes, size int64) bool {
	// The frees since the allocation before: it left held+1 blocks.
	frees := min(uint64(max(d.held+1-held, 0)), 255)
	t, lv := uint32(frees)|s<<8, uint32(held)
	n := d.n
	d.held = held
	if n == int64(len(d.hist)) && n < autoHistory {
		d.grow()
	}
	d.hist[n&int64(len(d.hist)-1)] = autoRec{t, lv, uint32(uint64(bytes) >> 9)}
	d.n = n + 1
	if d.period|d.cand == 0 && (uint64(lv)|uint64(t)<<32)*0x9e3779b97f4a7c15>>62 != 0 {
		return false
	}
	if d.more(n, t, lv) {
		if d.forced && d.atFloor(held+1, bytes+size) {
			d.forced = false
		}
		return true
	}
	return d.floor && d.atFloor(held+1, bytes+size)
}

// atFloor reports whether a shard that holds held blocks of bytes bytes,
// after an allocation or a free, is at the floor of the period found, a
// step long enough after the last boundary: the next allocation starts
// a step.
func (d *autoSteps) atFloor(held, bytes int64) bool {
	return d.floor && uint32(held) == d.floorHeld && uint32(uint64(bytes)>>9) == d.floorBytes && d.n-d.start >= autoMinPeriod
}

// more is allocated's search for allocation n, filed, and its count of
// the period once found.
func (d *autoSteps) more(n int64, t, level uint32) bool {
	if c := d.period; c > 0 {
		if e := d.at(n - c); e.tok != t || e.lvl != level {
			d.broken = true
		}
		if d.n == d.next {
			d.forced = d.floor // four periods without the floor
			return true
		}
		return false
	}
	if c := d.cand; c > 0 {
		if e := d.at(n - c); e.tok != t || e.lvl != level {
			d.cand, d.run = 0, 0
			return false
		}
		if b := d.at(n).bytes; b < d.low.bytes {
			d.low = autoLow{n, b, d.at(n - c).bytes}
		}
		if d.run++; d.run >= c {
			d.found()
			return d.period > 0 && d.n == d.next
		}
		return false
	}
	if n < 2 {
		return false
	}
	h := (uint64(level) | uint64(t)<<32) * 0x9e3779b97f4a7c15
	h ^= (uint64(d.at(n-1).tok) | uint64(d.at(n-2).tok)<<32) * 0xc2b2ae3d27d4eb4f
	sl, key := &d.slots[h>>(64-13)&(autoSlots-1)], uint32(h)
	if sl.key == key {
		if c := int64(uint32(n) - sl.pos); c >= autoMinPeriod && c < autoHistory {
			if e := d.at(n - c); e.tok == t && e.lvl == level {
				d.cand, d.run = c, 1
				d.low = autoLow{n, d.at(n).bytes, e.bytes}
			}
		}
	}
	sl.key, sl.pos = key, uint32(n)
	return false
}

// at returns the record of allocation i, one of the last len(d.hist).
func (d *autoSteps) at(i int64) *autoRec {
	return &d.hist[i&int64(len(d.hist)-1)]
}

// grow doubles the history (to 256 records from none), once it is full
// and shorter than autoHistory: the records of allocations 0 to len-1
// keep their places. A program that marks its steps, which drops the
// search, never pays for the whole of it.
func (d *autoSteps) grow() {
	h := make([]autoRec, max(256, 2*len(d.hist)))
	copy(h, d.hist)
	d.hist = h
}

// found makes the candidate the period, confirmed by allocation n,
// where the bytes allocated at its boundary are those of a period
// before, and drops the candidate otherwise: the next step starts a
// period after the first allocation of the last period with the fewest
// bytes allocated.
func (d *autoSteps) found() {
	c := d.cand
	d.cand, d.run = 0, 0
	if d.low.bytes != d.low.before {
		return // memory that grows from one repeat to the next
	}
	d.period, d.next = c, d.low.n+c
	d.misses, d.broken = 0, false
	// The floor, where no other allocation of the period has its level
	// and bytes (the boundary is first counted: next).
	fl, fb, same := d.at(d.low.n).lvl, d.low.bytes, 0
	for i := d.low.n - c + 1; i <= d.low.n; i++ {
		if e := d.at(i); e.lvl == fl && e.bytes == fb {
			same++
		}
	}
	d.hasFloor, d.floorHeld, d.floorBytes, d.start = same == 1, fl, fb, d.low.n
}

// drop forgets the period: the search starts again, with no context
// filed (those filed before the period was found would offer its
// multiples).
func (d *autoSteps) drop() {
	d.period, d.next, d.cand, d.run, d.misses = 0, 0, 0, 0, 0
	d.broken, d.floor, d.hasFloor, d.forced = false, false, false, false
	clear(d.slots[:])
}

// searchStepsLocked records the hand-out of f by shard sh in the search
// for steps (takeLocked, alone or through handedOutLocked): its stream,
// and the blocks and bytes the shard had allocated before it (the steps
// planned are on one stream).
func (a *Allocator) searchStepsLocked(sh *shard, f *freeindex.Block) {
	c, b := &sh.st[stats.Allocation], &sh.st[stats.AllocatedBytes]
	held, size := c.pool[0].Value()+c.pool[1].Value()-1, int64(f.Size())
	if a.pol.plan.auto.allocated(uint32(f.Stream()), held, b.pool[0].Value()+b.pool[1].Value()-size, size) {
		a.pol.plan.autoDue = true
	}
}

// floorFreedLocked puts a step boundary before the next allocation where
// a free the caller asked for brings shard sh back to the floor of the
// period found, while the search keeps one (autoSteps.floor); the free's
// ledger calls it while the search runs.
func (a *Allocator) floorFreedLocked(sh *shard) {
	d := a.pol.plan.auto
	if !d.floor {
		return
	}
	c, b := &sh.st[stats.Allocation], &sh.st[stats.AllocatedBytes]
	if d.atFloor(c.pool[0].Value()+c.pool[1].Value(), b.pool[0].Value()+b.pool[1].Value()) {
		a.pol.plan.autoDue, d.forced = true, false
	}
}

// The hooks (Allocator.hooks) of takeLocked and the frees.
const (
	hookListen = 1 << iota // observers, the step counts or the plan's record of steps found without marks
	hookSearch             // the planned policy's search for steps: takeLocked tells it
)

// setHooksLocked sets the hooks from what listens (hooksLocked).
func (a *Allocator) setHooksLocked() { a.hooks = a.hooksLocked() }

// hooksLocked returns the hooks that what listens asks for: observers,
// the step counts of MarkStep, the planned policy's record of steps
// found without marks (hookListen), and its search for them
// (hookSearch).
func (a *Allocator) hooksLocked() uint8 {
	var h uint8
	if len(a.observers) > 0 || a.stepping {
		h |= hookListen
	}
	if p := a.pol; p != nil && p.plan != nil && p.plan.auto != nil {
		h |= hookSearch
		if p.plan.recording || p.plan.auto.floor {
			h |= hookListen
		}
	}
	return h
}

// checkAutoLocked adds the search for steps to checkPlanLocked: it runs
// only before a mark; a boundary is due only before the allocation that
// starts a period found (anywhere at its floor), the order of a period
// is broken, and its floor kept, only where one is found, and the next
// boundary is never behind the allocations;
// the hooks are what listens asks for.
func (a *Allocator) checkAutoLocked(bad func(format string, args ...any)) {
	p := a.pol.plan
	d := p.auto
	if d != nil && a.stepping {
		bad("the search for steps runs after a mark")
	}
	if p.autoDue && (d == nil || d.period == 0 || !d.floor && d.n != d.next) {
		bad("a step boundary is due where no period starts")
	}
	if d != nil && (d.period == 0 && (d.floor || d.hasFloor || d.forced) || d.floor && !d.hasFloor) {
		bad("the search has a floor (%v, found: %v) or a boundary forced (%v) with a period of %d", d.floor, d.hasFloor, d.forced, d.period)
	}
	if d != nil && d.period == 0 && d.broken {
		bad("the search saw an allocation break the order of a period, with no period")
	}
	if d != nil && d.period > 0 && d.next < d.n {
		bad("the search's next boundary, before allocation %d, is behind allocation %d", d.next, d.n)
	}
	if h := a.hooksLocked(); a.hooks != h {
		bad("hooks %#b, where what listens asks for %#b", a.hooks, h)
	}
}

// stepIfDueLocked runs autoStepLocked where the search for steps put a
// boundary before this allocation (allocWorld).
func (a *Allocator) stepIfDueLocked() {
	if a.pol != nil && a.pol.plan != nil && a.pol.plan.autoDue {
		a.autoStepLocked()
	}
}

// autoStepLocked marks the step boundary that the search for steps put
// before this allocation (planState.autoDue), in the world, and drops
// the period after autoMisses boundaries in a row that planned nothing
// and fit nothing, stopping the plan's record.
func (a *Allocator) autoStepLocked() {
	p := a.pol.plan
	d := p.auto
	p.autoDue = false
	d.next, d.start = d.n+d.period, d.n // this allocation, the next (d.n), starts the step
	if d.floor = d.hasFloor; d.floor {
		d.next = d.n + 4*d.period // the frees tell the floor from now on (floorFreedLocked)
	}
	missed := p.misses
	a.planStepLocked()
	broken := d.broken
	d.broken = false
	switch {
	case p.reqs != nil:
		d.misses = 0
	case p.misses > missed && (broken || !p.grew):
		if d.misses++; d.misses >= autoMisses {
			d.forced = true
		}
	}
	if d.forced {
		if p.reqs != nil {
			p.keepPlanLocked() // no boundary comes to judge its steps: kept, for steps that come back
			p.follow, p.spared = false, false
		}
		d.drop()
		p.stopRecordingLocked()
	}
	a.setHooksLocked()
}

// stopRecordingLocked ends the record of steps without a boundary: the
// search for steps dropped its period, and no boundary may come.
func (p *planState) stopRecordingLocked() {
	p.recording, p.logOps = false, false
	p.recStreams = p.recStreams[:0]
	p.rec, p.recSize, p.prevSize = p.rec[:0], p.recSize[:0], p.prevSize[:0]
	p.same, p.recSame = nil, 0
}
