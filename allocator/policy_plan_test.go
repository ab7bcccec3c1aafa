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

func TestPlannedServesRepeatedSteps(t *testing.T) {
	ops := fileOps("../trace/replay/testdata/bert_b2.trace.gz")(t)
	a := gpumemtest.New(t, gpumemtest.WithCapacity(80<<30), gpumemtest.WithConfig(allocator.Config{Policy: allocator.PolicyPlanned}), gpumemtest.AllowLeaks())
	dev := a.Device().(*sim.Device)
	res, err := replay.Run(trace.SliceReader(ops), a, dev, replay.Options{})
	require.NoError(t, err)
	require.NoError(t, a.CheckInvariants())
	plans, served, dep := a.PlanCounts()
	t.Logf("plans %d served %d departures %d; peak reserved %d requested %d calls %d", plans, served, dep, res.PeakReserved, res.PeakRequested, res.DeviceAllocs+res.DeviceFrees)
}
