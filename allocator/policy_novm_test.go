package allocator_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/gpumem/gpumem/allocator"
	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/gpumemtest"
	"github.com/gpumem/gpumem/internal/simtest"
	"github.com/gpumem/gpumem/trace"
	"github.com/gpumem/gpumem/trace/replay"
)

// TestPolicyWithoutVirtualMemory replays the multi-stream workloads under
// the low_fragmentation policy on a device without virtual memory (plain
// segments, close fits and lending only), with and without device waits.
// The close fit hands out a block that is not the best fit; splitting it
// must move its rest in the free index like any other (a shrink in place,
// right for the best fit, once broke the index's order here).
func TestPolicyWithoutVirtualMemory(t *testing.T) {
	workloads := map[string][]trace.Op{
		"kv_legacy": kvCacheOps(8, 128, 384, false),
		"offload":   offloadOps(2, 8, 256, 4),
	}
	if allocator.SelfCheck {
		workloads = map[string][]trace.Op{"kv_legacy": kvCacheOps(2, 16, 48, false)}
	}
	for name, ops := range workloads {
		for _, waiter := range []bool{true, false} {
			sd := simtest.New(t)
			caps := device.Capabilities{StreamChecker: sd, UsageReporter: sd}
			if waiter {
				caps.StreamWaiter = sd
			}
			a := gpumemtest.NewOn(t, device.Compose(sd, caps), gpumemtest.WithConfig(allocator.Config{Policy: allocator.PolicyLowFragmentation}), gpumemtest.AllowLeaks())
			res, err := replay.Run(trace.SliceReader(ops), a, sd, replay.Options{})
			require.NoError(t, err, name)
			require.Zero(t, res.OOMs, name)
			require.NoError(t, a.CheckInvariants(), name)
		}
	}
}
