package allocator

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/gpumem/gpumem/device"
)

// autoOp is an operation fed to autoSteps: an allocation of a token
// holding bytes (id names it), or the free of the allocation id.
type autoOp struct {
	alloc bool
	id    int
	tok   uint32
	bytes int64
}

// autoFeed runs ops through d, keeping the level (the bytes of the
// allocations not freed), and returns the allocations (by their index
// among the allocations) before which d put a boundary.
func autoFeed(d *autoSteps, ops []autoOp) []int64 {
	held := map[int]int64{}
	var at []int64
	var n, level int64
	due := false
	step := func() { // as autoStepLocked does at the boundary
		at = append(at, n) // allocation n (0-based) starts a step
		d.next, d.start = d.n+d.period, d.n
		if d.floor = d.hasFloor; d.floor {
			d.next = d.n + 4*d.period
		}
		due = false
	}
	for _, op := range ops {
		if op.alloc {
			if due {
				step()
			}
			held[op.id] = op.bytes
			due = d.allocated(0, int64(len(held)-1), level, op.bytes)
			n++
			level += op.bytes
			continue
		}
		level -= held[op.id]
		delete(held, op.id)
		due = due || d.atFloor(int64(len(held)), level) // as floorFreedLocked does
	}
	if due {
		step()
	}
	return at
}

// trainingStep returns the operations of a training-like step: layers
// whose forward passes allocate the same sizes and keep their
// activations (so the tokens of a layer repeat, the level climbs), a
// loss kept to the end, a backward pass that frees the activations in
// reverse, and an optimizer's temporaries; ids from id on. It allocates
// 3*layers+3 blocks, and its level is lowest before its first.
func trainingStep(id, layers int) ([]autoOp, int) {
	var ops []autoOp
	var acts []int
	for range layers {
		for _, tok := range []uint32{10, 11, 12} {
			ops = append(ops, autoOp{alloc: true, id: id, tok: tok, bytes: int64(tok) << 10})
			acts = append(acts, id)
			id++
		}
	}
	loss := id
	ops = append(ops, autoOp{alloc: true, id: loss, tok: 20, bytes: 512})
	id++
	for i := len(acts) - 1; i >= 0; i-- {
		ops = append(ops, autoOp{id: acts[i]})
	}
	ops = append(ops,
		autoOp{alloc: true, id: id, tok: 30, bytes: 4096},
		autoOp{alloc: true, id: id + 1, tok: 31, bytes: 4096},
		autoOp{id: id}, autoOp{id: id + 1}, autoOp{id: loss})
	return ops, id + 2
}

// TestAutoStepsFindsTheStep: after a first step of its own (the
// optimizer's state made), a training loop's steps are found whole, not
// its layers, whose tokens repeat within a step at climbing levels, and
// the boundary goes before each step's first allocation, where the level
// is lowest.
func TestAutoStepsFindsTheStep(t *testing.T) {
	const layers, steps = 12, 10
	d := new(autoSteps)
	var ops []autoOp
	id := 0
	for i := range 7 { // weights and a first step's state, kept
		ops = append(ops, autoOp{alloc: true, id: id, tok: uint32(100 + i), bytes: 1 << 20})
		id++
	}
	perStep := int64(3*layers + 3)
	for range steps {
		var s []autoOp
		s, id = trainingStep(id, layers)
		ops = append(ops, s...)
	}
	at := autoFeed(d, ops)
	require.Equal(t, perStep, d.period, "the period is a whole step")
	require.NotEmpty(t, at, "boundaries")
	for i, n := range at {
		require.Zero(t, (n-7)%perStep, "boundary before allocation %d: not a step's first", n)
		if i > 0 {
			require.Equal(t, perStep, n-at[i-1], "a boundary before every step from the first found")
		}
	}
	require.Equal(t, 7+steps*perStep, at[len(at)-1], "the last after the last step")
	require.Less(t, at[0], 7+4*perStep, "found within four steps")
}

// TestAutoStepsFindsStepsOfVaryingBatch: a training loop whose batch
// changes every step, so that no two steps in a row have the same sizes,
// has its steps found all the same (the search compares the order of
// allocations and frees), with the boundary before each step's first
// allocation.
func TestAutoStepsFindsStepsOfVaryingBatch(t *testing.T) {
	const layers, steps = 12, 12
	d := new(autoSteps)
	ops := []autoOp{{alloc: true, id: 0, bytes: 1 << 20}} // the weights, kept
	id := 1
	for i := range steps {
		var s []autoOp
		s, id = trainingStep(id, layers)
		for k := range s {
			s[k].bytes *= int64(1 + (i*5)%4) // batches 1, 2, 3, 4, 1, ...
		}
		ops = append(ops, s...)
	}
	at := autoFeed(d, ops)
	perStep := int64(3*layers + 3)
	require.Equal(t, perStep, d.period)
	require.NotEmpty(t, at)
	for _, n := range at {
		require.Zero(t, (n-1)%perStep, "boundary before allocation %d: not a step's first", n)
	}
}

// TestAutoStepsGrowingMemoryIsNoStep: a loop whose allocations and frees
// repeat in the same order, but whose memory kept from one repeat to the
// next grows (a generation loop that replaces its cache with one a token
// longer), is no step: the bytes allocated at its boundary differ from
// those a period before, and no period is found. With a cache of the same
// size every repeat, the same loop is found.
func TestAutoStepsGrowingMemoryIsNoStep(t *testing.T) {
	loop := func(grow int64) []autoOp {
		var ops []autoOp
		cache, id := -1, 0
		for tok := range int64(40) {
			for k := range 20 { // the step's temporaries, held to its end
				ops = append(ops, autoOp{alloc: true, id: id + k, bytes: 4096})
			}
			ops = append(ops, autoOp{alloc: true, id: id + 20, bytes: (64 + grow*tok) << 10}) // the new cache
			for k := range 20 {
				ops = append(ops, autoOp{id: id + k})
			}
			if cache >= 0 {
				ops = append(ops, autoOp{id: cache})
			}
			cache, id = id+20, id+21
		}
		return ops
	}
	d := new(autoSteps)
	require.Empty(t, autoFeed(d, loop(1)))
	require.Zero(t, d.period)
	d = new(autoSteps)
	require.NotEmpty(t, autoFeed(d, loop(0)))
	require.Equal(t, int64(21), d.period)
}

// TestAutoStepsNoPeriod: random sizes, and a loop shorter than
// autoMinPeriod, find no period.
func TestAutoStepsNoPeriod(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	d := new(autoSteps)
	var ops []autoOp
	var live []int
	for id := range 200000 {
		if len(live) > 0 && r.IntN(2) == 0 {
			k := r.IntN(len(live))
			ops = append(ops, autoOp{id: live[k]})
			live[k] = live[len(live)-1]
			live = live[:len(live)-1]
		}
		tok := uint32(r.IntN(64))
		ops = append(ops, autoOp{alloc: true, id: id, tok: tok, bytes: int64(tok+1) << 9})
		live = append(live, id)
	}
	require.Empty(t, autoFeed(d, ops))
	require.Zero(t, d.period)

	d = new(autoSteps)
	ops = ops[:0]
	for id := range 10000 { // an alloc and free of eight sizes in turn: period 8
		ops = append(ops, autoOp{alloc: true, id: id, tok: uint32(id % 8), bytes: 512}, autoOp{id: id})
	}
	require.Empty(t, autoFeed(d, ops))
	require.Zero(t, d.period)
}

// TestAutoStepsLongPeriods: a period of autoHistory-1 allocations is
// found, one of autoHistory is not (its first repeat is out of the
// history). Each period allocates its blocks one after another and then
// frees them all.
func TestAutoStepsLongPeriods(t *testing.T) {
	for _, c := range []struct {
		period int
		found  bool
	}{{autoHistory - 1, true}, {autoHistory, false}} {
		d := new(autoSteps)
		var ops []autoOp
		id := 0
		for range 4 {
			for range c.period {
				ops = append(ops, autoOp{alloc: true, id: id, bytes: 512})
				id++
			}
			for k := id - c.period; k < id; k++ {
				ops = append(ops, autoOp{id: k})
			}
		}
		autoFeed(d, ops)
		if c.found {
			require.Equal(t, int64(c.period), d.period)
		} else {
			require.Zero(t, d.period)
		}
	}
}

// TestAutoStepsDrop: drop forgets the period, and the search finds it
// again.
func TestAutoStepsDrop(t *testing.T) {
	d := new(autoSteps)
	var ops []autoOp
	id := 0
	for range 6 {
		var s []autoOp
		s, id = trainingStep(id, 5)
		ops = append(ops, s...)
	}
	autoFeed(d, ops)
	require.Equal(t, int64(18), d.period)
	d.drop()
	require.Zero(t, d.period)
	autoFeed(d, ops)
	require.Equal(t, int64(18), d.period)
}

// unmarkedLoop runs n unmarked steps on a's default stream, each of
// allocs allocations of mul, 2*mul, ... bytes, each freed once the next
// is allocated, the last at the end of the step.
func unmarkedLoop(t *testing.T, a *Allocator, n, allocs int, mul uint64) {
	t.Helper()
	for range n {
		var prev device.Ptr
		for i := range allocs {
			p := mustAlloc(t, a, uint64(i+1)*mul, 0)
			if prev != 0 {
				mustFree(t, a, prev)
			}
			prev = p
		}
		mustFree(t, a, prev)
	}
}

// TestPlannedAutoStepsEndWithAMark: a program that marks no step has its
// steps found and planned; its first MarkStep ends the search for good,
// and the boundaries are its marks from then on.
func TestPlannedAutoStepsEndWithAMark(t *testing.T) {
	a, _ := newOn(t, Config{Policy: PolicyPlanned})
	for range 8 {
		unmarkedLoop(t, a, 1, 20, 1<<20)
		require.NoError(t, a.CheckInvariants())
	}
	p := a.pol.plan
	require.Equal(t, int64(20), p.auto.period)
	plans, served, dep := planCounts(a)
	require.EqualValues(t, 1, plans)
	require.Positive(t, served)
	require.Zero(t, dep)
	a.MarkStep("step")
	require.Nil(t, p.auto, "a mark ends the search")
	require.False(t, p.autoDue)
	unmarkedLoop(t, a, 3, 20, 1<<20) // unmarked now: one long step to the plan's eyes
	a.MarkStep("step")
	require.NoError(t, a.CheckInvariants())
}

// TestPlannedAutoStepsFollowTheFloor: when the program's loop changes
// to one of another length that starts where the old one did (the same
// blocks held, the same bytes: the floor), the boundaries follow the
// floor, not the old period's count, and the new loop is planned as
// marks would have it, with no drop. When the floor moves (a block kept
// from then on), no step comes back to it: four periods on, the period
// is dropped, the record stops, the plan is kept, and the search finds
// the loop again at its new floor, whose steps take up the kept plan.
func TestPlannedAutoStepsFollowTheFloor(t *testing.T) {
	a, _ := newOn(t, Config{Policy: PolicyPlanned})
	unmarkedLoop(t, a, 6, 20, 1<<20)
	p := a.pol.plan
	require.Equal(t, int64(20), p.auto.period)
	require.True(t, p.auto.floor)
	require.NotNil(t, p.reqs, "planned")
	unmarkedLoop(t, a, 6, 23, 3<<19)
	require.Equal(t, int64(20), p.auto.period, "not dropped")
	require.Len(t, p.sizes, 23, "the new loop planned")
	plans, served, _ := planCounts(a)
	require.EqualValues(t, 2, plans)

	kept := mustAlloc(t, a, 1<<20, 0) // the floor moves
	unmarkedLoop(t, a, 4, 23, 3<<19)  // 92 allocations, 80 of them four periods
	require.Zero(t, p.auto.period, "dropped")
	require.Nil(t, p.reqs, "the plan ends")
	require.Len(t, p.kept, 2)
	unmarkedLoop(t, a, 6, 23, 3<<19)
	require.Equal(t, int64(23), p.auto.period, "the loop's period, at its new floor")
	require.EqualValues(t, 1, p.reuses, "the kept plan taken up")
	plans, after, _ := planCounts(a)
	require.EqualValues(t, 2, plans, "no packing")
	require.Greater(t, after, served)
	mustFree(t, a, kept)
	require.NoError(t, a.CheckInvariants())
}

// TestPlannedAutoStepsDropAChangedPattern: where the floor is no place
// of its own in the period (a loop of nests of blocks, one to depth
// levels deep, each freed whole: every nest starts at the floor),
// boundaries are counted, a period after the last. When the loop
// changes to one of deeper nests, they find no repeat; after autoMisses
// of them the period is dropped, the record stops, and the new loop's
// period is found and planned.
func TestPlannedAutoStepsDropAChangedPattern(t *testing.T) {
	a, _ := newOn(t, Config{Policy: PolicyPlanned})
	nests := func(n, depth int) {
		for range n {
			for d := 1; d <= depth; d++ {
				var ps []device.Ptr
				for k := range d {
					ps = append(ps, mustAlloc(t, a, uint64(k+1)<<20, 0))
				}
				for _, p := range slices.Backward(ps) {
					mustFree(t, a, p)
				}
			}
		}
	}
	nests(6, 6) // 21 allocations a loop
	p := a.pol.plan
	require.Equal(t, int64(21), p.auto.period)
	require.False(t, p.auto.floor, "the floor is every nest's start")
	require.NotNil(t, p.reqs, "planned")
	nests(4, 7) // 28 a loop: boundaries every 21 allocations find no repeat
	require.Zero(t, p.auto.period, "dropped")
	require.False(t, p.recording, "the record stops with the period")
	require.Empty(t, p.rec)
	nests(6, 7)
	require.Equal(t, int64(28), p.auto.period, "the new loop's period")
	plans, _, _ := planCounts(a)
	require.EqualValues(t, 2, plans)
	require.NoError(t, a.CheckInvariants())
}

// TestPlannedAutoStepsThatGrow: unmarked steps whose sizes change from
// step to step (1, 2, ... 6 MiB times their position, in turn) are found
// and planned: a step that only grows the envelope of the steps before it
// is no miss of the period (the steps after the period is found grow it
// three times in a row or more), and the next step that fits it is
// planned.
func TestPlannedAutoStepsThatGrow(t *testing.T) {
	a, _ := newOn(t, Config{Policy: PolicyPlanned})
	for i := range 14 {
		unmarkedLoop(t, a, 1, 20, uint64(1+i%6)<<20)
		require.NoError(t, a.CheckInvariants())
	}
	p := a.pol.plan
	require.Equal(t, int64(20), p.auto.period)
	// Found in the third step, the boundaries start the record after
	// it; the fourth (4 MiB) starts the envelope, the fifth and sixth
	// grow it, the seventh (1 MiB) is planned and the seven after it are
	// served. (Counted as misses, the growths dropped the period at the
	// sixth step; found again two steps later, it was planned at the
	// thirteenth, and only the last step was served.)
	plans, served, dep := planCounts(a)
	require.EqualValues(t, 1, plans)
	require.EqualValues(t, 7*20, served)
	require.Zero(t, dep)
	require.NoError(t, a.CheckInvariants())
}

// TestCheckInvariantsCatchesSearchCorruption: the search for steps'
// invariants (checkAutoLocked) catch a search that outlived a mark, a
// boundary due where no period starts, a next boundary behind the
// allocations, and hooks that are not what listens asks for.
func TestCheckInvariantsCatchesSearchCorruption(t *testing.T) {
	setup := func(t *testing.T) *Allocator {
		a, _ := newOn(t, Config{Policy: PolicyPlanned})
		unmarkedLoop(t, a, 3, 20, 1<<20)
		require.Equal(t, int64(20), a.pol.plan.auto.period)
		require.NoError(t, a.CheckInvariants())
		return a
	}
	requireCaught(t, setup, []corruption{
		{"a search after a mark", "after a mark", func(a *Allocator) { a.stepping = true }},
		{"a boundary due outside a period's start", "no period starts", func(a *Allocator) {
			p := a.pol.plan
			p.autoDue, p.auto.floor, p.auto.hasFloor, p.auto.next = true, false, false, p.auto.n+5
		}},
		{"a next boundary behind", "behind", func(a *Allocator) { a.pol.plan.auto.next = a.pol.plan.auto.n - 1 }},
		{"a floor without a period", "a floor (true, found: true)", func(a *Allocator) {
			a.pol.plan.auto.period, a.pol.plan.auto.floor, a.pol.plan.auto.hasFloor = 0, true, true
		}},
		{"a broken order without a period", "break the order", func(a *Allocator) {
			a.pol.plan.auto.period, a.pol.plan.auto.broken = 0, true
		}},
		{"hooks without the search", "hooks", func(a *Allocator) { a.hooks = 0 }},
	})
}

// TestPlannedAutoStepsWithObservers: an observer attached and detached
// while the policy searches for steps leaves the search on (the hooks
// keep hookSearch), and steps are still found and planned.
func TestPlannedAutoStepsWithObservers(t *testing.T) {
	a, _ := newOn(t, Config{Policy: PolicyPlanned})
	require.Equal(t, uint8(hookSearch), a.hooks)
	seen := 0
	detach := a.Attach(observerFunc(func(e Action) {
		if e.Kind == ActionAlloc || e.Kind == ActionFreeRequested {
			seen++
		}
	}))
	require.Equal(t, uint8(hookSearch|hookListen), a.hooks)
	mustFree(t, a, mustAlloc(t, a, 1<<20, 0))
	require.Equal(t, 2, seen, "the observer saw the alloc and the free")
	detach()
	require.Equal(t, uint8(hookSearch), a.hooks)
	unmarkedLoop(t, a, 8, 20, 1<<20)
	require.Equal(t, int64(20), a.pol.plan.auto.period)
	plans, served, _ := planCounts(a)
	require.EqualValues(t, 1, plans)
	require.Positive(t, served)
	require.NoError(t, a.CheckInvariants())
}

// TestPlannedAutoStepsWithASideStreamAreNoPattern: in a program that
// marks no step, the steps the search finds are planned only where they
// allocate on one stream. The boundaries it puts fall on the compute
// stream's floor, and another stream's allocations (copy streams that
// prefetch several layers ahead, in offload) at other places from one
// found step to the next: such steps are no pattern, as before steps
// on several streams were planned. Marked, the same loop is planned on
// its main stream (TestPlannedStepsOnSeveralStreams).
func TestPlannedAutoStepsWithASideStreamAreNoPattern(t *testing.T) {
	a, dev := newOn(t, Config{Policy: PolicyPlanned})
	side, err := dev.NewStream()
	require.NoError(t, err)
	for range 8 {
		input := mustAlloc(t, a, 1<<20, side)
		unmarkedLoop(t, a, 1, 20, 1<<20)
		mustFree(t, a, input)
		require.NoError(t, a.CheckInvariants())
	}
	plans, served, _ := planCounts(a)
	require.Zero(t, plans)
	require.Zero(t, served)
	for range 8 {
		unmarkedLoop(t, a, 1, 20, 1<<20) // the loop alone: planned
	}
	plans, served, _ = planCounts(a)
	require.EqualValues(t, 1, plans)
	require.Positive(t, served)
	require.NoError(t, a.CheckInvariants())
}
