// Tests of the planned policy on hand-made steps: what it serves from its
// arena, when it departs, what it leaves out of the plan.

package allocator

import (
	"cmp"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/internal/simtest"
)

// runStep marks a step and allocates sizes on the default stream in
// order, each freed once the next is allocated, the last at the end,
// but the blocks at the positions in keep, which stay live. It returns
// the addresses handed out and the kept blocks.
func runStep(t *testing.T, a *Allocator, sizes []uint64, keep ...int) (ptrs, kept []device.Ptr) {
	t.Helper()
	a.MarkStep("step")
	var prev device.Ptr
	for i, size := range sizes {
		p := mustAlloc(t, a, size, 0)
		ptrs = append(ptrs, p)
		if prev != 0 {
			mustFree(t, a, prev)
		}
		prev = p
		for _, k := range keep {
			if k == i {
				kept, prev = append(kept, p), 0
			}
		}
	}
	if prev != 0 {
		mustFree(t, a, prev)
	}
	return ptrs, kept
}

func planCounts(a *Allocator) (plans, served, departures int64) {
	p := a.pol.plan
	return p.plans, p.served, p.departures
}

func deviceCalls(t *testing.T, a *Allocator) int64 {
	return get(t, a, "num_device_alloc") + get(t, a, "num_device_free")
}

var stepSizes = []uint64{3 << 20, 512, 25 << 20, 70 << 10, 12 << 20, 1 << 20, 40 << 20, 4096, 6 << 20}

func TestPlannedServesARepeatedStep(t *testing.T) {
	a, dev := newOn(t, Config{Policy: PolicyPlanned})
	weights := mustAlloc(t, a, 30<<20, 0)
	runStep(t, a, stepSizes) // recorded
	runStep(t, a, stepSizes) // repeats it
	plans, served, _ := planCounts(a)
	require.Zero(t, plans)
	require.Zero(t, served, "nothing is served before a step repeats")

	first, _ := runStep(t, a, stepSizes) // planned at its mark, served from the arena
	var dep int64
	plans, served, dep = planCounts(a)
	assert.EqualValues(t, 1, plans)
	assert.EqualValues(t, len(stepSizes), served, "every request of the repeated step is served from the arena")
	assert.Zero(t, dep)

	calls := deviceCalls(t, a)
	second, _ := runStep(t, a, stepSizes)
	assert.Equal(t, first, second, "a step that follows the plan gets the plan's addresses")
	assert.Equal(t, calls, deviceCalls(t, a), "a step served from the arena makes no device call")
	plans, served, _ = planCounts(a)
	assert.EqualValues(t, 1, plans, "a step that followed the plan keeps it")
	assert.EqualValues(t, 2*len(stepSizes), served)

	// Stats keep their meaning: allocated is what the caller holds,
	// reserved what the device gave.
	assert.EqualValues(t, 30<<20, get(t, a, "allocated_bytes.all.current"))
	assert.EqualValues(t, dev.BytesInUse(), get(t, a, "reserved_bytes.all.current"))
	mustFree(t, a, weights)
	require.NoError(t, a.EmptyCache())
	assert.Zero(t, dev.BytesInUse())
}

// TestPlannedServesASmallerStep: a step whose requests are each no
// larger than the plan's (a last batch that is smaller) is served from
// the arena whole, each request at the start of its place, and keeps the
// plan, so that the full step after it is served too; a step with fewer
// requests is served as far as it goes and spares the plan once; two
// such steps in a row end it.
func TestPlannedServesASmallerStep(t *testing.T) {
	a, _ := newOn(t, Config{Policy: PolicyPlanned})
	runStep(t, a, stepSizes)
	runStep(t, a, stepSizes)
	full, _ := runStep(t, a, stepSizes) // planned at its mark, served from the arena
	calls := deviceCalls(t, a)

	smaller := slices.Clone(stepSizes)
	for k := range smaller {
		if k%2 == 0 {
			smaller[k] = smaller[k]/3 + 1 // rounded up to 512 bytes, still smaller
		}
	}
	ptrs, _ := runStep(t, a, smaller)
	plans, served, dep := planCounts(a)
	assert.EqualValues(t, 1, plans)
	assert.Zero(t, dep, "a smaller request does not depart")
	assert.EqualValues(t, 2*len(stepSizes), served, "every request of the smaller step is served from the arena")
	assert.Equal(t, full, ptrs, "each at the start of its place")
	assert.Equal(t, calls, deviceCalls(t, a), "with no device call")
	require.NoError(t, a.CheckInvariants())

	again, _ := runStep(t, a, stepSizes) // its mark kept the plan
	plans, served, dep = planCounts(a)
	assert.EqualValues(t, 1, plans, "the smaller step kept the plan")
	assert.Zero(t, dep)
	assert.EqualValues(t, 3*len(stepSizes), served, "the full step after it is served from the arena")
	assert.Equal(t, full, again)
	require.NoError(t, a.CheckInvariants())

	// One request fewer: served as far as it goes; another shape than
	// the plan's, it spares the plan once, and the full step after it is
	// served. Two shorter steps in a row end the plan.
	shorter := stepSizes[:len(stepSizes)-1]
	runStep(t, a, shorter)
	runStep(t, a, stepSizes)
	plans, served2, _ := planCounts(a)
	assert.EqualValues(t, 1, plans)
	assert.EqualValues(t, served+int64(2*len(stepSizes)-1), served2, "the full step after a shorter one is served")
	runStep(t, a, shorter)
	runStep(t, a, shorter)
	runStep(t, a, stepSizes)
	plans, served3, _ := planCounts(a)
	assert.EqualValues(t, 1, plans)
	assert.EqualValues(t, served2+int64(2*len(stepSizes)-2), served3, "the full step after two shorter ones is served online")
	assert.Nil(t, a.pol.plan.reqs, "two steps with fewer requests end the plan")
	require.NoError(t, a.CheckInvariants())
}

// TestPlannedServesStepsThatVaryBothWays: steps of one pattern whose
// sizes go up and down (batches of varying length) never repeat the one
// before; a step that fits the envelope of the steps before it, the
// largest size seen at each position, is planned with the envelope's
// sizes, and the steps after it are served from the arena whole, each
// request at the start of its place. A step larger than the envelope
// departs, grows it, and the next step that fits is planned anew.
func TestPlannedServesStepsThatVaryBothWays(t *testing.T) {
	a, _ := newOn(t, Config{Policy: PolicyPlanned})
	vary := func(mul, div int) []uint64 {
		sizes := slices.Clone(stepSizes)
		for k := range sizes {
			if k%2 == 0 {
				sizes[k] = sizes[k] * uint64(mul) / uint64(div)
			} else {
				sizes[k] = sizes[k] * uint64(div) / uint64(mul)
			}
		}
		return sizes
	}
	up, down := vary(2, 1), vary(1, 2) // each larger than the other somewhere
	runStep(t, a, stepSizes)
	runStep(t, a, up)        // larger than the step before at even positions: the envelope grows
	runStep(t, a, down)      // larger at odd positions: it grows again
	runStep(t, a, stepSizes) // larger than the envelope nowhere: planned at the next mark
	plans, served, _ := planCounts(a)
	require.Zero(t, plans)
	require.Zero(t, served)
	envelope := make([]uint64, len(stepSizes))
	for k := range envelope {
		envelope[k] = roundSize(max(stepSizes[k], up[k], down[k]), nil)
	}
	require.Equal(t, envelope, a.pol.plan.prevSize, "the envelope")

	calls := int64(-1)
	var firsts [][]device.Ptr
	for i, sizes := range [][]uint64{up, stepSizes, down, up} {
		ptrs, _ := runStep(t, a, sizes)
		if i == 0 {
			require.Equal(t, envelope, a.pol.plan.sizes, "the plan has the envelope's sizes")
			calls = deviceCalls(t, a)
		}
		firsts = append(firsts, ptrs)
		var dep int64
		plans, served, dep = planCounts(a)
		require.EqualValues(t, 1, plans, "step %d kept the plan", i)
		require.EqualValues(t, (i+1)*len(stepSizes), served, "step %d served from the arena whole", i)
		require.Zero(t, dep)
		require.NoError(t, a.CheckInvariants())
	}
	for _, ptrs := range firsts[1:] {
		assert.Equal(t, firsts[0], ptrs, "each request at the start of its place")
	}
	assert.Equal(t, calls, deviceCalls(t, a), "with no device call")

	// Larger than the envelope at its last position: served up to it,
	// then online; the envelope grows and the next step that fits it is
	// planned again.
	larger := slices.Clone(up)
	larger[len(larger)-1] = 3 * envelope[len(larger)-1]
	runStep(t, a, larger)
	_, served2, dep := planCounts(a)
	assert.EqualValues(t, 1, dep, "a larger request departs")
	assert.EqualValues(t, served+int64(len(stepSizes)-1), served2)
	runStep(t, a, down) // fits the grown envelope: planned at the next mark
	runStep(t, a, larger)
	plans, served3, dep := planCounts(a)
	assert.EqualValues(t, 2, plans)
	envelope[len(envelope)-1] = roundSize(larger[len(larger)-1], nil)
	assert.Equal(t, envelope, a.pol.plan.sizes)
	assert.EqualValues(t, 1, dep)
	assert.EqualValues(t, served2+int64(len(stepSizes)), served3, "the largest step is served")
	require.NoError(t, a.CheckInvariants())
}

// TestPlannedSparesAStepOfAnotherShape: micro-batches marked as steps,
// with the optimizer's step every fourth (its micro-batch's requests,
// then more): the fourth step has another count of requests than the
// plan, is served as far as the plan goes and online after, and spares
// the plan, so that every micro-batch after the plan is served from the
// arena with no new plan; so do steps of two other shapes in turn, an
// evaluation and the optimizer's step, each after one of the plan's
// shape. A program that changes its step for good ends
// the plan at the second step of the new shape and has it planned at the
// third's end, a step later than if the first had ended the plan.
func TestPlannedSparesAStepOfAnotherShape(t *testing.T) {
	a, _ := newOn(t, Config{Policy: PolicyPlanned})
	withOptimizer := append(slices.Clone(stepSizes), 8<<20, 8<<20, 2<<20)
	for cycle := range 5 {
		for i := range 4 {
			if i == 3 {
				runStep(t, a, withOptimizer)
			} else {
				runStep(t, a, stepSizes)
			}
		}
		if cycle == 0 {
			plans, _, _ := planCounts(a)
			require.EqualValues(t, 1, plans, "the second micro-batch repeats the first: planned at the third's mark")
		}
	}
	plans, served, dep := planCounts(a)
	assert.EqualValues(t, 1, plans, "the optimizer's steps spared the plan")
	st, _ := a.PlanStats()
	assert.EqualValues(t, 4, st.Spared, "the fifth optimizer's step has no boundary after it yet")
	// Served: the first cycle's third micro-batch and the optimizer's
	// step as far as the plan goes, then four more cycles.
	n := int64(len(stepSizes))
	assert.EqualValues(t, 2*n+4*4*n, served)
	assert.EqualValues(t, 5, dep, "each optimizer's step departs past the plan's end")
	require.NoError(t, a.CheckInvariants())

	// Steps of two other shapes in turn, each after one of the plan's
	// (an evaluation, then the optimizer's step): each spares the plan.
	eval := stepSizes[:5]
	for _, sizes := range [][]uint64{stepSizes, eval, stepSizes, withOptimizer, stepSizes, eval} {
		runStep(t, a, sizes)
	}
	plans, served2, _ := planCounts(a)
	assert.EqualValues(t, 1, plans, "shapes in turn with the plan's between them keep it")
	assert.EqualValues(t, served+3*n+5+n+5, served2)
	runStep(t, a, stepSizes)
	plans, served, _ = planCounts(a)
	assert.EqualValues(t, 1, plans)
	assert.EqualValues(t, served2+n, served, "the step after them is served")

	// The step changes for good: the first of the new shape spares the
	// plan, the second ends it (each served as far as the plan goes) and
	// is the envelope, the third fits it and is planned at its end, the
	// fourth is served.
	for range 3 {
		runStep(t, a, withOptimizer)
	}
	plans, _, _ = planCounts(a)
	assert.EqualValues(t, 1, plans)
	assert.Nil(t, a.pol.plan.reqs, "two steps of another shape in a row end the plan")
	runStep(t, a, withOptimizer)
	plans, served2, _ = planCounts(a)
	assert.EqualValues(t, 2, plans, "the new shape is planned")
	assert.EqualValues(t, served+2*n+int64(len(withOptimizer)), served2, "the first two steps of the new shape served as far as the old plan goes, the fourth from the new plan")
	require.NoError(t, a.CheckInvariants())
}

// TestPlanStats: the planned policy's figures follow its plan, and there
// are none under another policy.
func TestPlanStats(t *testing.T) {
	other, _ := newOn(t, Config{Policy: PolicyLowFragmentation})
	_, ok := other.PlanStats()
	assert.False(t, ok, "no figures under another policy")
	var zero Allocator
	st, ok := zero.PlanStats()
	assert.False(t, ok, "no figures from an allocator not made by New")
	assert.Equal(t, PlanStats{}, st)

	a, _ := newOn(t, Config{Policy: PolicyPlanned})
	st, ok = a.PlanStats()
	require.True(t, ok)
	assert.Equal(t, PlanStats{}, st, "nothing planned yet")
	runStep(t, a, stepSizes)
	runStep(t, a, stepSizes)
	runStep(t, a, stepSizes) // planned at its mark, served
	st, _ = a.PlanStats()
	assert.Equal(t, PlanStats{Plans: 1, Served: int64(len(stepSizes)), ArenaBytes: a.pol.plan.foot, Following: true}, st)
	assert.NotZero(t, st.ArenaBytes)
	n := int64(len(stepSizes))
	runStep(t, a, append(slices.Clone(stepSizes), 4096)) // one request more: departs past the plan's end
	runStep(t, a, stepSizes)                             // its mark spares the plan: served
	st, _ = a.PlanStats()
	assert.Equal(t, PlanStats{Plans: 1, Served: 3 * n, Departures: 1, Spared: 1, ArenaBytes: a.pol.plan.foot, Following: true}, st)

	larger := slices.Clone(stepSizes)
	larger[3] *= 2
	runStep(t, a, larger) // departs at its fourth request
	st, _ = a.PlanStats()
	assert.Equal(t, PlanStats{Plans: 1, Served: 3*n + 3, Departures: 2, Spared: 1, ArenaBytes: a.pol.plan.foot}, st)
	a.MarkStep("step") // the step did not fit: the plan ends
	st, _ = a.PlanStats()
	assert.Zero(t, st.ArenaBytes, "no plan, no arena")
	assert.False(t, st.Following)
}

// TestPlannedLogsOnlyStepsThatMayFit: a step's operations are logged
// only while it may still fit the envelope, the one use of the log; its
// sizes always are. The first step, with no envelope, logs none; a step
// that outgrows the envelope forgets its log there; a step within it
// logs every allocation and free, and is planned at its end.
func TestPlannedLogsOnlyStepsThatMayFit(t *testing.T) {
	a, _ := newOn(t, Config{Policy: PolicyPlanned})
	p := a.pol.plan
	runStep(t, a, stepSizes)
	assert.False(t, p.logOps, "the first step has no envelope")
	assert.Empty(t, p.rec)
	assert.Len(t, p.recSize, len(stepSizes))

	larger := slices.Clone(stepSizes)
	larger[5] *= 2
	a.MarkStep("step")
	require.True(t, p.logOps, "within the envelope so far")
	var held []device.Ptr
	for _, size := range larger[:5] {
		held = append(held, mustAlloc(t, a, size, 0))
	}
	mustFree(t, a, held[0])
	assert.Len(t, p.rec, 6, "five allocations and a free")
	held = append(held, mustAlloc(t, a, larger[5], 0))
	assert.False(t, p.logOps, "larger than the envelope at its position")
	assert.Empty(t, p.rec, "the log is forgotten")
	for _, size := range larger[6:] {
		held = append(held, mustAlloc(t, a, size, 0))
	}
	for _, ptr := range held[1:] {
		mustFree(t, a, ptr)
	}
	assert.Len(t, p.recSize, len(larger), "its sizes are logged all the same")
	require.NoError(t, a.CheckInvariants())

	runStep(t, a, larger) // the envelope grew to the larger step's: within it
	assert.True(t, p.logOps)
	assert.Len(t, p.rec, 2*len(larger), "every allocation and every free")
	runStep(t, a, larger)
	plans, _, _ := planCounts(a)
	assert.EqualValues(t, 1, plans, "planned from its log")
	require.NoError(t, a.CheckInvariants())
}

// TestPlannedStepsOnSeveralStreams: a step that allocates on a side
// stream too (an input copied on a stream of its own) is planned on its
// main stream, the one with most of its allocations, even where the
// side allocation comes first: the main stream's blocks are served from
// the arena, the side ones online, with no departure. A step whose side
// allocation moves does not fit the plan, which ends; a step that runs
// mostly on the side stream makes the next step choose its main stream
// again.
func TestPlannedStepsOnSeveralStreams(t *testing.T) {
	a, dev := newOn(t, Config{Policy: PolicyPlanned})
	side, err := dev.NewStream()
	require.NoError(t, err)
	step := func(at int, onSide func(i int) bool) (ptrs []device.Ptr) {
		a.MarkStep("step")
		var held device.Ptr
		for i, size := range stepSizes {
			st := device.DefaultStream
			if onSide(i) {
				st = side
			}
			p := mustAlloc(t, a, size, st)
			ptrs = append(ptrs, p)
			if i == at {
				held = p // the side block lives to the step's end
				continue
			}
			mustFree(t, a, p)
		}
		mustFree(t, a, held)
		return ptrs
	}
	first := func(i int) bool { return i == 0 }
	step(0, first)
	p := a.pol.plan
	assert.Equal(t, side, p.recStream, "before its boundary, the first allocation's stream")
	assert.Len(t, p.recStreams, len(stepSizes))
	step(0, first)
	assert.Equal(t, device.DefaultStream, p.prevStream, "the stream with most of the step's allocations")
	assert.EqualValues(t, sideSize, p.prevSize[0], "the side allocation")
	assert.Empty(t, p.recStreams, "a step with an envelope logs side allocations as such")
	assert.True(t, p.logOps, "the step fits the envelope")
	assert.Len(t, p.rec, 2*len(stepSizes), "its operations, side ones too")
	for range 3 { // planned at the first of these marks
		ptrs := step(0, first)
		plans, _, dep := planCounts(a)
		assert.EqualValues(t, 1, plans)
		assert.Zero(t, dep)
		assert.True(t, p.follow)
		for i, ptr := range ptrs[1:] {
			r := p.reqs[i+1]
			assert.Equal(t, p.addr+device.Ptr(r.off), ptr, "allocation %d at its place", i+1)
		}
		assert.False(t, p.reqs[0].arena, "the side allocation is no block of the arena")
	}
	_, served, _ := planCounts(a)
	assert.EqualValues(t, 3*(len(stepSizes)-1), served, "every allocation but the side one, three times")
	require.NoError(t, a.CheckInvariants())

	third := func(i int) bool { return i == 3 }
	step(3, third) // the side allocation moved
	_, _, dep := planCounts(a)
	assert.EqualValues(t, 1, dep, "a main allocation where the plan has a side one departs")
	a.MarkStep("step")
	assert.Nil(t, p.reqs, "the step that moved it does not fit the plan: it ends")
	assert.NotEqualValues(t, sideSize, p.prevSize[0], "the envelope is the step that moved it, not grown: its sides differ")
	assert.EqualValues(t, sideSize, p.prevSize[3])
	step(3, third) // repeats it: planned at the next mark
	step(3, func(i int) bool { return i == 0 || i == 3 })
	plans, _, dep := planCounts(a)
	assert.EqualValues(t, 2, plans)
	assert.EqualValues(t, 2, dep, "a side allocation where the plan has a main one departs")
	a.MarkStep("step")
	assert.Nil(t, p.reqs)
	for _, size := range stepSizes {
		mustFree(t, a, mustAlloc(t, a, size, side)) // all on the side stream
	}
	a.MarkStep("step")
	assert.Empty(t, p.prevSize, "a step mostly on another stream: no envelope")
	require.NoError(t, a.CheckInvariants())
}

func TestPlannedDepartsAndReplans(t *testing.T) {
	a, _ := newOn(t, Config{Policy: PolicyPlanned})
	runStep(t, a, stepSizes)
	runStep(t, a, stepSizes)
	runStep(t, a, stepSizes) // served from the arena
	other := append([]uint64(nil), stepSizes...)
	other[2] *= 2 // a larger third request: it departs (a smaller one would be served)
	runStep(t, a, other)
	_, served, dep := planCounts(a)
	assert.EqualValues(t, len(stepSizes)+2, served, "the two requests before the departure are served from the arena")
	assert.EqualValues(t, 1, dep)

	runStep(t, a, other) // the plan has ended: online
	plans, served2, dep2 := planCounts(a)
	assert.EqualValues(t, 1, plans)
	assert.Equal(t, served, served2)
	assert.Equal(t, dep, dep2, "a step without a plan does not depart")
	runStep(t, a, other) // the new pattern repeats: planned anew
	plans, served2, dep2 = planCounts(a)
	assert.EqualValues(t, 2, plans)
	assert.EqualValues(t, served+int64(len(other)), served2)
	assert.EqualValues(t, dep, dep2)

	// A request on another stream departs too, without error.
	s, err := a.dev.NewStream()
	require.NoError(t, err)
	a.MarkStep("step")
	p := mustAlloc(t, a, stepSizes[0], s)
	mustFree(t, a, p)
	_, _, dep3 := planCounts(a)
	assert.EqualValues(t, dep2+1, dep3)
}

func TestPlannedLeavesKeptBlocksOutOfThePlan(t *testing.T) {
	a, _ := newOn(t, Config{Policy: PolicyPlanned})
	_, kept0 := runStep(t, a, stepSizes, 4) // the 12 MiB block outlives its step
	_, kept := runStep(t, a, stepSizes, 4)
	plans, _, _ := planCounts(a)
	require.Zero(t, plans)
	a.MarkStep("step") // plans the step
	p := a.pol.plan
	require.Len(t, p.reqs, len(stepSizes))
	for k, r := range p.reqs {
		assert.Equal(t, k != 4, r.arena, "position %d: only the block kept across the step is left out", k)
	}
	ptrs, kept2 := runStep(t, a, stepSizes, 4)
	_, served, _ := planCounts(a)
	assert.GreaterOrEqual(t, served, int64(4), "the requests before the kept one are served from the arena")
	assert.NotEqual(t, kept[0], kept2[0])
	assert.NotContains(t, ptrs, kept[0])
	mustFree(t, a, kept0[0], kept[0], kept2[0])
}

func TestPlannedArenaMovesPastAKeptBlock(t *testing.T) {
	// A block of the arena kept past its step: at the next boundary the
	// arena is no longer whole, and moves to free memory.
	a, _ := newOn(t, Config{Policy: PolicyPlanned})
	runStep(t, a, stepSizes)
	runStep(t, a, stepSizes)
	_, kept := runStep(t, a, stepSizes, len(stepSizes)-1) // the last block stays
	_, served, _ := planCounts(a)
	ptrs, _ := runStep(t, a, stepSizes)
	_, served2, dep := planCounts(a)
	assert.Zero(t, dep)
	assert.EqualValues(t, len(stepSizes), served2-served)
	for i, p := range ptrs {
		assert.False(t, p < kept[0]+device.Ptr(stepSizes[len(stepSizes)-1]) && kept[0] < p+device.Ptr(stepSizes[i]), "block %d overlaps the kept block", i)
	}
	mustFree(t, a, kept...)
}

func TestPlannedSkipsAPlaceTaken(t *testing.T) {
	// Four blocks, each freed after the next: the plan puts the third
	// where the first was. A step that keeps the first live longer
	// serves the third online rather than overlap it, and goes on
	// following the plan: the fourth is served from the arena.
	a, _ := newOn(t, Config{Policy: PolicyPlanned})
	four := []uint64{8 << 20, 8 << 20, 8 << 20, 8 << 20}
	runStep(t, a, four)
	runStep(t, a, four)
	a.MarkStep("step")
	p := a.pol.plan
	require.Equal(t, p.reqs[0].off, p.reqs[2].off, "the plan reuses the first block's place")
	p0, p1 := mustAlloc(t, a, four[0], 0), mustAlloc(t, a, four[1], 0)
	p2 := mustAlloc(t, a, four[2], 0) // the first is still live
	require.NotEqual(t, p0, p2)
	mustFree(t, a, p1)
	require.NoError(t, a.CheckInvariants())
	_, served, dep := planCounts(a)
	assert.EqualValues(t, 2, served)
	assert.EqualValues(t, 0, dep)
	assert.EqualValues(t, 1, p.skips)
	p3 := mustAlloc(t, a, four[3], 0)
	_, served, _ = planCounts(a)
	assert.EqualValues(t, 3, served, "the step follows the plan after the skip")
	assert.Equal(t, a.pol.plan.addr+device.Ptr(p.reqs[3].off), p3)
	mustFree(t, a, p0, p2, p3)
	require.NoError(t, a.CheckInvariants())
}

func TestPlannedWithoutVirtualMemory(t *testing.T) {
	// Plain segments: the policy runs as low_fragmentation (carving a
	// block out of a plain segment would change its split counts).
	sd := simtest.New(t)
	a := onDevice(t, device.Compose(sd, device.Capabilities{StreamChecker: sd, UsageReporter: sd}), Config{Policy: PolicyPlanned})
	require.Nil(t, a.vm)
	big := mustAlloc(t, a, 200<<20, 0)
	mustFree(t, a, big) // a free segment that holds the arena
	for range 4 {
		runStep(t, a, stepSizes)
	}
	plans, served, _ := planCounts(a)
	assert.Zero(t, plans, "without virtual memory nothing is planned")
	assert.Zero(t, served)
}

func TestPlannedArenaReleasedMidStep(t *testing.T) {
	// EmptyCache in a step gives the arena's pages back and releases its
	// segment: the next planned request finds its place unmapped and
	// departs; at the next boundary a new arena is mapped.
	a, _ := newOn(t, Config{Policy: PolicyPlanned})
	for range 3 {
		runStep(t, a, stepSizes)
	}
	_, served, _ := planCounts(a)
	require.EqualValues(t, len(stepSizes), served)
	a.MarkStep("step")
	p := mustAlloc(t, a, stepSizes[0], 0)
	mustFree(t, a, p)
	require.NoError(t, a.EmptyCache())
	seg := a.pol.plan.seg
	require.NotSame(t, seg, a.segments[seg.Ptr()], "the arena's segment is released")
	for _, size := range stepSizes[1:] {
		mustFree(t, a, mustAlloc(t, a, size, 0))
	}
	_, served2, dep := planCounts(a)
	assert.EqualValues(t, served+1, served2)
	assert.EqualValues(t, 1, dep)
	runStep(t, a, stepSizes)
	_, served3, _ := planCounts(a)
	assert.EqualValues(t, served2+int64(len(stepSizes)), served3, "the step after it is served from a new arena")
}

func TestPlannedArenaMapsNoPageAhead(t *testing.T) {
	// An arena mapped anew is the step's need and no more: growth maps
	// pages ahead of a request (40 MiB under the planned policy on a
	// roomy device), but none ahead of an arena, where they would sit
	// unused beside it while the steps follow the plan.
	a, dev := newOn(t, Config{Policy: PolicyPlanned})
	for range 3 {
		runStep(t, a, stepSizes)
	}
	a.MarkStep("step")
	require.NoError(t, a.EmptyCache()) // the arena's pages go back
	require.Zero(t, get(t, a, "reserved_bytes.all.current"))
	calls := deviceCalls(t, a)
	a.MarkStep("step") // the arena is mapped again
	p := a.pol.plan
	require.True(t, p.follow, "the step follows the plan in a new arena")
	assert.EqualValues(t, p.foot, get(t, a, "reserved_bytes.all.current"), "the arena's pages alone are mapped")
	assert.EqualValues(t, p.foot, dev.BytesInUse())
	assert.EqualValues(t, calls+1, deviceCalls(t, a), "one map")
	_, served, _ := planCounts(a)
	runStep(t, a, stepSizes) // its mark ends a step of no allocation, which keeps the plan and the arena
	_, served2, dep := planCounts(a)
	assert.EqualValues(t, len(stepSizes), served2-served, "the step is served from the arena")
	assert.Zero(t, dep)
	assert.EqualValues(t, calls+1, deviceCalls(t, a), "and makes no device call")
	require.NoError(t, a.CheckInvariants())
}

// TestCheckInvariantsCatchesPlanCorruption breaks the planned policy's
// state in each way the checker promises to notice.
func TestCheckInvariantsCatchesPlanCorruption(t *testing.T) {
	setup := func(t *testing.T) *Allocator {
		a, _ := newOn(t, Config{Policy: PolicyPlanned})
		for range 3 {
			runStep(t, a, stepSizes)
		}
		a.MarkStep("step") // the plan followed, its arena found
		require.True(t, a.pol.plan.follow)
		require.NoError(t, a.CheckInvariants())
		return a
	}
	requireCaught(t, setup, []corruption{
		{"a small-pool index not merged", "small-pool index", func(a *Allocator) { a.def.free[qSmall].Merged = false }},
		{"a planned block past the arena", "past its arena", func(a *Allocator) { a.pol.plan.reqs[0].off = a.pol.plan.foot }},
		{"an arena outside its segment", "outside a segment", func(a *Allocator) { a.pol.plan.addr = a.pol.plan.seg.Ptr() + device.Ptr(a.pol.plan.seg.Size()) }},
		{"a log that lost its operations", "logged", func(a *Allocator) {
			a.pol.plan.logOps = true // as with no plan
			a.pol.plan.recSize = append(a.pol.plan.recSize, 512)
		}},
		{"operations logged past the envelope", "cannot fit the envelope", func(a *Allocator) {
			p := a.pol.plan
			p.same, p.recSame, p.logOps = nil, 0, true
			p.recSize, p.recStream = append(p.recSize, p.prevSize[0]+512), p.prevStream
			p.rec = append(p.rec, planOp{pos: 0})
		}},
		{"streams logged beside an envelope", "streams for a step", func(a *Allocator) {
			a.pol.plan.recStreams = append(a.pol.plan.recStreams, device.DefaultStream)
		}},
		{"sizes that are not the plan's", "its size", func(a *Allocator) { a.pol.plan.sizes[1]++ }},
		{"an envelope that is not the plan's", "the envelope has", func(a *Allocator) { a.pol.plan.prevSize[0]++ }},
		{"the plan's sizes counted beside a log", "as the plan's", func(a *Allocator) {
			a.pol.plan.recSame = 1
			a.pol.plan.recSize = append(a.pol.plan.recSize, 512)
		}},
		{"operations logged under a plan", "logged", func(a *Allocator) {
			a.pol.plan.rec = append(a.pol.plan.rec, planOp{pos: -1})
		}},
		{"quiet steps under a plan", "quiet steps", func(a *Allocator) { a.pol.plan.quiet = 3 }},
		{"a plan spared that is gone", "spared a plan", func(a *Allocator) { a.pol.plan.reqs, a.pol.plan.spared = nil, true }},
		{"a quiet step that logs", "quiet steps", func(a *Allocator) {
			a.pol.plan.recording = false
			a.pol.plan.recSame = 1 // what the step so far counted as the plan's
		}},
	})
}

// A corruption breaks an allocator's state in one way that
// CheckInvariants promises to notice, with want in its report.
type corruption struct {
	name, want string
	breakIt    func(a *Allocator)
}

// requireCaught breaks an allocator from setup with each corruption, in
// a subtest of its own, and requires CheckInvariants to report it.
func requireCaught(t *testing.T, setup func(*testing.T) *Allocator, cs []corruption) {
	t.Helper()
	for _, c := range cs {
		t.Run(c.name, func(t *testing.T) {
			a := setup(t)
			c.breakIt(a)
			require.ErrorContains(t, a.CheckInvariants(), c.want)
		})
	}
}

// TestPlannedQuietWhereNothingRepeats: where no step repeats the one
// before it, the policy stops logging most steps, in runs of quiet steps
// that double up to maxQuiet, each after two recorded steps in a row; once
// the steps repeat, a plan is made within maxQuiet+3 steps and served.
func TestPlannedQuietWhereNothingRepeats(t *testing.T) {
	a, _ := newOn(t, Config{Policy: PolicyPlanned})
	p := a.pol.plan
	var recorded []bool
	for i := range 300 {
		sizes := append([]uint64(nil), stepSizes...)
		sizes[2] += uint64(i+1) << 20 // a cache that grows a step
		runStep(t, a, sizes)
		recorded = append(recorded, p.recording)
		require.NoError(t, a.CheckInvariants())
	}
	plans, _, _ := planCounts(a)
	require.Zero(t, plans)
	assert.Equal(t, []bool{true, true, true, true, false, true, true, false, false, true, true}, recorded[:11],
		"the fourth miss in a row starts the first quiet run, of one step; then two recorded, two quiet")

	// A step that allocates nothing is no miss: after a quiet run, it
	// starts no other run.
	b, _ := newOn(t, Config{Policy: PolicyPlanned})
	for i := range 5 { // four misses, then the first quiet step
		sizes := append([]uint64(nil), stepSizes...)
		sizes[2] += uint64(i+1) << 20
		runStep(t, b, sizes)
	}
	require.False(t, b.pol.plan.recording)
	b.MarkStep("step") // recorded, and empty
	require.True(t, b.pol.plan.recording)
	b.MarkStep("step")
	assert.True(t, b.pol.plan.recording, "the step after an empty one is recorded")
	require.NoError(t, b.CheckInvariants())
	n, run, longest := 0, 0, 0
	for i, r := range recorded {
		if !r {
			run++
			longest = max(longest, run)
			continue
		}
		n++
		if run > 0 {
			require.True(t, recorded[i+1], "step %d: a quiet run ends in two recorded steps", i)
		}
		run = 0
	}
	assert.Equal(t, maxQuiet, longest, "runs double up to maxQuiet")
	assert.Less(t, n, 30, "recorded steps of 300")

	// The steps repeat from now on: planned, then served, in time.
	for i := range maxQuiet + 3 {
		runStep(t, a, stepSizes)
		if plans, _, _ = planCounts(a); plans > 0 {
			t.Logf("planned at the mark of the %dth repeated step", i+1)
			break
		}
	}
	require.EqualValues(t, 1, plans, "a plan within maxQuiet+3 steps of the first repeat")
	_, before, _ := planCounts(a)
	runStep(t, a, stepSizes)
	_, served, _ := planCounts(a)
	assert.EqualValues(t, len(stepSizes), served-before, "the next step is served from the arena")
	assert.Zero(t, p.quiet)
	require.NoError(t, a.CheckInvariants())
}

// TestPlannedQuietRunsStayBounded: misses keeps counting where no step
// ever repeats, and the quiet runs stay maxQuiet steps long however many
// there were (a run's length was a shift of the count: from the 130th miss
// in a row it wrapped, and the policy stopped recording for good).
func TestPlannedQuietRunsStayBounded(t *testing.T) {
	var p planState
	recorded, run, runs := true, 0, 0
	for step := range 40_000 {
		missed := recorded // every recorded step repeats nothing
		if missed {
			p.misses++
		}
		recorded = !p.quietLocked(missed)
		require.True(t, p.quiet >= 0 && p.quiet < maxQuiet, "step %d, %d misses: %d quiet steps to come", step, p.misses, p.quiet)
		if !recorded {
			run++
			continue
		}
		if run > 0 && p.misses > 20 {
			require.Equal(t, maxQuiet, run, "step %d, %d misses: a run of %d quiet steps", step, p.misses, run)
			runs++
		}
		run = 0
	}
	require.Greater(t, p.misses, 1000)
	require.Greater(t, runs, 500)
}

// TestPlannedFindsARepeatAfterThousandsOfMisses: after 5,000 steps of
// which none fits the one before (past the 130 misses in a row at
// which the quiet runs' length wrapped), steps that repeat are still
// planned within maxQuiet+3 steps.
func TestPlannedFindsARepeatAfterThousandsOfMisses(t *testing.T) {
	a, _ := newOn(t, Config{Policy: PolicyPlanned})
	p := a.pol.plan
	step := []uint64{1 << 20, 0}
	for i := range 5_000 {
		step[1] = uint64(i+1) << 9 // larger than the step before's: it fits no step seen
		runStep(t, a, step)
		require.True(t, p.quiet >= 0 && p.quiet < maxQuiet, "step %d: %d quiet steps to come", i, p.quiet)
	}
	require.Greater(t, p.misses, 130)
	require.NoError(t, a.CheckInvariants())
	plans := int64(0)
	step[1] = 8 << 9
	for range maxQuiet + 3 {
		runStep(t, a, step)
		if plans, _, _ = planCounts(a); plans > 0 {
			break
		}
	}
	require.EqualValues(t, 1, plans, "a plan within maxQuiet+3 steps of the first repeat")
	require.NoError(t, a.CheckInvariants())
}

// TestPlannedConcurrent runs steps on the default stream from one
// goroutine while others allocate and free on it and on a second stream,
// and marks steps from another: the plan's log is written under the
// default shard's lock by the fast paths and read by the world (run with
// -race).
func TestPlannedConcurrent(t *testing.T) {
	a, dev := newOn(t, Config{Policy: PolicyPlanned})
	s, err := dev.NewStream()
	require.NoError(t, err)
	errs := make(chan error, 4)
	work := func(stream device.Stream, n int) {
		for i := range n {
			p, err := a.Alloc(uint64(1+i%7)<<20, stream)
			if err != nil {
				errs <- err
				return
			}
			if err := a.Free(p); err != nil {
				errs <- err
				return
			}
		}
		errs <- nil
	}
	stop := inBackground(func() { a.MarkStep("step") })
	go work(0, 2000)
	go work(0, 2000)
	go func() {
		for range 50 {
			var prev device.Ptr
			for _, size := range stepSizes {
				p, err := a.Alloc(size, 0)
				if err != nil {
					errs <- err
					return
				}
				if prev != 0 {
					if err := a.Free(prev); err != nil {
						errs <- err
						return
					}
				}
				prev = p
			}
			if err := a.Free(prev); err != nil {
				errs <- err
				return
			}
		}
		errs <- nil
	}()
	go work(s, 2000)
	for range 4 {
		require.NoError(t, <-errs)
	}
	stop()
	require.NoError(t, a.CheckInvariants())
}

// TestPlannedReclaimsOnlyWhenTheDeviceIsShort: a pattern that strands
// free pages (10 MiB holes, then 13 MiB requests) makes the planned
// policy unmap nothing while the device has room: the freed pages stay
// mapped, as PyTorch's cache keeps them. On a device of 1000 MiB it
// unmaps free pages only once reserved memory would pass all of the
// device (it used to at 960 MiB, all but the slack's 4 %), and no map is
// refused.
func TestPlannedReclaimsOnlyWhenTheDeviceIsShort(t *testing.T) {
	run := func(capacity uint64) (peakReserved uint64, unmaps, refused int64) {
		dev := simtest.New(t, simtest.Capacity(capacity))
		a, err := New(dev, Config{Policy: PolicyPlanned})
		require.NoError(t, err)
		live := strandPages(t, a)
		peakReserved = uint64(get(t, a, "reserved_bytes.all.peak"))
		for i := 1; i < len(live); i++ {
			if i >= 64 || i%2 == 1 {
				mustFree(t, a, live[i])
			}
		}
		require.NoError(t, a.CheckInvariants())
		c := dev.Counters()
		return peakReserved, c.Unmaps, c.FailedMaps
	}
	peak, unmaps, _ := run(80 << 30)
	assert.Zero(t, unmaps, "a roomy device: freed pages stay mapped")
	assert.Greater(t, peak, uint64(1030*mib), "64 x 10 + 30 x 13 MiB, and the pages mapped ahead")

	peak, unmaps, refused := run(1000 * mib)
	assert.Positive(t, unmaps, "the device short, free pages are unmapped")
	assert.Greater(t, peak, uint64(960*mib), "all of the device is used before a page is unmapped")
	assert.Zero(t, refused, "no map refused by the device")
}

// TestPlanBelow packs random steps (requests of random sizes and
// lifetimes, some not in the arena) by each fit and checks every arena
// request's block below against its definition: of the arena requests
// in use when it is allocated, the one at the highest offset below its
// own, else none (-1); and, on BERT's step, planBelow given the arena's
// positions sorted by offset, as the benchmark gives them, agrees with
// the packing's own order.
func TestPlanBelow(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	check := func(name string, reqs []planReq) {
		t.Helper()
		for k, r := range reqs {
			if !r.arena {
				continue
			}
			want := int32(-1)
			for j, o := range reqs {
				if o.arena && o.start < r.start && r.start < o.end && o.off < r.off && (want < 0 || o.off > reqs[want].off) {
					want = int32(j)
				}
			}
			require.Equal(t, want, r.below, "%s: request %d", name, k)
		}
	}
	for round := range 100 {
		n := 1 + rng.IntN(200)
		ev := rng.Perm(2 * n) // each request's two operations, distinct
		reqs := make([]planReq, n)
		for k := range reqs {
			a, b := int32(ev[2*k]), int32(ev[2*k+1])
			reqs[k] = planReq{size: uint64(1+rng.IntN(8)) << 9, arena: rng.IntN(5) > 0, start: min(a, b), end: max(a, b), below: -7}
		}
		for _, how := range []packing{packTime, packFirst, packBest} {
			packReqs(reqs, how)
			check(fmt.Sprintf("round %d, packing %d", round, how), reqs)
		}
	}
	reqs, ops := bertStepReqs(t)
	packReqs(reqs, packFirst)
	check("BERT's step", reqs)
	want := make([]int32, len(reqs))
	for k := range reqs {
		want[k] = reqs[k].below
	}
	planBelow(reqs, ops, arenaByOffset(reqs))
	for k := range reqs {
		require.Equal(t, want[k], reqs[k].below, "BERT's step, request %d", k)
	}
}

// arenaByOffset returns the positions of reqs' arena requests by offset:
// the order the packing gives planBelow, found by a sort.
func arenaByOffset(reqs []planReq) []int32 {
	var byOff []int32
	for k := range reqs {
		if reqs[k].arena {
			byOff = append(byOff, int32(k))
		}
	}
	slices.SortFunc(byOff, func(x, y int32) int { return cmp.Compare(reqs[x].off, reqs[y].off) })
	return byOff
}

// TestPlannedStepFreesManyOlderBlocks plans a step of one allocation that
// also frees many blocks allocated before it (as a step may free the last
// step's activations): the boundary matches its frees with its one
// allocation and plans it, and the next step is served.
func TestPlannedStepFreesManyOlderBlocks(t *testing.T) {
	a, _ := newOn(t, Config{Policy: PolicyPlanned})
	var old []device.Ptr
	for range 300 {
		old = append(old, mustAlloc(t, a, 4096, 0))
	}
	runStep(t, a, []uint64{1 << 20})
	a.MarkStep("step")
	p := mustAlloc(t, a, 1<<20, 0)
	mustFree(t, a, old...)
	mustFree(t, a, p)
	runStep(t, a, []uint64{1 << 20}) // plans the step before it
	runStep(t, a, []uint64{1 << 20})
	plans, served, _ := planCounts(a)
	assert.Equal(t, int64(1), plans)
	assert.Equal(t, int64(2), served)
	require.NoError(t, a.CheckInvariants())
}
