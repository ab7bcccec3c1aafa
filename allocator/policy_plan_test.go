package allocator_test

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpumem/gpumem/allocator"
	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/device/sim"
	"github.com/gpumem/gpumem/gpumemtest"
	"github.com/gpumem/gpumem/trace"
	"github.com/gpumem/gpumem/trace/replay"
)

// TestPlannedServesRepeatedSteps replays the BERT training trace under
// the planned policy. Its three steps are all different to the policy:
// the first makes the optimizer's state, and the third has no step after
// it, so nothing is planned. With the last step repeated to five steps,
// the third repeats the second and is planned at the fourth's mark: the
// fourth and fifth are served from the arena whole, and so are the
// sixth to eighth with three more repeats, with no device call, each
// request's place found from the block just below it.
func TestPlannedServesRepeatedSteps(t *testing.T) {
	ops := fileOps("../trace/replay/testdata/bert_b2.trace.gz")(t)
	cfg := allocator.Config{Policy: allocator.PolicyPlanned}
	capacity := uint64(80 << 30)
	var walks int64
	var last *allocator.Allocator
	run := func(ops []trace.Op) (replay.Result, [3]int64) {
		a := gpumemtest.New(t, gpumemtest.WithCapacity(capacity), gpumemtest.WithConfig(cfg), gpumemtest.AllowLeaks())
		dev := a.Device().(*sim.Device)
		res, err := replay.Run(trace.SliceReader(ops), a, dev, replay.Options{})
		require.NoError(t, err)
		require.NoError(t, a.CheckInvariants())
		require.Zero(t, res.OOMs)
		var c [3]int64
		c[0], c[1], c[2] = a.PlanCounts()
		walks = a.PlanWalks()
		last = a
		return *res, c
	}
	res3, c := run(ops)
	require.Equal(t, [3]int64{0, 0, 0}, c, "plans, served, departures")
	res5, c := run(repeatLastStep(ops, 5))
	require.Equal(t, [3]int64{1, 2 * 1004, 0}, c, "plans, served, departures")
	res8, c := run(repeatLastStep(ops, 8))
	require.Equal(t, [3]int64{1, 5 * 1004, 0}, c, "plans, served, departures")
	// A served request finds its place from the block just below it,
	// handed out earlier in the step, but for the few with none below
	// (9 a step).
	require.Less(t, walks*50, c[1], "%d of %d served requests walked to their place", walks, c[1])
	// Those walk from a block of the arena, not from the segment's first
	// block: about 130 blocks lie below the arena.
	from, size, first, addr, ok := last.PlanWalkStart()
	require.True(t, ok)
	assert.True(t, from <= addr && uint64(addr-from) < size, "a walk to the arena's address %v starts at %v+%d", addr, from, size)
	assert.False(t, first, "a walk starts from the arena's segment's first block")
	require.Equal(t, res5.DeviceAllocs+res5.DeviceFrees, res8.DeviceAllocs+res8.DeviceFrees, "the steps served from the arena make no device call")
	// Packed in time order, and served with no skip: never packed again.
	how, ok := last.PlanPacking()
	require.True(t, ok)
	assert.Equal(t, "time", how, "BERT's marked step is packed in time order")
	st, _ := last.PlanStats()
	assert.Zero(t, st.Skips+st.Repacks, "skips and packings again")

	// On the smallest device the three steps fit (1.003 x their peak
	// requested), the repeats fit too (run checks that no request ran out
	// of memory), online: the arena, contiguous, cannot use the free pages
	// that the blocks kept across steps pin, and is not tried. On a device
	// of 1.005 x the peak requested, they are served from the arena: not
	// the arena in time order (0.51 % above the step's peak), which finds
	// no room, but the plan packed again by first fit, at the peak.
	card := smallestCard(t, ops, cfg, uint64(res3.PeakRequested), uint64(res3.PeakReserved))
	capacity = card
	_, c = run(repeatLastStep(ops, 8))
	require.Equal(t, [3]int64{1, 0, 0}, c, "plans, served, departures on %d bytes", capacity)
	const page = 2 << 20
	capacity = (uint64(1.005*float64(res3.PeakRequested)) + page - 1) / page * page
	_, c = run(repeatLastStep(ops, 8))
	require.Equal(t, [3]int64{1, 5 * 1004, 0}, c, "plans, served, departures on %d bytes", capacity)
	how, _ = last.PlanPacking()
	assert.Equal(t, "first", how, "packed again by first fit")
	st, _ = last.PlanStats()
	assert.EqualValues(t, 1, st.Repacks, "packings again")
}

// TestPlannedServesStepsWithASideStream: BERT's steps with their input
// copied on a stream of their own, as a data loader's prefetch does, are
// planned on the main stream and served as the same steps without it:
// the side allocations, two at each step's start, are served online,
// and nothing departs. (Before a step's main stream and its side ones
// were told apart, no step on two streams was planned: 0 plans and 50
// device calls where there are now 58, with the same peak reserved.)
func TestPlannedServesStepsWithASideStream(t *testing.T) {
	ops := repeatLastStep(fileOps("../trace/replay/testdata/bert_b2.trace.gz")(t), 8)
	plain, c := planRun(t, ops)
	require.Equal(t, [3]int64{1, 5 * 1004, 0}, c, "plans, served, departures")
	side, c := planRun(t, withSideInput(ops))
	require.Equal(t, [3]int64{1, 5 * 1004, 0}, c, "plans, served, departures, with the side input")
	// The side stream's pool maps its own pages, ahead of its need as the
	// policy maps (42 MiB here, the same with no plan).
	assert.LessOrEqual(t, side.DeviceAllocs+side.DeviceFrees, plain.DeviceAllocs+plain.DeviceFrees+1, "device calls")
	assert.LessOrEqual(t, side.PeakReserved, plain.PeakReserved+64<<20, "peak reserved")
}

// planRun replays ops under the planned policy on an 80 GiB device and
// returns the result and the plan's counts: plans, served, departures.
func planRun(t *testing.T, ops []trace.Op) (replay.Result, [3]int64) {
	res, st := planStatsRun(t, allocator.Config{Policy: allocator.PolicyPlanned}, ops)
	return res, [3]int64{st.Plans, st.Served, st.Departures}
}

// planStatsRun replays ops under cfg, a planned configuration, on an 80
// GiB device, checks the invariants and that nothing ran out of memory,
// and returns the result and the plan's figures.
func planStatsRun(t *testing.T, cfg allocator.Config, ops []trace.Op) (replay.Result, allocator.PlanStats) {
	a := gpumemtest.New(t, gpumemtest.WithCapacity(80<<30), gpumemtest.WithConfig(cfg), gpumemtest.AllowLeaks())
	res, err := replay.Run(trace.SliceReader(ops), a, a.Device().(*sim.Device), replay.Options{})
	require.NoError(t, err)
	require.NoError(t, a.CheckInvariants())
	require.Zero(t, res.OOMs)
	st, ok := a.PlanStats()
	require.True(t, ok)
	return *res, st
}

// TestPlannedServesASmallerLastBatch replays the BERT trace at batch 8
// with its last step repeated to eight steps, the sixth at batch 4
// instead (bert_b4's step: the same operations, each size no larger): a
// last batch that is smaller, as an epoch's last can be. The sixth step
// is served from the arena whole, as the others are, with no departure,
// and keeps the plan for the two after it: the replay makes the device
// calls and reaches the peak reserved of the replay at batch 8 alone.
// Without marks (twelve steps, the tenth at batch 4), the steps the
// policy finds are served as at batch 8 alone too.
func TestPlannedServesASmallerLastBatch(t *testing.T) {
	b8 := fileOps("../trace/replay/testdata/bert_b8.trace.gz")(t)
	b4 := fileOps("../trace/replay/testdata/bert_b4.trace.gz")(t)
	// traces returns the batch-8 trace of steps steps, and the same with
	// step at batch 4, marked or not.
	traces := func(steps, step int, marked bool) (big, mixed []trace.Op) {
		batches := [][]trace.Op{repeatLastStep(b8, steps), repeatLastStep(b4, steps)}
		big = batchSteps(t, batches, marked, func(int) int { return 0 })
		mixed = batchSteps(t, batches, marked, func(s int) int {
			if s == step {
				return 1
			}
			return 0
		})
		smaller := 0
		for i, op := range big {
			require.LessOrEqual(t, mixed[i].Size, op.Size)
			if mixed[i].Size < op.Size {
				smaller++
			}
		}
		require.Greater(t, smaller, 100, "the requests that batch 4 makes smaller")
		return big, mixed
	}
	big, mixed := traces(8, 6, true)
	whole, c := planRun(t, big)
	require.Equal(t, [3]int64{1, 5 * 1004, 0}, c, "batch 8: plans, served, departures")
	res, c := planRun(t, mixed)
	require.Equal(t, [3]int64{1, 5 * 1004, 0}, c, "a smaller sixth step: plans, served, departures")
	assert.Equal(t, whole.DeviceAllocs+whole.DeviceFrees, res.DeviceAllocs+res.DeviceFrees)
	assert.Equal(t, whole.PeakReserved, res.PeakReserved)

	big, mixed = traces(12, 10, false)
	whole, c = planRun(t, big)
	require.Equal(t, [3]int64{1, 7 * 1004, 0}, c, "unmarked, batch 8: plans, served, departures")
	res, c = planRun(t, mixed)
	require.Equal(t, [3]int64{1, 7 * 1004, 0}, c, "unmarked, a smaller tenth step: plans, served, departures")
	assert.Equal(t, whole.DeviceAllocs+whole.DeviceFrees, res.DeviceAllocs+res.DeviceFrees)
	assert.Equal(t, whole.PeakReserved, res.PeakReserved)
}

// TestPlannedServesBatchesThatVary replays BERT's training step at
// batch sizes 2, 4 and 8 in orders that go both ways, as a sampler that
// buckets examples by length feeds a model: no step repeats the one
// before it (the policy used to plan none of them), but each fits the
// envelope of the steps before it (at each position, the largest size
// seen) once the largest batch has run, and is served from a plan of
// that envelope; without marks too, once the policy has found its steps
// where they repeated.
func TestPlannedServesBatchesThatVary(t *testing.T) {
	const steps = 14
	var batches [][]trace.Op
	for _, f := range []string{"bert_b8", "bert_b4", "bert_b2"} {
		batches = append(batches, repeatLastStep(fileOps("../trace/replay/testdata/"+f+".trace.gz")(t), steps))
	}
	// mix returns the trace whose first two steps are at batch first's
	// and whose later steps follow order: never the same batch twice in
	// a row.
	mix := func(first int, order []int) []trace.Op {
		require.Len(t, order, steps-2)
		for i := 1; i < len(order); i++ {
			require.NotEqual(t, order[i-1], order[i])
		}
		return batchSteps(t, batches, true, func(s int) int {
			if s < 3 {
				return first
			}
			return order[s-3]
		})
	}
	whole, c := planRun(t, batchSteps(t, batches, true, func(int) int { return 0 }))
	require.Equal(t, [3]int64{1, 11 * 1004, 0}, c, "batch 8 alone: plans, served, departures")

	// Batch 8 first, then 4, 2, 8, 2, 4, 8, ...: the third step (batch
	// 4) fits the second (batch 8), and is planned with the second's
	// sizes; every step after it is served from the arena whole, as at
	// batch 8 alone, with its device calls and its peak reserved.
	res, c := planRun(t, mix(0, []int{1, 2, 0, 2, 1, 0, 1, 2, 1, 0, 2, 1}))
	require.Equal(t, [3]int64{1, 11 * 1004, 0}, c, "batch 8 first: plans, served, departures")
	assert.Equal(t, whole.DeviceAllocs+whole.DeviceFrees, res.DeviceAllocs+res.DeviceFrees, "device calls")
	assert.Equal(t, whole.PeakReserved, res.PeakReserved)

	// Batch 2 first, then 4, 2, 4, 8, 2, 4, ...: the third step (batch
	// 4) is larger than the second: the envelope grows. The fourth
	// (batch 2) fits it and is planned with batch 4's sizes; the fifth is
	// served; the sixth (batch 8) departs at its first request, larger,
	// runs online and grows the envelope to batch 8's; the seventh fits
	// it and is planned again, and the seven after it are served. The
	// first arena, of batch 4, and the second leave the peak reserved
	// within 1 % of batch 8 alone's.
	res, c = planRun(t, mix(2, []int{1, 2, 1, 0, 2, 1, 0, 1, 2, 0, 1, 2}))
	require.Equal(t, [3]int64{2, 8 * 1004, 1}, c, "batch 8 late: plans, served, departures")
	assert.LessOrEqual(t, res.DeviceAllocs+res.DeviceFrees, whole.DeviceAllocs+whole.DeviceFrees, "device calls")
	assert.InEpsilon(t, whole.PeakReserved, res.PeakReserved, 0.01)

	// Without marks, the first six steps at batch 4: once the policy has
	// found the period (one step, 1,004 allocations), its boundaries are
	// counted in allocations, and the steps that vary after them are
	// planned from their envelope as with marks: 2 plans, 17 steps
	// served, 1 departure (the first batch 8). Before the envelope, 1
	// plan and 3 steps served, with a period of three steps found (the
	// search compared sizes then; TestPlannedFindsStepsThatVaryWithoutMarks
	// has steps that vary from the first).
	var longer [][]trace.Op
	for _, f := range []string{"bert_b8", "bert_b4", "bert_b2"} {
		longer = append(longer, repeatLastStep(fileOps("../trace/replay/testdata/"+f+".trace.gz")(t), 24))
	}
	order := []int{1, 1, 1, 1, 2, 1, 0, 2, 1, 0, 1, 2, 1, 0, 2, 1, 0, 2, 1, 2, 0, 1}
	unmarked := batchSteps(t, longer, false, func(s int) int {
		if s < 3 {
			return 1
		}
		return order[s-3]
	})
	a := gpumemtest.New(t, gpumemtest.WithCapacity(80<<30), gpumemtest.WithConfig(allocator.Config{Policy: allocator.PolicyPlanned}), gpumemtest.AllowLeaks())
	_, err := replay.Run(trace.SliceReader(unmarked), a, a.Device().(*sim.Device), replay.Options{})
	require.NoError(t, err)
	require.NoError(t, a.CheckInvariants())
	st, _ := a.PlanStats()
	assert.EqualValues(t, 1004, st.FoundPeriod)
	assert.Equal(t, [3]int64{2, 17 * 1004, 1}, [3]int64{st.Plans, st.Served, st.Departures}, "unmarked: plans, served, departures")
}

// TestPlannedFindsStepsWithoutMarks replays the BERT trace with its last
// step repeated to 20 steps and every step mark taken out: the planned
// policy finds the period of its allocations (one step, 1,004
// allocations), marks its boundaries itself where the bytes allocated
// are lowest, as the marks were, and plans the step when it repeats:
// steps are served whole from the arena, two steps later than with the
// marks (the period is found during the fourth step and confirmed in the
// fifth). Peak reserved and device calls are those of the marked replay.
func TestPlannedFindsStepsWithoutMarks(t *testing.T) {
	ops := repeatLastStep(fileOps("../trace/replay/testdata/bert_b2.trace.gz")(t), 20)
	var unmarked []trace.Op
	for _, op := range ops {
		if op.Kind != trace.Mark {
			unmarked = append(unmarked, op)
		}
	}
	run := func(ops []trace.Op) (*replay.Result, [3]int64) {
		a := gpumemtest.New(t, gpumemtest.WithConfig(allocator.Config{Policy: allocator.PolicyPlanned}), gpumemtest.AllowLeaks())
		res, err := replay.Run(trace.SliceReader(ops), a, a.Device().(*sim.Device), replay.Options{})
		require.NoError(t, err)
		require.NoError(t, a.CheckInvariants())
		var c [3]int64
		c[0], c[1], c[2] = a.PlanCounts()
		return res, c
	}
	marked, c := run(ops)
	require.Equal(t, [3]int64{1, 17 * 1004, 0}, c, "marked: plans, served, departures")
	found, c := run(unmarked)
	require.Equal(t, [3]int64{1, 15 * 1004, 0}, c, "unmarked: plans, served, departures")
	require.Equal(t, marked.PeakReserved, found.PeakReserved)
	require.Equal(t, marked.DeviceAllocs+marked.DeviceFrees, found.DeviceAllocs+found.DeviceFrees)
}

// TestPlannedFindsStepsThatVaryWithoutMarks replays bert_batches (BERT's
// training step at batches 2, 4 and 8, the batch changing every step
// from the third) with its marks taken out. The search for steps
// compares the order of allocations and frees, not the sizes, so it
// finds the period (one step, 1,004 allocations) although no two steps
// in a row have the same sizes, puts its boundaries where the marks
// were, and the plan machinery plans the steps' envelope: once it holds
// batch 8's sizes, every step is served from the arena. (Before the
// search compared shapes it found nothing here, and nothing was
// planned.) The generation traces' caches grow by a token a step: the
// order of their operations repeats, the bytes kept from one repeat to
// the next do not, and the search finds no period in them (one that did
// find them made 384 plans on kv_dynamic, and 4,449 device calls where
// the online policy makes 13).
func TestPlannedFindsStepsThatVaryWithoutMarks(t *testing.T) {
	unmarked := func(ops []trace.Op) []trace.Op {
		var out []trace.Op
		for _, op := range ops {
			if op.Kind != trace.Mark {
				out = append(out, op)
			}
		}
		return out
	}
	run := func(ops []trace.Op) (replay.Result, allocator.PlanStats) {
		return planStatsRun(t, allocator.Config{Policy: allocator.PolicyPlanned}, ops)
	}
	for _, steps := range []int{20, 100} {
		ops := bertBatches(t, steps)
		marked, mst := run(ops)
		res, st := run(unmarked(ops))
		assert.EqualValues(t, 1004, st.FoundPeriod, "%d steps", steps)
		assert.Equal(t, [3]int64{1, int64(steps-7) * 1004, 0}, [3]int64{st.Plans, st.Served, st.Departures}, "%d steps: plans, served, departures", steps)
		// With marks the first plan is made at batch 4's envelope, a
		// step sooner; the batch 8 after it departs and a second plan
		// follows (2 plans, 1 departure).
		assert.Equal(t, [3]int64{2, int64(steps-6) * 1004, 1}, [3]int64{mst.Plans, mst.Served, mst.Departures}, "%d steps, marked", steps)
		assert.LessOrEqual(t, res.DeviceAllocs+res.DeviceFrees, marked.DeviceAllocs+marked.DeviceFrees, "device calls")
		assert.LessOrEqual(t, res.PeakReserved, marked.PeakReserved)
	}
	for _, dynamic := range []bool{false, true} {
		ops := kvCacheOps(8, 128, 384, dynamic)
		marked, _ := run(ops)
		res, st := run(unmarked(ops))
		assert.Zero(t, st.FoundPeriod, "dynamic %v: a period", dynamic)
		assert.Zero(t, st.Plans, "dynamic %v: plans", dynamic)
		assert.LessOrEqual(t, res.DeviceAllocs+res.DeviceFrees, marked.DeviceAllocs+marked.DeviceFrees, "dynamic %v: device calls", dynamic)
	}
}

// TestPlannedFindsTheCNNsSteps replays eor_cnn, a real trace with no
// step marks, on an 80 GiB device: the planned policy finds its period
// (193 allocations), plans it once and serves the steps after it from the
// arena. The arena lies at the top of the free block it is found in, so
// that the requests served online (the blocks the steps keep, and the
// skips) carve that block's low end rather than the arena: the replay
// makes the online phase's three maps and no other device call (with the
// arena at the bottom of its block, online blocks landed in it, and the
// next boundary unmapped the free pages and mapped an arena elsewhere: 10
// calls, the faithful default's number). Peak reserved is the online
// phase's (1.259 x the peak requested).
func TestPlannedFindsTheCNNsSteps(t *testing.T) {
	ops := fileOps("../trace/replay/testdata/EoR_NN_cnn_counterfactuals.trace.gz")(t)
	run := func(cfg allocator.Config, stop int) (*replay.Result, *allocator.Allocator) {
		a := gpumemtest.New(t, gpumemtest.WithConfig(cfg), gpumemtest.AllowLeaks())
		res, err := replay.Run(trace.SliceReader(ops[:stop]), a, a.Device().(*sim.Device), replay.Options{})
		require.NoError(t, err)
		require.NoError(t, a.CheckInvariants())
		require.Zero(t, res.OOMs)
		return res, a
	}
	cfg := allocator.Config{Policy: allocator.PolicyPlanned}
	res, a := run(cfg, len(ops))
	plans, served, departures := a.PlanCounts()
	assert.EqualValues(t, 1, plans)
	assert.Zero(t, departures)
	assert.Greater(t, served, 3*int64(len(ops))/2/10, "more than three of its ten periods are served")
	st, ok := a.PlanStats()
	require.True(t, ok)
	assert.Less(t, st.Skips*50, served, "a skip is rare")
	assert.EqualValues(t, 193, st.FoundPeriod, "the period found: one step of the CNN")
	how, ok := a.PlanPacking()
	require.True(t, ok)
	assert.Equal(t, "best", how, "steps found without marks are packed by best fit")
	assert.Zero(t, st.Repacks)
	assert.EqualValues(t, 3, res.DeviceAllocs+res.DeviceFrees)
	faithful, _ := run(allocator.Config{}, len(ops))
	assert.Less(t, res.DeviceAllocs+res.DeviceFrees, faithful.DeviceAllocs+faithful.DeviceFrees)
	// The peak is reached in the first quarter of the replay, before the
	// plan: the arena raises no peak.
	online, a := run(cfg, len(ops)/4)
	_, served, _ = a.PlanCounts()
	require.Zero(t, served)
	assert.Equal(t, online.PeakReserved, res.PeakReserved, "the arena raises no peak")
}

// TestPlannedCallsNoMoreThanTheDefault replays every trace of
// POLICY.md's table on an 80 GiB device under the planned policy and
// PyTorch's default: the planned policy makes no more device calls than
// the default on any. While the device has room it keeps freed pages
// mapped and maps 40 MiB ahead of a request (roomyLimitsLocked); bounding
// both by the slack over the peak requested, as low_fragmentation does,
// made 20 calls against the default's 10 on eor_cnn (no room in 4 % of
// 108 MB to map ahead), 481 against 303 on random_mixed and 444 against
// 33 on kv_dynamic (pages unmapped and mapped again as the live set
// moves).
func TestPlannedCallsNoMoreThanTheDefault(t *testing.T) {
	calls := func(ops []trace.Op, cfg allocator.Config) int64 {
		a := gpumemtest.New(t, gpumemtest.WithCapacity(80<<30), gpumemtest.WithConfig(cfg), gpumemtest.AllowLeaks())
		res, err := replay.Run(trace.SliceReader(ops), a, a.Device().(*sim.Device), replay.Options{})
		require.NoError(t, err)
		require.Zero(t, res.OOMs)
		return res.DeviceAllocs + res.DeviceFrees
	}
	for _, tr := range policyTraces() {
		t.Run(tr.name, func(t *testing.T) {
			ops := tr.ops(t)
			planned, faithful := calls(ops, allocator.Config{Policy: allocator.PolicyPlanned}), calls(ops, allocator.Config{})
			t.Logf("device calls: planned %d, faithful default %d", planned, faithful)
			require.LessOrEqual(t, planned, faithful, "device calls: planned %d, faithful default %d", planned, faithful)
		})
	}
}

// TestPlannedTakesUpBERTsPlans replays BERT's training with an
// evaluation of four steps (its forward pass) before every six training
// steps, five rounds (bertTrainEval). The training plan is packed once,
// at the end of the third training step; the evaluation's at the third
// step of the first evaluation. From then on each phase's first step
// spares the other's plan (and departs from it), its second ends that
// plan, which is kept, and fits its own kept plan, taken up again: 2
// plans packed, 9 taken up. When an ended plan was dropped, each phase
// packed its plan again at its third step: 11 plans and 22,510 requests
// served, against 28,722 now; the device calls and the peak reserved
// are the same either way.
func TestPlannedTakesUpBERTsPlans(t *testing.T) {
	ops := bertTrainEval(t, 5)
	res, c := planRun(t, ops)
	require.Equal(t, [3]int64{2, 28722, 10}, c, "plans, served, departures")
	a := gpumemtest.New(t, gpumemtest.WithCapacity(80<<30), gpumemtest.WithConfig(allocator.Config{Policy: allocator.PolicyPlanned}), gpumemtest.AllowLeaks())
	_, err := replay.Run(trace.SliceReader(ops), a, a.Device().(*sim.Device), replay.Options{})
	require.NoError(t, err)
	st, _ := a.PlanStats()
	assert.EqualValues(t, 9, st.Reused)
	assert.EqualValues(t, 10, st.Spared)
	faithful := gpumemtest.New(t, gpumemtest.WithCapacity(80<<30), gpumemtest.AllowLeaks())
	def, err := replay.Run(trace.SliceReader(ops), faithful, faithful.Device().(*sim.Device), replay.Options{})
	require.NoError(t, err)
	assert.LessOrEqual(t, res.DeviceAllocs+res.DeviceFrees, def.DeviceAllocs+def.DeviceFrees, "device calls against the faithful default's")

	// Without marks: the search finds the training step (1,004
	// allocations) and its floor, where each step starts, evaluation
	// steps too, so the boundaries stay at the steps' starts through
	// the evaluations: 2 plans packed, 8 taken up, 27,420 requests
	// served. (With boundaries counted a period apart, the evaluations
	// shifted them, the period was dropped and found again every round:
	// 1 plan, 3 taken up, 3,924 served.)
	var unmarked []trace.Op
	for _, op := range ops {
		if op.Kind != trace.Mark {
			unmarked = append(unmarked, op)
		}
	}
	u := gpumemtest.New(t, gpumemtest.WithCapacity(80<<30), gpumemtest.WithConfig(allocator.Config{Policy: allocator.PolicyPlanned}), gpumemtest.AllowLeaks())
	_, err = replay.Run(trace.SliceReader(unmarked), u, u.Device().(*sim.Device), replay.Options{})
	require.NoError(t, err)
	require.NoError(t, u.CheckInvariants())
	st, _ = u.PlanStats()
	assert.EqualValues(t, 1004, st.FoundPeriod)
	assert.Equal(t, [3]int64{2, 8, 27420}, [3]int64{st.Plans, st.Reused, st.Served}, "unmarked: plans, taken up, served")
}

// largeStepOps returns steps marked steps of n allocations each, the same
// every step: a forward pass whose every third block is a temporary freed
// at once and the others held, then a backward pass that allocates
// temporaries and frees the held blocks last first; sizes of 512 B to 2
// MiB, drawn once. It returns too the most bytes a step has in use at
// once, each block rounded up to 512 bytes.
func largeStepOps(n, steps int) ([]trace.Op, uint64) {
	r := rand.New(rand.NewPCG(uint64(n), 5))
	sizes := make([]uint64, n)
	for i := range sizes {
		sizes[i] = 512 + r.Uint64N(2<<20)
	}
	var w opWriter
	var live, peak uint64
	size := map[uint64]uint64{}
	alloc := func(i int) uint64 {
		id := w.alloc(sizes[i], 0)
		size[id] = (sizes[i] + 511) &^ 511
		live += size[id]
		peak = max(peak, live)
		return id
	}
	free := func(id uint64) {
		w.free(id)
		live -= size[id]
	}
	for s := range steps {
		w.mark(fmt.Sprint("step", s))
		var held []uint64
		for i := range n / 2 {
			if id := alloc(i); i%3 == 0 {
				free(id)
			} else {
				held = append(held, id)
			}
		}
		for i := n / 2; i < n; i++ {
			free(alloc(i))
			if len(held) > 0 {
				free(held[len(held)-1])
				held = held[:len(held)-1]
			}
		}
		for _, id := range held {
			free(id)
		}
	}
	return w.ops, peak
}

// TestPlannedPacksALargeStepInTimeOrder: a step whose packing by size
// would read more placed blocks than a boundary may spend on under the
// lock (7,000 blocks, some 2,300 of them in use at once: past 2^24 reads
// by internal/pack's model) is packed in time order, as a packing by
// size of it, by first fit (a plan's packing again, as one in time order
// is when its arena finds no room), would be too; and the steps after
// it are served from the arena whole, with no device call, as a step
// packed by size is (2,000 blocks, first fit). The arena holds the
// step's most bytes in use at once, by size in whole pages, in time
// order within 1 % more.
func TestPlannedPacksALargeStepInTimeOrder(t *testing.T) {
	cfg := allocator.Config{Policy: allocator.PolicyPlanned}
	for _, c := range []struct {
		n           int
		how         string
		timeOrdered int64 // past the budget
	}{{2000, "time", 0}, {7000, "time", 0}, {2000, "first", 0}, {7000, "first", 1}} {
		restore := allocator.SetMarkedPacking(c.how)
		run := func(steps int) (replay.Result, allocator.PlanStats, uint64) {
			a := gpumemtest.New(t, gpumemtest.WithCapacity(80<<30), gpumemtest.WithConfig(cfg))
			ops, peak := largeStepOps(c.n, steps)
			res, err := replay.Run(trace.SliceReader(ops), a, a.Device().(*sim.Device), replay.Options{})
			require.NoError(t, err)
			require.NoError(t, a.CheckInvariants())
			require.Zero(t, res.OOMs)
			st, ok := a.PlanStats()
			require.True(t, ok)
			return *res, st, peak
		}
		res4, st, _ := run(4)
		require.Equal(t, int64(1), st.Plans, "%d blocks: plans", c.n)
		require.Equal(t, c.timeOrdered, st.TimeOrdered, "%d blocks, %s: packings in time order past the budget", c.n, c.how)
		require.Equal(t, int64(2*c.n), st.Served, "%d blocks: the second step repeats the first, and the two after it are served whole", c.n)
		require.Zero(t, st.Skips+st.Departures+st.Repacks, "%d blocks: skips, departures, packings again", c.n)
		res6, st, peak := run(6)
		require.Equal(t, int64(4*c.n), st.Served, "%d blocks: the steps after the second served whole", c.n)
		require.Equal(t, res4.DeviceAllocs+res4.DeviceFrees, res6.DeviceAllocs+res6.DeviceFrees, "%d blocks: the steps served make no device call", c.n)
		const page = 2 << 20
		most := (peak + page - 1) &^ (page - 1)
		if c.how == "time" || c.timeOrdered > 0 {
			most = (peak + peak/100 + page - 1) &^ (page - 1)
		}
		assert.GreaterOrEqual(t, st.ArenaBytes, peak, "%d blocks: the arena below the step's peak", c.n)
		assert.LessOrEqual(t, st.ArenaBytes, most, "%d blocks: the arena %d, for a peak of %d", c.n, st.ArenaBytes, peak)
		restore()
	}
}

// TestPlannedBoundaryWait prints, with -policy.boundary, how long the
// planned policy's step boundary that packs a step holds the allocator
// (the slowest MarkStep of four steps of largeStepOps: the boundary
// after the second step, which repeats the first, packs it), packed in
// time order (as a marked step is) and by first fit within the budget
// (packBudget: in time order past it), beside the time of a step served
// from the arena (the fourth step's allocations and frees), and the
// arena of each packing as a multiple of the step's peak of bytes in
// use: the fastest of three runs.
func TestPlannedBoundaryWait(t *testing.T) {
	if !*policyWait {
		t.Skip("measurements: run with -policy.boundary")
	}
	cfg := allocator.Config{Policy: allocator.PolicyPlanned}
	run := func(ops []trace.Op) (wait, step time.Duration, st allocator.PlanStats) {
		a := gpumemtest.New(t, gpumemtest.WithCapacity(1<<40), gpumemtest.WithConfig(cfg))
		ptr := map[uint64]device.Ptr{}
		marks := 0
		var from time.Time
		for _, op := range ops {
			switch op.Kind {
			case trace.Mark:
				if marks == 3 {
					from = time.Now()
				}
				start := time.Now()
				a.MarkStep(op.Name)
				wait = max(wait, time.Since(start))
				marks++
			case trace.Alloc:
				p, err := a.Alloc(op.Size, device.Stream(op.Stream))
				require.NoError(t, err)
				ptr[op.ID] = p
			case trace.Free:
				require.NoError(t, a.Free(ptr[op.ID]))
			}
		}
		step = time.Since(from)
		st, _ = a.PlanStats()
		return wait, step, st
	}
	var b strings.Builder
	b.WriteString("| blocks | boundary, in time order | boundary, first fit within the budget | a served step | arena / peak, in time order | first fit within the budget |\n| --- | --- | --- | --- | --- | --- |\n")
	for _, n := range []int{1000, 5000, 10000, 20000, 50000} {
		ops, peak := largeStepOps(n, 4)
		var wait [2]time.Duration
		var step time.Duration
		var arena [2]uint64
		var timeOrdered int64
		for r := range 3 {
			for k, how := range []string{"time", "first"} {
				restore := allocator.SetMarkedPacking(how)
				w, s, st := run(ops)
				restore()
				require.EqualValues(t, 2*n, st.Served, "%d blocks: the last two steps served", n)
				if r == 0 || w < wait[k] {
					wait[k] = w
				}
				if k == 0 {
					if r == 0 || s < step {
						step = s
					}
				} else {
					timeOrdered = st.TimeOrdered
				}
				arena[k] = st.ArenaBytes
			}
		}
		within := fmt.Sprintf("%.4f", float64(arena[1])/float64(peak))
		if timeOrdered > 0 {
			within += " (in time order)"
		}
		fmt.Fprintf(&b, "| %d | %v | %v | %v | %.4f | %s |\n", n, wait[0].Round(time.Microsecond), wait[1].Round(time.Microsecond), step.Round(time.Microsecond),
			float64(arena[0])/float64(peak), within)
	}
	t.Logf("fastest of 3 runs:\n%s", b.String())
}

// TestPlannedRoundedKVSteps replays the KV generation workloads with
// every size rounded (roundup_power2_divisions:2 and 4), as a server that
// copies that setting from PyTorch would: a KV cache that grows by a
// token keeps its rounded size over several steps, so steps repeat and
// are planned, while the caches, which outlive their step, land in the
// plan's places. A plan whose step skips more requests than it is served
// is dropped and quiet steps follow (planState.crowded), and an arena
// broken again soon after it was mapped anew waits before the next
// (planState.moves). Without the first, these replays made 116 to 1,543
// device calls (each boundary unmapped the free pages and mapped an arena
// again); without the second, kv_dynamic at 2 made 309. Now about what
// the policy makes on these workloads unrounded, where nothing is
// planned (18 and 13), and most requests are served from plans.
func TestPlannedRoundedKVSteps(t *testing.T) {
	for _, dynamic := range []bool{false, true} {
		ops := kvCacheOps(8, 128, 384, dynamic)
		for _, div := range []uint64{2, 4} {
			cfg := allocator.Config{Policy: allocator.PolicyPlanned}
			for i := range cfg.RoundupPower2Divisions {
				cfg.RoundupPower2Divisions[i] = div
			}
			res, st := planStatsRun(t, cfg, ops)
			name := fmt.Sprintf("dynamic %v, roundup %d", dynamic, div)
			assert.LessOrEqual(t, res.DeviceAllocs+res.DeviceFrees, int64(60), "%s: device calls", name)
			assert.Greater(t, st.Served, 10*st.Skips, "%s: served against skipped", name)
			assert.Less(t, float64(res.PeakReserved), 1.1*float64(res.PeakAllocated), "%s: peak reserved over peak allocated (rounded)", name)
		}
	}
}
