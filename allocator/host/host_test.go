package host

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sync/errgroup"

	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/device/sim"
	"github.com/gpumem/gpumem/internal/simtest"
)

func newHost(t testing.TB) (*Allocator, *sim.Device) {
	t.Helper()
	dev := simtest.New(t)
	a, err := New(dev, Config{})
	require.NoError(t, err)
	return a, dev
}

func TestRoundsToPowersOfTwoAndReuses(t *testing.T) {
	a, dev := newHost(t)
	p, err := a.Alloc(1000)
	require.NoError(t, err)
	assert.Len(t, p, 1000)
	assert.Equal(t, 1024, cap(p))
	p[999] = 7 // real, writable memory
	require.NoError(t, a.Free(p))
	q, err := a.Alloc(600) // also 1024: the cached block
	require.NoError(t, err)
	assert.Same(t, &p[0], &q[0])
	assert.EqualValues(t, 1, dev.Counters().HostAllocs)
	r, err := a.Alloc(1024 + 1) // 2048: a new block
	require.NoError(t, err)
	assert.Equal(t, 2048, cap(r))
	st := a.Stats()
	assert.EqualValues(t, 2, st.Allocations.Current)
	assert.EqualValues(t, 3072, st.AllocatedBytes.Current)
	assert.EqualValues(t, 2, st.ActiveRequests.Current)
	assert.EqualValues(t, 2, st.NumHostAlloc)
	z, err := a.Alloc(0)
	require.NoError(t, err)
	assert.Nil(t, z)
	require.NoError(t, a.Free(nil))
}

func TestLastFreedIsReusedFirst(t *testing.T) {
	a, _ := newHost(t)
	x, _ := a.Alloc(4096)
	y, _ := a.Alloc(4096)
	require.NoError(t, a.Free(x))
	require.NoError(t, a.Free(y))
	z, _ := a.Alloc(4096)
	assert.Same(t, &y[0], &z[0])
}

func TestRecordStreamDefersReuse(t *testing.T) {
	a, dev := newHost(t)
	copyStream, _ := dev.NewStream()
	require.NoError(t, dev.SetStreamBusy(copyStream, true))
	p, _ := a.Alloc(1 << 20)
	require.NoError(t, a.RecordStream(p, copyStream))
	require.NoError(t, a.Free(p))
	assert.EqualValues(t, 1, a.Stats().ActiveRequests.Current, "still in use by the copy")
	q, _ := a.Alloc(1 << 20)
	assert.NotSame(t, &p[0], &q[0], "not reused while the copy runs")
	require.NoError(t, dev.CompleteStream(copyStream))
	r, _ := a.Alloc(1 << 20)
	assert.Same(t, &p[0], &r[0], "reused once the copy is done")
}

func TestEmptyCacheWaitsAndReleases(t *testing.T) {
	a, dev := newHost(t)
	s, _ := dev.NewStream()
	require.NoError(t, dev.SetStreamBusy(s, true))
	p, _ := a.Alloc(1 << 20)
	q, _ := a.Alloc(1 << 10)
	keep, _ := a.Alloc(1 << 10)
	require.NoError(t, a.RecordStream(p, s))
	require.NoError(t, a.Free(p))
	require.NoError(t, a.Free(q))
	require.NoError(t, a.EmptyCache())
	st := a.Stats()
	assert.EqualValues(t, 2, st.NumHostFree)
	assert.EqualValues(t, 1, st.Allocations.Current, "the block in use stays")
	assert.EqualValues(t, 1, st.ActiveRequests.Current)
	assert.EqualValues(t, 2, dev.Counters().HostFrees, "both free blocks went back to the device")
	require.NoError(t, a.Free(keep))
}

func TestErrorsChangeNothing(t *testing.T) {
	a, dev := newHost(t)
	p, _ := a.Alloc(100)
	require.NoError(t, a.Free(p))
	before := a.Stats()
	assert.ErrorIs(t, a.Free(p), device.ErrInvalidPointer, "double free")
	assert.ErrorIs(t, a.Free(make([]byte, 10)), device.ErrInvalidPointer, "foreign memory")
	assert.ErrorIs(t, a.Free([]byte{}), device.ErrInvalidPointer)
	assert.ErrorIs(t, a.RecordStream(p, 0), device.ErrInvalidPointer)
	_, err := a.Alloc(1 << 63)
	assert.ErrorIs(t, err, device.ErrInvalidSize)
	assert.Equal(t, before, a.Stats(), "the refused calls changed nothing")
	live, _ := a.Alloc(100)
	before = a.Stats()
	err = a.RecordStream(live, 77) // stream 77 does not exist
	assert.ErrorIs(t, err, device.ErrInvalidStream)
	assert.Contains(t, err.Error(), "stream 77")
	assert.Equal(t, before, a.Stats(), "the refused RecordStream changed nothing")
	require.NoError(t, a.Free(live), "the block was not recorded on the unknown stream")
	again, _ := a.Alloc(100)
	assert.Same(t, &live[0], &again[0], "freed at once, and reused")
	require.NoError(t, a.Free(again))
	_, err = New(struct{ device.Device }{dev}, Config{})
	assert.ErrorIs(t, err, device.ErrNotSupported)
	_, err = New(nil, Config{})
	assert.Error(t, err)
}

// TestRecordStreamChecksWithoutStreamChecker: a device that cannot tell
// its streams has an unknown stream refused by the event that RecordStream
// records on it, which it releases.
func TestRecordStreamChecksWithoutStreamChecker(t *testing.T) {
	dev := simtest.New(t)
	a, err := New(struct {
		device.Device
		device.HostMemory
	}{dev, dev}, Config{})
	require.NoError(t, err)
	p, _ := a.Alloc(100)
	assert.ErrorIs(t, a.RecordStream(p, 77), device.ErrInvalidStream)
	s, _ := dev.NewStream()
	require.NoError(t, a.RecordStream(p, s))
	require.NoError(t, a.Free(p))
	require.NoError(t, a.EmptyCache())
	c := dev.Counters()
	assert.Equal(t, c.EventsRecorded, c.EventsReleased, "the checking event is released")
	assert.EqualValues(t, 2, c.EventsRecorded, "one to check the stream, one for the free")
}

func TestStatsMap(t *testing.T) {
	a, _ := newHost(t)
	p, _ := a.Alloc(3000)
	m := a.Stats().Map()
	assert.EqualValues(t, 4096, m["allocated_bytes.current"])
	assert.EqualValues(t, 1, m["active_requests.peak"])
	assert.EqualValues(t, 1, m["num_host_alloc"])
	assert.Len(t, m, 26)
	_ = a.Free(p)
}

func TestConcurrentUse(t *testing.T) {
	a, dev := newHost(t)
	s, _ := dev.NewStream()
	var g errgroup.Group
	for w := range 4 {
		g.Go(func() error {
			for i := range 500 {
				p, err := a.Alloc(uint64(1+(i*w)%5000) * 64)
				if err == nil && i%3 == 0 {
					err = a.RecordStream(p, s)
				}
				if err == nil {
					err = a.Free(p)
				}
				if err != nil {
					return err
				}
			}
			return nil
		})
	}
	require.NoError(t, g.Wait())
	require.NoError(t, a.EmptyCache())
	st := a.Stats()
	assert.Zero(t, st.Allocations.Current)
	assert.Zero(t, st.ActiveRequests.Current)
	assert.Equal(t, st.NumHostAlloc, st.NumHostFree)
	c := dev.Counters()
	assert.Equal(t, c.HostAllocs, c.HostFrees)
}

func TestFailedHostFreeKeepsBlock(t *testing.T) {
	a, _ := newHost(t)
	p, _ := a.Alloc(100)
	require.NoError(t, a.Free(p))
	a.host = failingFree{a.host}
	require.Error(t, a.EmptyCache())
	assert.EqualValues(t, 1, a.Stats().Allocations.Current)
	q, err := a.Alloc(100)
	require.NoError(t, err)
	assert.Same(t, &p[0], &q[0], "the block is still cached")
}

type failingFree struct{ device.HostMemory }

func (failingFree) HostFree([]byte) error { return errors.New("injected") }

func BenchmarkAllocFreeCached(b *testing.B) {
	a, _ := newHost(b)
	p, _ := a.Alloc(1 << 20)
	_ = a.Free(p)
	b.ReportAllocs()
	for b.Loop() {
		p, _ := a.Alloc(1 << 20)
		_ = a.Free(p)
	}
}
