package allocator

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpumem/gpumem/device"
)

// TestZeroAllocatorRefuses: the zero Allocator, not made by New, panics
// on no exported method: those that return an error say to use New, the
// others return zero values and change nothing.
func TestZeroAllocatorRefuses(t *testing.T) {
	var a Allocator
	_, err := a.Alloc(1, device.DefaultStream)
	require.ErrorIs(t, err, errNotMade)
	assert.Contains(t, err.Error(), "New")
	_, err = a.Alloc(1, 7)
	require.ErrorIs(t, err, errNotMade)
	p, err := a.Alloc(0, device.DefaultStream)
	assert.Zero(t, p)
	assert.NoError(t, err, "size 0 is no request, as on a made allocator")
	require.ErrorIs(t, a.Free(0x1000), errNotMade)
	require.NoError(t, a.Free(0), "the zero Ptr frees nothing, as on a made allocator")
	require.ErrorIs(t, a.RecordStream(0x1000, 1), errNotMade)
	require.ErrorIs(t, a.EmptyCache(), errNotMade)
	require.ErrorIs(t, a.SetMemoryFraction(0.5), errNotMade)
	require.ErrorIs(t, a.CheckInvariants(), errNotMade)
	assert.Nil(t, a.Device())
	assert.Equal(t, Config{}, a.Config())
	st := a.Stats()
	for k, v := range st.Entries() {
		assert.Zero(t, v, k)
	}
	a.ResetPeakStats()
	a.ResetAccumulatedStats()
	assert.Zero(t, a.LargestFreeBlock())
	assert.NotPanics(t, func() { _ = a.Summary(true) })
	a.Attach(nil)()
	a.OnOutOfMemory(func(*OutOfMemoryError) {})()
	assert.Equal(t, "", a.SetPhase("x"))
	a.EnterPhase("y")()
	assert.Equal(t, "", a.Phase())
	assert.Empty(t, a.PhaseStats())
	a.MarkStep("s")
	assert.Empty(t, a.Leaks())
	assert.Empty(t, a.Snapshot())
	assert.Nil(t, a.def, "nothing changed")
	assert.Empty(t, a.shards)
	assert.Nil(t, a.byStream.Load())
}
