package allocator

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/internal/simtest"
)

// TestPlannedMapsAheadIntoWhatTheDeviceHasLeft: past half of a 1000 MiB
// device, the planned policy still maps 40 MiB ahead of a request while
// that takes at most half of the memory the device has left: 14 requests
// of 20 MiB from 520 to 800 MiB take 5 maps of 60 MiB (bounded by the
// slack over the requested peak, 4 %, they took 7). Near the end of the
// device the pages mapped ahead shrink: no map is refused.
func TestPlannedMapsAheadIntoWhatTheDeviceHasLeft(t *testing.T) {
	dev := simtest.New(t, simtest.Capacity(1000*mib))
	a, err := New(dev, Config{Policy: PolicyPlanned})
	require.NoError(t, err)
	var live []device.Ptr
	for range 26 { // 520 MiB
		live = append(live, mustAlloc(t, a, 20*mib, 0))
	}
	before := dev.Counters().Maps
	for range 14 { // to 800 MiB
		live = append(live, mustAlloc(t, a, 20*mib, 0))
	}
	maps := dev.Counters().Maps - before
	assert.LessOrEqual(t, maps, int64(5), "14 requests of 20 MiB past half the device")
	for range 9 { // to 980 MiB of 1000
		live = append(live, mustAlloc(t, a, 20*mib, 0))
	}
	assert.Zero(t, dev.Counters().FailedMaps, "the pages mapped ahead stay within what the device has")
	for _, p := range live {
		mustFree(t, a, p)
	}
	require.NoError(t, a.CheckInvariants())
}
