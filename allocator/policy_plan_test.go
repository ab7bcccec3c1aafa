package allocator_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/gpumem/gpumem/allocator"
	"github.com/gpumem/gpumem/device/sim"
	"github.com/gpumem/gpumem/gpumemtest"
	"github.com/gpumem/gpumem/trace"
	"github.com/gpumem/gpumem/trace/replay"
)

// TestPlannedServesRepeatedSteps replays the BERT training trace (three
// steps; the first also makes the optimizer state) under the planned
// policy: the first step departs from its own plan where the second
// differs; the third repeats the second and is served from the arena
// whole.
func TestPlannedServesRepeatedSteps(t *testing.T) {
	ops := fileOps("../trace/replay/testdata/bert_b2.trace.gz")(t)
	a := gpumemtest.New(t, gpumemtest.WithCapacity(80<<30), gpumemtest.WithConfig(allocator.Config{Policy: allocator.PolicyPlanned}), gpumemtest.AllowLeaks())
	dev := a.Device().(*sim.Device)
	res, err := replay.Run(trace.SliceReader(ops), a, dev, replay.Options{})
	require.NoError(t, err)
	require.NoError(t, a.CheckInvariants())
	plans, served, dep := a.PlanCounts()
	t.Logf("plans %d served %d departures %d; peak reserved %d requested %d calls %d", plans, served, dep, res.PeakReserved, res.PeakRequested, res.DeviceAllocs+res.DeviceFrees)
	require.Zero(t, res.OOMs)
	require.EqualValues(t, 2, plans, "the first step, then the second, which departs from it")
	require.EqualValues(t, 1, dep)
	require.GreaterOrEqual(t, served, int64(1004), "the third step's 1004 requests are served from the arena")
}
