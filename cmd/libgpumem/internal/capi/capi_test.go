package capi

import (
	"encoding/json"
	"errors"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpumem/gpumem/allocator"
	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/device/sim"
)

const mib = 1 << 20

// simLib returns a Lib over simulated devices of capacity bytes, and the
// devices it opened by ordinal.
func simLib(t *testing.T, capacity uint64, conf allocator.Config) (*Lib, map[int]*sim.Device) {
	t.Helper()
	var mu sync.Mutex
	devs := map[int]*sim.Device{}
	open := func(ordinal int) (Device, error) {
		d, err := sim.New(sim.Config{Ordinal: ordinal, Capacity: capacity})
		if err != nil {
			return nil, err
		}
		mu.Lock()
		devs[ordinal] = d
		mu.Unlock()
		return d, nil
	}
	return New(open, conf, nil), devs
}

func stats(t *testing.T, l *Lib, ordinal int) map[string]int64 {
	t.Helper()
	b, err := l.StatsJSON(ordinal)
	require.NoError(t, err)
	var m map[string]int64
	require.NoError(t, json.Unmarshal(b, &m))
	return m
}

func TestMallocFreeAdoptsStreams(t *testing.T) {
	l, devs := simLib(t, 1<<30, allocator.Config{})
	const s1, s2 = 0x1000, 0x2000
	p, err := l.Malloc(3*mib, 1, s1)
	require.NoError(t, err)
	require.NotZero(t, p)
	q, err := l.Malloc(3*mib, 1, s2)
	require.NoError(t, err)
	d := devs[1]
	require.NotNil(t, d, "device 1 made on first use")
	assert.Len(t, devs, 1, "device 0 was never used")
	assert.Equal(t, 3, d.Streams(), "default + two adopted")
	r, err := l.Malloc(mib, 1, s1)
	require.NoError(t, err)
	assert.Equal(t, 3, d.Streams(), "a stream is adopted once")

	m := stats(t, l, 1)
	assert.Equal(t, int64(7*mib), m["allocated_bytes.all.current"])
	assert.Equal(t, int64(42*mib), m["reserved_bytes.all.current"], "two 20 MiB segments and one 2 MiB")
	for _, x := range []uintptr{p, q, r} {
		require.NoError(t, l.Free(x, 0, 1, s1)) // q is freed on another stream than its own
	}
	m = stats(t, l, 1)
	assert.Zero(t, m["allocated_bytes.all.current"])
	require.NoError(t, l.EmptyCache(1))
	m = stats(t, l, 1)
	assert.Zero(t, m["reserved_bytes.all.current"])
	assert.Zero(t, d.BytesInUse())

	zero, err := l.Malloc(0, 1, s1)
	require.NoError(t, err)
	assert.Zero(t, zero)
	require.NoError(t, l.Free(0, 0, 1, s1))
}

// A block freed on a stream other than its allocation's is reused on the
// allocation's stream only after the work queued on the freeing stream
// has finished.
func TestFreeOnAnotherStream(t *testing.T) {
	l, devs := simLib(t, 1<<30, allocator.Config{})
	const alloc, other = 0x1000, 0x2000
	p, err := l.Malloc(4*mib, 0, alloc)
	require.NoError(t, err)
	_, err = l.Malloc(mib, 0, other) // adopt the other stream
	require.NoError(t, err)
	d := devs[0]
	os, err := d.AdoptStreamHandle(other)
	require.NoError(t, err)
	require.NoError(t, d.SetStreamBusy(os, true))

	require.NoError(t, l.Free(p, 4*mib, 0, other))
	q, err := l.Malloc(4*mib, 0, alloc)
	require.NoError(t, err)
	assert.NotEqual(t, p, q, "work on the freeing stream is pending")
	require.NoError(t, d.CompleteStream(os))
	require.NoError(t, l.Free(q, 4*mib, 0, alloc))
	r, err := l.Malloc(4*mib, 0, alloc)
	require.NoError(t, err)
	assert.Contains(t, []uintptr{p, q}, r)

	// Freed on its own stream: no record, reused at once.
	require.NoError(t, l.Free(r, 4*mib, 0, alloc))
	again, err := l.Malloc(4*mib, 0, alloc)
	require.NoError(t, err)
	assert.Equal(t, r, again)
}

func TestRecordStreamAndErrors(t *testing.T) {
	l, devs := simLib(t, 64*mib, allocator.Config{})
	const s1, s2 = 0x1000, 0x2000
	p, err := l.Malloc(mib, 0, s1)
	require.NoError(t, err)
	require.NoError(t, l.RecordStream(p, 0, s2))
	d := devs[0]
	h2, _ := d.AdoptStreamHandle(s2)
	require.NoError(t, d.SetStreamBusy(h2, true))
	require.NoError(t, l.Free(p, mib, 0, s1))
	q, err := l.Malloc(mib, 0, s1)
	require.NoError(t, err)
	assert.NotEqual(t, p, q, "recorded on a busy stream")

	// Out of memory: an error that matches device.ErrOutOfMemory, counted.
	_, err = l.Malloc(1<<30, 0, s1)
	require.ErrorIs(t, err, device.ErrOutOfMemory)
	var oom *allocator.OutOfMemoryError
	require.ErrorAs(t, err, &oom)
	assert.Equal(t, int64(1), stats(t, l, 0)["num_ooms"])

	// Bad input gets an error and changes nothing.
	require.NoError(t, l.Free(q, mib, 0, s1))
	before := stats(t, l, 0)
	_, err = l.Malloc(-1, 0, s1)
	require.ErrorIs(t, err, device.ErrInvalidSize)
	require.ErrorIs(t, l.Free(0xdead000, mib, 0, s1), device.ErrInvalidPointer)
	require.ErrorIs(t, l.Free(q, mib, 0, s1), device.ErrInvalidPointer, "double free")
	require.ErrorIs(t, l.RecordStream(q, 0, s2), device.ErrInvalidPointer)
	for _, ord := range []int{-1, MaxDevices} {
		_, err = l.Malloc(mib, ord, s1)
		require.ErrorIs(t, err, device.ErrInvalidArgument)
		require.Error(t, l.Free(q, mib, ord, s1))
		require.Error(t, l.EmptyCache(ord))
		_, err = l.StatsJSON(ord)
		require.Error(t, err)
		_, err = l.Summary(ord, false)
		require.Error(t, err)
	}
	assert.Equal(t, before, stats(t, l, 0))

	s, err := l.Summary(0, false)
	require.NoError(t, err)
	assert.Contains(t, s, "Allocated memory")
}

func TestOpenAndConfErrors(t *testing.T) {
	fail := errors.New("no such device")
	calls := 0
	l := New(func(int) (Device, error) {
		calls++
		if calls == 1 {
			return nil, fail
		}
		return sim.New(sim.Config{})
	}, allocator.Config{}, nil)
	_, err := l.Malloc(mib, 0, 0)
	require.ErrorIs(t, err, fail)
	p, err := l.Malloc(mib, 0, 0)
	require.NoError(t, err, "a failed open is tried again on the next call")
	require.NoError(t, l.Free(p, mib, 0, 0))

	bad := errors.New("bad conf")
	l = New(func(int) (Device, error) { return sim.New(sim.Config{}) }, allocator.Config{}, bad)
	_, err = l.Malloc(mib, 0, 0)
	require.ErrorIs(t, err, bad)
	require.ErrorIs(t, l.EmptyCache(0), bad)
}

func TestConfFromEnv(t *testing.T) {
	for _, v := range allocator.ConfEnvVars() {
		t.Setenv(v, "")
	}
	c, err := ConfFromEnv()
	require.NoError(t, err)
	assert.Equal(t, allocator.Config{}, c)

	t.Setenv("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:128")
	c, err = ConfFromEnv()
	require.NoError(t, err)
	assert.Equal(t, uint64(128<<20), c.MaxSplitSize)

	t.Setenv("PYTORCH_ALLOC_CONF", "max_split_size_mb:256")
	c, err = ConfFromEnv()
	require.NoError(t, err)
	assert.Equal(t, uint64(256<<20), c.MaxSplitSize, "PyTorch's current name before its old one")

	t.Setenv("GPUMEM_ALLOC_CONF", "gpumem_policy:low_fragmentation")
	c, err = ConfFromEnv()
	require.NoError(t, err)
	assert.Equal(t, allocator.PolicyLowFragmentation, c.Policy, "gpumem's variable first")
	assert.Zero(t, c.MaxSplitSize, "PyTorch's is not read when gpumem's is set")

	t.Setenv("GPUMEM_ALLOC_CONF", "no_such_key:1")
	_, err = ConfFromEnv()
	require.ErrorContains(t, err, "GPUMEM_ALLOC_CONF")
}

func TestCopyOut(t *testing.T) {
	src := []byte("hello")
	for _, tc := range []struct {
		cap  int
		want string
	}{{0, ""}, {1, ""}, {3, "he"}, {5, "hell"}, {6, "hello"}, {10, "hello"}} {
		buf := make([]byte, tc.cap)
		for i := range buf {
			buf[i] = 'x'
		}
		assert.Equal(t, uint64(5), CopyOut(buf, src))
		if tc.cap > 0 {
			n := len(tc.want)
			assert.Equal(t, tc.want, string(buf[:n]), "cap %d", tc.cap)
			assert.Zero(t, buf[n], "NUL-terminated, cap %d", tc.cap)
			for _, c := range buf[n+1:] {
				assert.Equal(t, byte('x'), c, "nothing written past the NUL, cap %d", tc.cap)
			}
		}
	}
}

func TestConcurrentStreams(t *testing.T) {
	l, _ := simLib(t, 8<<30, allocator.Config{})
	var wg sync.WaitGroup
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			s := uintptr(0x1000 * (1 + w%2))
			for i := 0; i < 300; i++ {
				p, err := l.Malloc(int64(1+i%7)*mib/2, w%2, s)
				if !assert.NoError(t, err) {
					return
				}
				other := uintptr(0x1000 * (2 - w%2))
				if i%3 == 0 {
					assert.NoError(t, l.RecordStream(p, w%2, other))
				}
				assert.NoError(t, l.Free(p, 0, w%2, map[bool]uintptr{true: other, false: s}[i%5 == 0]))
			}
		}(w)
	}
	wg.Wait()
	for ord := 0; ord < 2; ord++ {
		assert.Zero(t, stats(t, l, ord)["allocated_bytes.all.current"])
	}
}

// panicky adopts no stream: it panics, as a bug would.
type panicky struct{ *sim.Device }

func (panicky) AdoptStreamHandle(uintptr) (device.Stream, error) { panic("adopt: a bug") }

// No panic leaves the Lib: it becomes an error wrapping ErrPanic, and the
// Lib goes on working.
func TestPanicsBecomeErrors(t *testing.T) {
	opens := 0
	l := New(func(int) (Device, error) {
		opens++
		if opens == 1 {
			panic("open: a bug")
		}
		d, err := sim.New(sim.Config{})
		return panicky{d}, err
	}, allocator.Config{}, nil)
	_, err := l.Malloc(mib, 0, 0)
	require.ErrorIs(t, err, ErrPanic)
	assert.ErrorContains(t, err, "open: a bug")
	p, err := l.Malloc(mib, 0, 0) // the default stream adopts nothing
	require.NoError(t, err)
	_, err = l.Malloc(mib, 0, 0x77)
	require.ErrorIs(t, err, ErrPanic)
	require.ErrorIs(t, l.Free(p, mib, 0, 0x77), ErrPanic)
	require.ErrorIs(t, l.RecordStream(p, 0, 0x77), ErrPanic)
	require.NoError(t, l.Free(p, mib, 0, 0), "the failed free changed nothing")
	require.NoError(t, l.EmptyCache(0))
}

// TestAsyncBackend: with backend:cudaMallocAsync each device's allocator
// is its stream-ordered pool: blocks come from it, a free on another stream
// waits for that stream, the stats are the pool's and the summary is
// PyTorch's table of them.
func TestAsyncBackend(t *testing.T) {
	conf, err := allocator.ParseConf("backend:cudaMallocAsync")
	require.NoError(t, err)
	l, devs := simLib(t, 1<<30, conf)
	const s1, s2 = 0x1000, 0x2000
	p, err := l.Malloc(3*mib, 0, s1)
	require.NoError(t, err)
	require.NotZero(t, p)
	d := devs[0]
	assert.Equal(t, int64(1), d.Counters().AsyncMallocs)
	assert.Zero(t, d.Counters().Mallocs, "no device malloc: the pool serves it")
	m := stats(t, l, 0)
	assert.Equal(t, int64(3*mib), m["allocated_bytes.all.current"])
	assert.Equal(t, int64(sim.PoolChunk), m["reserved_bytes.all.current"])
	assert.Zero(t, m["num_device_alloc"])

	// Freed on another stream: recorded there first, so the pool reuses
	// the block only once that stream's work is done.
	s2dev, err := d.AdoptStreamHandle(s2)
	require.NoError(t, err)
	require.NoError(t, d.SetStreamBusy(s2dev, true))
	_, err = d.RecordEvent(s2dev)
	require.NoError(t, err)
	require.NoError(t, l.Free(p, 3*mib, 0, s2))
	q, err := l.Malloc(3*mib, 0, s1)
	require.NoError(t, err)
	assert.NotEqual(t, p, q, "stream 2's work is not done")
	require.NoError(t, d.CompleteStream(s2dev))
	r, err := l.Malloc(3*mib, 0, s1)
	require.NoError(t, err)
	assert.Equal(t, p, r)

	sum, err := l.Summary(0, true)
	require.NoError(t, err)
	assert.Contains(t, sum, "Allocated memory")
	require.NoError(t, l.Free(q, 0, 0, s1))
	require.NoError(t, l.Free(r, 0, 0, s1))
	require.NoError(t, l.EmptyCache(0))
	assert.Zero(t, d.BytesInUse())
}

// TestMarkStepAndPlanStats: under gpumem_policy:planned, steps marked
// through the library are planned once one repeats the one before it, and
// PlanStatsJSON gives the figures; under any other policy or backend it
// gives null, and MarkStep is still no error.
func TestMarkStepAndPlanStats(t *testing.T) {
	conf, err := allocator.ParseConf("gpumem_policy:planned")
	require.NoError(t, err)
	l, _ := simLib(t, 1<<30, conf)
	sizes := []int64{3 * mib, 512, 25 * mib, 70 << 10}
	for range 4 {
		require.NoError(t, l.MarkStep(0, "step"))
		var ptrs []uintptr
		for _, size := range sizes {
			p, err := l.Malloc(size, 0, 0)
			require.NoError(t, err)
			ptrs = append(ptrs, p)
		}
		for i, p := range ptrs {
			require.NoError(t, l.Free(p, sizes[i], 0, 0))
		}
	}
	b, err := l.PlanStatsJSON(0)
	require.NoError(t, err)
	var st allocator.PlanStats
	require.NoError(t, json.Unmarshal(b, &st))
	assert.EqualValues(t, 1, st.Plans, "the second step repeated the first: planned at the third mark")
	assert.EqualValues(t, 2*len(sizes), st.Served, "the third and fourth steps served from the arena")
	assert.Zero(t, st.Departures)
	assert.NotZero(t, st.ArenaBytes)
	assert.Contains(t, string(b), `"served":8`)

	for _, c := range []string{"", "gpumem_policy:low_fragmentation", "backend:cudaMallocAsync"} {
		conf, err := allocator.ParseConf(c)
		require.NoError(t, err)
		l, _ := simLib(t, 1<<30, conf)
		require.NoError(t, l.MarkStep(0, "step"), c)
		b, err := l.PlanStatsJSON(0)
		require.NoError(t, err, c)
		assert.Equal(t, "null", string(b), c)
	}
	assert.Error(t, l.MarkStep(-1, "step"), "a bad ordinal")
	_, err = l.PlanStatsJSON(MaxDevices)
	assert.Error(t, err, "a bad ordinal")
}
