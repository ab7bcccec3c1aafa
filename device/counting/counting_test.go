package counting_test

import (
	"errors"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpumem/gpumem/allocator"
	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/device/counting"
	"github.com/gpumem/gpumem/device/internal/devicetest"
	"github.com/gpumem/gpumem/device/sim"
	"github.com/gpumem/gpumem/gpumemtest"
	"github.com/gpumem/gpumem/internal/simtest"
)

func newSim(t *testing.T) *sim.Device {
	t.Helper()
	return simtest.New(t, simtest.Capacity(64<<20), simtest.HostCapacity(1<<20))
}

// TestForwardsFaithfully runs the same script on a bare simulated device
// and on a counted one, for every subset of the simulator's capabilities:
// same results, same errors, same device state and clock, and counts equal
// to the script's own tally.
func TestForwardsFaithfully(t *testing.T) {
	var c *counting.Counter
	inner := devicetest.Faithful(t, func() *sim.Device { return newSim(t) },
		func(d device.Device) device.Device {
			c = counting.New(d)
			return c.Device()
		},
		func(i int, got devicetest.Result) {
			counts := c.Counts()
			assert.Equal(t, got.Tally.Calls, counts.Calls, "subset %08b", i)
			assert.Equal(t, got.Tally.Failed, counts.Failed, "subset %08b", i)
			assert.Equal(t, got.Tally.Bytes, counts.Bytes, "subset %08b", i)
		})
	assert.Zero(t, inner.BytesInUse())
}

// TestCapabilities: the counted device offers exactly what the inner one
// offers, both ways.
func TestCapabilities(t *testing.T) {
	devicetest.SameCapabilities(t, func() device.Device { return newSim(t) },
		func(d device.Device) device.Device { return counting.New(d).Device() })
	// An allocator sees the same: asking for expandable segments fails
	// without virtual memory and works with it.
	noVM := device.Compose(newSim(t), device.Capabilities{})
	_, err := allocator.New(counting.New(noVM).Device(), allocator.Config{ExpandableSegments: true})
	require.ErrorIs(t, err, device.ErrNotSupported, "no virtual memory appears by wrapping")
	_, err = allocator.New(counting.New(newSim(t)).Device(), allocator.Config{ExpandableSegments: true})
	require.NoError(t, err, "none is lost either")
}

// TestCountsExactly checks each kind's call, failure and byte counts after
// calls made one by one.
func TestCountsExactly(t *testing.T) {
	s := newSim(t)
	c := counting.New(s)
	d := c.Device()
	vm := d.(device.VirtualMemory)
	h := d.(device.HostMemory)
	assert.Equal(t, counting.Counts{}, c.Counts())
	assert.Equal(t, "no calls", c.Counts().String())

	p, err := d.Malloc(3 << 20)
	require.NoError(t, err)
	_, err = d.Malloc(1 << 40)
	require.ErrorIs(t, err, device.ErrOutOfMemory)
	require.NoError(t, d.Free(p))
	require.Error(t, d.Free(p))
	r, err := vm.Reserve(4 << 20)
	require.NoError(t, err)
	require.NoError(t, vm.Map(r, 4<<20))
	require.NoError(t, vm.Unmap(r, 2<<20))
	require.NoError(t, vm.Unmap(r+2<<20, 2<<20))
	require.NoError(t, vm.Release(r))
	b, err := h.HostAlloc(100)
	require.NoError(t, err)
	require.NoError(t, h.HostFree(b))
	_ = d.(device.StreamChecker).HasStream(0)
	_ = d.(device.UsageReporter).BytesInUse()
	_ = vm.Granularity()

	got := c.Counts()
	var want counting.Counts
	want.Calls[device.CallMalloc], want.Failed[device.CallMalloc], want.Bytes[device.CallMalloc] = 2, 1, 3<<20
	want.Calls[device.CallFree], want.Failed[device.CallFree] = 2, 1
	want.Calls[device.CallReserve], want.Bytes[device.CallReserve] = 1, 4<<20
	want.Calls[device.CallMap], want.Bytes[device.CallMap] = 1, 4<<20
	want.Calls[device.CallUnmap], want.Bytes[device.CallUnmap] = 2, 4<<20
	want.Calls[device.CallRelease] = 1
	want.Calls[device.CallHostAlloc], want.Bytes[device.CallHostAlloc] = 1, 100
	want.Calls[device.CallHostFree], want.Bytes[device.CallHostFree] = 1, 100
	assert.Equal(t, want, got)
	assert.Equal(t, int64(11), got.Total())
	assert.Equal(t, int64(2), c.Calls(device.CallMalloc))
	assert.Zero(t, c.Calls(device.NumCalls))
	assert.Equal(t, "malloc 2 (1 failed, 3145728 B), free 2 (1 failed), reserve 1 (4194304 B), map 1 (4194304 B), "+
		"unmap 2 (4194304 B), release 1, host alloc 1 (100 B), host free 1 (100 B)", got.String())

	// Sub gives what happened between two snapshots.
	require.NoError(t, d.Synchronize())
	later := c.Counts()
	var one counting.Counts
	one.Calls[device.CallSynchronize] = 1
	assert.Equal(t, one, later.Sub(got))

	c.Reset()
	assert.Equal(t, counting.Counts{}, c.Counts())
	sc := s.Counters()
	assert.Equal(t, int64(1), sc.Mallocs, "the counter counts what the device saw")
	assert.Equal(t, int64(1), sc.FailedMallocs)
}

// TestCountsWhatTheAllocatorAsks: under a caching allocator, the counted
// calls are the simulator's own counts.
func TestCountsWhatTheAllocatorAsks(t *testing.T) {
	for _, expandable := range []bool{false, true} {
		s := newSim(t)
		c := counting.New(s)
		a := gpumemtest.NewOn(t, c.Device(), gpumemtest.WithConfig(allocator.Config{ExpandableSegments: expandable}))
		var ps []device.Ptr
		for _, size := range []uint64{512, 1 << 20, 5 << 20, 30 << 20, 1 << 20} {
			p, err := a.Alloc(size, device.DefaultStream)
			require.NoError(t, err)
			ps = append(ps, p)
		}
		_, err := a.Alloc(1<<30, device.DefaultStream)
		require.ErrorIs(t, err, device.ErrOutOfMemory)
		for _, p := range ps {
			require.NoError(t, a.Free(p))
		}
		require.NoError(t, a.CheckInvariants())
		require.NoError(t, a.EmptyCache())
		require.NoError(t, a.CheckInvariants())

		sc, got := s.Counters(), c.Counts()
		assert.Equal(t, sc.Mallocs+sc.FailedMallocs, got.Calls[device.CallMalloc], "expandable %t", expandable)
		assert.Equal(t, sc.FailedMallocs, got.Failed[device.CallMalloc])
		assert.Equal(t, sc.Frees, got.Calls[device.CallFree])
		assert.Equal(t, sc.Maps+sc.FailedMaps, got.Calls[device.CallMap])
		assert.Equal(t, sc.Unmaps, got.Calls[device.CallUnmap])
		assert.Equal(t, sc.Reserves, got.Calls[device.CallReserve]-got.Failed[device.CallReserve])
		assert.Equal(t, sc.MemInfos, got.Calls[device.CallMemInfo])
		if expandable {
			assert.Positive(t, got.Calls[device.CallMap])
			assert.Equal(t, got.Bytes[device.CallMap], got.Bytes[device.CallUnmap], "everything mapped was unmapped")
		} else {
			assert.Positive(t, got.Calls[device.CallMalloc])
		}
		assert.Zero(t, s.BytesInUse())
	}
}

// TestConcurrentCounts: counts stay exact under concurrent callers (run
// with -race).
func TestConcurrentCounts(t *testing.T) {
	s := newSim(t)
	c := counting.New(s)
	d := c.Device()
	const workers, rounds = 8, 200
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for range workers {
		wg.Go(func() {
			for range rounds {
				p, err := d.Malloc(1)
				if err == nil {
					err = d.Free(p)
				}
				if err == nil {
					_, _, err = d.MemInfo()
				}
				if err != nil {
					errs <- err
					return
				}
				_ = c.Counts()
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	got := c.Counts()
	for _, k := range []device.Call{device.CallMalloc, device.CallFree, device.CallMemInfo} {
		assert.Equal(t, int64(workers*rounds), got.Calls[k], "%v", k)
	}
	assert.Equal(t, uint64(workers*rounds), got.Bytes[device.CallMalloc])
	assert.Equal(t, int64(3*workers*rounds), got.Total())
}

func TestNilDevice(t *testing.T) {
	c := counting.New(nil)
	assert.Nil(t, c.Device())
	_, err := allocator.New(c.Device(), allocator.Config{})
	require.Error(t, err)
	assert.Equal(t, counting.Counts{}, c.Counts())
}

// TestErrorsPassThrough: the counter returns the inner device's errors
// themselves.
func TestErrorsPassThrough(t *testing.T) {
	s := newSim(t)
	d := counting.New(s).Device()
	err := d.Free(12345)
	var de *device.Error
	require.True(t, errors.As(err, &de))
	assert.Equal(t, "free", de.Op)
	assert.ErrorIs(t, err, device.ErrInvalidPointer)
}
