package allocator_test

import (
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpumem/gpumem/allocator"
	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/device/faulty"
	"github.com/gpumem/gpumem/device/sim"
	"github.com/gpumem/gpumem/internal/simtest"
	"github.com/gpumem/gpumem/stats"
)

const asyncMiB = 1 << 20

func newAsync(t *testing.T, dev device.Device, conf string) *allocator.Async {
	t.Helper()
	cfg, err := allocator.ParseConf(conf)
	require.NoError(t, err)
	a, err := allocator.NewAsync(dev, cfg)
	require.NoError(t, err)
	return a
}

func statOf(t *testing.T, st stats.DeviceStats, key string) int64 {
	t.Helper()
	v, ok := st.Get(key)
	require.True(t, ok, key)
	return v
}

// asyncFilled are the keys Async fills, as PyTorch's backend does.
var asyncFilled = map[string]bool{
	"allocated_bytes.all.current": true, "allocated_bytes.all.peak": true,
	"active_bytes.all.current": true, "active_bytes.all.peak": true,
	"reserved_bytes.all.current": true, "reserved_bytes.all.peak": true,
}

// TestAsyncNeedsStreamOrderedMemory: a device without the capability gets
// an error naming the key; New refuses the backend and points to NewAsync.
func TestAsyncNeedsStreamOrderedMemory(t *testing.T) {
	s := simtest.New(t)
	caps := device.CapabilitiesOf(s)
	caps.StreamOrderedMemory = nil
	_, err := allocator.NewAsync(device.Compose(s, caps), allocator.Config{})
	require.ErrorIs(t, err, device.ErrNotSupported)
	assert.ErrorContains(t, err, "backend:cudaMallocAsync needs a device with a stream-ordered memory pool")
	_, err = allocator.NewAsync(nil, allocator.Config{})
	require.Error(t, err)

	cfg, err := allocator.ParseConf("backend:cudaMallocAsync")
	require.NoError(t, err)
	_, err = allocator.New(s, cfg)
	require.ErrorContains(t, err, "backend:cudaMallocAsync is the device's stream-ordered pool, served by NewAsync")
	_, err = allocator.NewAsync(s, allocator.Config{MaxSplitSize: 1})
	require.ErrorContains(t, err, "MaxSplitSize", "the other keys are checked")
}

// TestAsyncAllocFreeAndStats: allocations come from the pool, the pool
// keeps what it reserved (the release threshold is the maximum), EmptyCache
// returns it, and Stats fills exactly PyTorch's keys.
func TestAsyncAllocFreeAndStats(t *testing.T) {
	s := simtest.New(t, simtest.Capacity(1<<30))
	a := newAsync(t, s, "backend:cudaMallocAsync")
	p, err := a.Alloc(3*asyncMiB+1, device.DefaultStream)
	require.NoError(t, err)
	q, err := a.Alloc(1000, device.DefaultStream)
	require.NoError(t, err)
	assert.NotZero(t, p)
	assert.Equal(t, uint64(3*asyncMiB+1+1000), a.Allocated())
	st := a.Stats()
	used := int64(3*asyncMiB + 512 + 1024) // the sim's pool rounds to 512 bytes
	assert.Equal(t, used, statOf(t, st, "allocated_bytes.all.current"))
	assert.Equal(t, used, statOf(t, st, "active_bytes.all.peak"))
	assert.Equal(t, int64(sim.PoolChunk), statOf(t, st, "reserved_bytes.all.current"))
	for k, v := range st.Entries() {
		if !asyncFilled[k] {
			assert.Zero(t, v, "%s is not filled, as in PyTorch", k)
		}
	}

	require.NoError(t, a.Free(p))
	require.NoError(t, a.Free(q))
	require.NoError(t, s.Synchronize())
	st = a.Stats()
	assert.Zero(t, statOf(t, st, "allocated_bytes.all.current"))
	assert.Equal(t, used, statOf(t, st, "allocated_bytes.all.peak"))
	assert.Equal(t, int64(sim.PoolChunk), statOf(t, st, "reserved_bytes.all.current"), "the pool caches across a synchronization")
	assert.Equal(t, uint64(sim.PoolChunk), s.BytesInUse())

	r, err := a.Alloc(3*asyncMiB, device.DefaultStream)
	require.NoError(t, err)
	assert.Equal(t, p, r, "served from the pool")
	assert.Equal(t, int64(1), s.Counters().PoolGrowths)
	require.NoError(t, a.Free(r))

	require.NoError(t, a.EmptyCache())
	assert.Zero(t, s.BytesInUse())
	assert.Zero(t, statOf(t, a.Stats(), "reserved_bytes.all.current"))
	require.NoError(t, a.ResetPeakStats())
	st = a.Stats()
	assert.Zero(t, statOf(t, st, "reserved_bytes.all.peak"))
	assert.Zero(t, statOf(t, st, "allocated_bytes.all.peak"))
}

// TestAsyncRecordStream: a block recorded on a stream whose work is not
// done is not reused by another stream until that work is done; with the
// free stream (StreamWaiter) or, without it, by synchronizing the
// recorded stream at the free.
func TestAsyncRecordStream(t *testing.T) {
	for _, waiter := range []bool{true, false} {
		s := simtest.New(t, simtest.Capacity(1<<30))
		var dev device.Device = s
		if !waiter {
			caps := device.CapabilitiesOf(s)
			caps.StreamWaiter = nil
			dev = device.Compose(s, caps)
		}
		a := newAsync(t, dev, "backend:cudaMallocAsync")
		side, err := s.NewStream()
		require.NoError(t, err)
		other, err := s.NewStream()
		require.NoError(t, err)
		require.NoError(t, s.SetStreamBusy(side, true))

		p, err := a.Alloc(sim.PoolChunk, device.DefaultStream)
		require.NoError(t, err)
		require.NoError(t, a.RecordStream(p, side))
		require.NoError(t, a.RecordStream(p, side), "twice changes nothing")
		require.NoError(t, a.RecordStream(p, device.DefaultStream), "its own stream changes nothing")
		_, err = s.RecordEvent(side) // work on side that uses the block
		require.NoError(t, err)
		require.NoError(t, a.Free(p))
		q, err := a.Alloc(sim.PoolChunk, other)
		require.NoError(t, err)
		if waiter {
			assert.NotEqual(t, p, q, "side's work is not done: the pool may not hand the block to another stream")
			require.NoError(t, s.CompleteStream(side))
			r, err := a.Alloc(sim.PoolChunk, other)
			require.NoError(t, err)
			assert.Equal(t, p, r, "reused once side's work is done")
		} else {
			assert.Equal(t, p, q, "the free synchronized side first")
			n, err := s.PendingWork(side)
			require.NoError(t, err)
			assert.Zero(t, n)
		}
	}
	s := simtest.New(t)
	a := newAsync(t, s, "")
	p, err := a.Alloc(1, device.DefaultStream)
	require.NoError(t, err)
	require.ErrorIs(t, a.RecordStream(p, 999), device.ErrInvalidStream)
	require.ErrorIs(t, a.RecordStream(p+1, device.DefaultStream), device.ErrInvalidPointer)
}

// TestAsyncOutOfMemory: the cap and the device's own out of memory give
// an *OutOfMemoryError and change nothing.
func TestAsyncOutOfMemory(t *testing.T) {
	s := simtest.New(t, simtest.Capacity(64*asyncMiB))
	a := newAsync(t, s, "backend:cudaMallocAsync,memory_limit_bytes:10485760")
	p, err := a.Alloc(8*asyncMiB, device.DefaultStream)
	require.NoError(t, err)
	_, err = a.Alloc(3*asyncMiB, device.DefaultStream)
	var oom *allocator.OutOfMemoryError
	require.ErrorAs(t, err, &oom)
	require.ErrorIs(t, err, device.ErrOutOfMemory)
	assert.Equal(t, uint64(10*asyncMiB), oom.Allowed)
	assert.Equal(t, uint64(8*asyncMiB), oom.Allocated)
	assert.Equal(t, uint64(8*asyncMiB), a.Allocated())
	require.NoError(t, a.Free(p))

	b := newAsync(t, s, "per_process_memory_fraction:0.5")
	_, err = b.Alloc(33*asyncMiB, device.DefaultStream)
	require.ErrorAs(t, err, &oom, "half of 64 MiB")

	c := newAsync(t, s, "")
	_, err = c.Alloc(65*asyncMiB, device.DefaultStream)
	require.ErrorAs(t, err, &oom)
	assert.Equal(t, uint64(64*asyncMiB), oom.DeviceTotal)
	assert.Zero(t, c.Allocated())
	_, err = c.Alloc(1<<61, device.DefaultStream)
	require.ErrorIs(t, err, device.ErrInvalidSize)
}

// TestAsyncBadFrees: zero size and the zero Ptr, frees of addresses never
// handed out or freed twice, and a free the device fails, which leaves the
// block allocated.
func TestAsyncBadFrees(t *testing.T) {
	s := simtest.New(t)
	j := faulty.New(s)
	a := newAsync(t, j.Device(), "")
	z, err := a.Alloc(0, device.DefaultStream)
	require.NoError(t, err)
	assert.Zero(t, z)
	require.NoError(t, a.Free(0))
	p, err := a.Alloc(100, device.DefaultStream)
	require.NoError(t, err)
	require.ErrorIs(t, a.Free(p+512), device.ErrInvalidPointer)
	_, err = j.Add(faulty.Rule{Call: device.CallFreeAsync})
	require.NoError(t, err)
	require.ErrorIs(t, a.Free(p), faulty.ErrInjected)
	assert.Equal(t, uint64(100), a.Allocated(), "the failed free left the block allocated")
	require.NoError(t, a.Free(p))
	require.ErrorIs(t, a.Free(p), device.ErrInvalidPointer, "a double free")
	_, err = a.Alloc(1, 999)
	require.ErrorIs(t, err, device.ErrInvalidStream)
	assert.Zero(t, a.Allocated())
}

// TestAsyncConcurrent: allocations and frees from several goroutines on
// their own streams leave nothing behind.
func TestAsyncConcurrent(t *testing.T) {
	s := simtest.New(t)
	a := newAsync(t, s, "")
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for g := range 8 {
		st, err := s.NewStream()
		require.NoError(t, err)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 200 {
				p, err := a.Alloc(uint64(1+(g*131+i*977)%(4*asyncMiB)), st)
				if err == nil {
					err = a.Free(p)
				}
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	assert.Zero(t, a.Allocated())
	require.NoError(t, a.EmptyCache())
	assert.Zero(t, s.BytesInUse())
}

// The replay drives Async as it drives the caching allocator.
var _ interface {
	Alloc(uint64, device.Stream) (device.Ptr, error)
	Free(device.Ptr) error
	RecordStream(device.Ptr, device.Stream) error
	EmptyCache() error
	Stats() stats.DeviceStats
} = (*allocator.Async)(nil)
