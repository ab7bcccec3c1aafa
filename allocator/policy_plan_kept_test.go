package allocator

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// phases runs marked steps of unmarkedLoop's kind on a: for each run, n
// steps of allocs allocations (1 MiB times their position), checking the
// invariants after each step.
func phases(t *testing.T, a *Allocator, runs ...[2]int) {
	t.Helper()
	for _, r := range runs {
		for range r[0] {
			a.MarkStep("step")
			unmarkedLoop(t, a, 1, r[1], 1<<20)
			require.NoError(t, a.CheckInvariants())
		}
	}
}

// TestPlannedTakesUpAKeptPlan: training steps (20 requests) with an
// evaluation of four steps (12 requests) every few steps. The first
// evaluation step spares the training plan, the second ends it, and the
// plan is kept; the evaluation's plan is packed at the third. The second
// training step back ends the evaluation's plan and fits the kept
// training plan, which is taken up again, packed already: the third step
// back is served. From then on each phase takes up its plan at its second
// step: two plans packed, three taken up. Without kept plans each phase
// packed its plan again at its third step (five plans, one step less
// served each time).
func TestPlannedTakesUpAKeptPlan(t *testing.T) {
	a, _ := newOn(t, Config{Policy: PolicyPlanned})
	train, eval := [2]int{5, 20}, [2]int{4, 12}
	phases(t, a, train, eval)
	p := a.pol.plan
	require.Len(t, p.kept, 1, "the training plan, kept")
	require.Equal(t, 12, len(p.sizes), "the evaluation's plan")
	plans, _, _ := planCounts(a)
	require.EqualValues(t, 2, plans)

	// A step's boundary (the mark that starts the next) judges it: the
	// mark that starts the third step back finds the second fitting the
	// kept training plan.
	phases(t, a, [2]int{2, 20})
	require.Zero(t, p.reuses)
	_, before, _ := planCounts(a)
	phases(t, a, [2]int{1, 20})
	require.EqualValues(t, 1, p.reuses, "the training plan taken up after the second step back")
	require.Equal(t, 20, len(p.sizes))
	require.Len(t, p.kept, 1, "the evaluation's plan, kept")
	_, after, _ := planCounts(a)
	require.EqualValues(t, 20, after-before, "the third step back served whole")

	phases(t, a, eval, train)
	plans, _, _ = planCounts(a)
	require.EqualValues(t, 2, plans, "no plan packed again")
	require.EqualValues(t, 3, p.reuses)
	st, _ := a.PlanStats()
	require.EqualValues(t, 3, st.Reused)
}

// TestPlannedKeepsFewPlans: a plan of each of five shapes in turn, each
// run long enough to be planned: at most maxKeptPlans are kept, the
// oldest dropped first; a plan that covers a kept one (as many requests,
// none smaller) drops it.
func TestPlannedKeepsFewPlans(t *testing.T) {
	a, _ := newOn(t, Config{Policy: PolicyPlanned})
	for _, n := range []int{20, 21, 22, 23, 24} {
		phases(t, a, [2]int{4, n})
	}
	p := a.pol.plan
	require.Len(t, p.kept, maxKeptPlans)
	for i, k := range p.kept {
		require.Len(t, k.sizes, 21+i, "the newest kept, the oldest dropped")
	}
	// Steps of 22 requests, larger: a plan of their own, which covers
	// the kept plan of 22 smaller ones and drops it.
	for range 4 {
		a.MarkStep("step")
		unmarkedLoop(t, a, 1, 22, 2<<20)
		require.NoError(t, a.CheckInvariants())
	}
	require.Len(t, p.sizes, 22)
	for _, k := range p.kept {
		require.NotEqual(t, 22, len(k.sizes), "a covered plan kept")
	}
}

// TestCheckInvariantsCatchesKeptPlanCorruption: the invariants of the
// kept plans (checkKeptLocked) catch too many kept, a kept plan sharing
// the plan's requests, one with a block of a step, and one whose sizes
// are not its requests'.
func TestCheckInvariantsCatchesKeptPlanCorruption(t *testing.T) {
	setup := func(t *testing.T) *Allocator {
		a, _ := newOn(t, Config{Policy: PolicyPlanned})
		phases(t, a, [2]int{5, 20}, [2]int{4, 12})
		require.Len(t, a.pol.plan.kept, 1)
		require.NotNil(t, a.pol.plan.reqs)
		return a
	}
	requireCaught(t, setup, []corruption{
		{"too many", "more than", func(a *Allocator) {
			p := a.pol.plan
			for len(p.kept) <= maxKeptPlans {
				p.kept = append(p.kept, p.kept[0])
			}
		}},
		{"sharing the plan's requests", "shares", func(a *Allocator) {
			p := a.pol.plan
			p.kept[0].reqs, p.kept[0].sizes = p.reqs, append([]uint64(nil), p.sizes...)
		}},
		{"a block of a step", "a block of a step: true", func(a *Allocator) {
			p := a.pol.plan
			p.kept[0].reqs[0].at = p.kept[0].reqs[1].at
			if p.kept[0].reqs[0].at == nil {
				p.kept[0].reqs[0].at = p.last
			}
		}},
		{"sizes not its requests'", "sizes for", func(a *Allocator) {
			p := a.pol.plan
			p.kept[0].sizes = p.kept[0].sizes[:1]
		}},
	})
}
