package allocator

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/gpumem/gpumem/device"
)

func TestCaptureRoutesTheCapturingStream(t *testing.T) {
	a, dev := newTest(t, 1<<30, Config{})
	side, err := dev.NewStream()
	require.NoError(t, err)
	g := mustPool(t, a, "graph", PoolOptions{})
	require.NoError(t, a.BeginCapture(g, side))
	pool, ok := a.Capturing(side)
	require.True(t, ok)
	require.Same(t, g, pool)
	_, ok = a.Capturing(device.DefaultStream)
	require.False(t, ok)

	x := mustAlloc(t, a, 4<<20, side)
	d := mustAlloc(t, a, 4<<20, device.DefaultStream)
	require.Equal(t, int64(1), segmentPool(a, x))
	require.Equal(t, int64(0), segmentPool(a, d))
	// A block freed on its own stream within the capture serves the next
	// request of the capture, as in PyTorch.
	mustFree(t, a, x)
	y := mustAlloc(t, a, 4<<20, side)
	require.Equal(t, x, y)
	require.NoError(t, a.EndCapture(side))

	// The pool outlives the capture: its blocks stay, and s allocates in
	// the default pool again.
	z := mustAlloc(t, a, 4<<20, side)
	require.Equal(t, int64(0), segmentPool(a, z))
	require.Equal(t, uint64(4<<20), poolStats(t, a, g).AllocatedBytes)
	mustFree(t, a, y, z, d)
	require.NoError(t, a.ReleasePool(g))
	require.Empty(t, a.Pools())
}

func TestCaptureDefersEventsUntilNoCapture(t *testing.T) {
	a, dev, side := withBusyStream(t)
	cap1, err := dev.NewStream()
	require.NoError(t, err)
	g := mustPool(t, a, "graph", PoolOptions{})

	p := recordedOn(t, a, 3*mib, side) // recorded before the capture
	q := mustAlloc(t, a, 3*mib, 0)
	require.NoError(t, a.BeginCapture(g, cap1))
	require.NoError(t, a.RecordStream(q, side)) // recorded during the capture only
	events := dev.Counters().EventsRecorded
	mustFree(t, a, p, q)
	require.Equal(t, events, dev.Counters().EventsRecorded, "no event is recorded during a capture")
	require.EqualValues(t, 2, get(t, a, "active.all.current"), "both stay pending")
	// Even with the side stream's work done, nothing is queried or
	// completed while the capture is underway.
	require.NoError(t, dev.CompleteStream(side))
	queries := dev.Counters().EventQueries
	r := mustAlloc(t, a, 3*mib, 0)
	require.NotEqual(t, p, r)
	require.NotEqual(t, q, r)
	require.Equal(t, queries, dev.Counters().EventQueries)
	require.ErrorIs(t, a.EmptyCache(), errCapturing)
	require.NoError(t, dev.SetStreamBusy(side, true))

	require.NoError(t, a.EndCapture(cap1))
	// p waits for an event on side, recorded now; q, recorded on side
	// during the capture only, is free at once.
	require.Equal(t, events+1, dev.Counters().EventsRecorded)
	require.EqualValues(t, 2, get(t, a, "active.all.current")) // p pending, r allocated
	s := mustAlloc(t, a, 3*mib, 0)
	require.Equal(t, q, s, "q's free completed at the end of the capture")
	require.NoError(t, dev.CompleteStream(side))
	u := mustAlloc(t, a, 3*mib, 0)
	require.Equal(t, p, u, "p's free completed once side's work was done")
	mustFree(t, a, r, s, u)
	require.NoError(t, a.EmptyCache())
}

func TestCaptureOutOfMemoryReleasesNothing(t *testing.T) {
	a, _ := newTest(t, 64<<20, Config{})
	g := mustPool(t, a, "graph", PoolOptions{})
	x := mustAlloc(t, a, 40<<20, 0)
	mustFree(t, a, x) // 40 MiB cached in the default pool
	require.NoError(t, a.BeginCapture(g, 0))
	frees := get(t, a, "num_device_free")
	_, err := a.Alloc(40<<20, 0)
	require.ErrorIs(t, err, device.ErrOutOfMemory)
	require.NoError(t, a.CheckInvariants())
	require.Equal(t, frees, get(t, a, "num_device_free"), "no device free during a capture")
	require.NoError(t, a.EndCapture(0))
	y := mustAlloc(t, a, 40<<20, 0) // the default pool's cached block
	require.Equal(t, x, y)
	mustFree(t, a, y)
	require.NoError(t, a.ReleasePool(g))
}

func TestCaptureBadInputChangesNothing(t *testing.T) {
	a, dev := newTest(t, 1<<30, Config{})
	side, err := dev.NewStream()
	require.NoError(t, err)
	g := mustPool(t, a, "graph", PoolOptions{})
	h := mustPool(t, a, "other", PoolOptions{})
	require.ErrorContains(t, a.EndCapture(0), "not capturing")
	require.NoError(t, a.BeginCapture(g, 0))
	require.ErrorContains(t, a.BeginCapture(g, side), "capturing into it already")
	require.ErrorContains(t, a.BeginCapture(h, 0), "already capturing")
	require.ErrorContains(t, a.UsePool(h, 0), "already capturing")
	require.ErrorContains(t, a.UseDefaultPool(0), "EndCapture")
	require.ErrorContains(t, a.ReleasePool(g), "in use")
	require.ErrorIs(t, a.BeginCapture(h, 4242), device.ErrInvalidStream)
	require.NoError(t, a.CheckInvariants())
	require.ErrorContains(t, a.EndCapture(side), "not capturing")
	require.NoError(t, a.EndCapture(0))
	require.ErrorContains(t, a.EndCapture(0), "not capturing")
	var zero Allocator
	require.ErrorIs(t, zero.BeginCapture(g, 0), errNotMade)
	require.ErrorIs(t, zero.EndCapture(0), errNotMade)
}
