// Tests of the cost model, the clock and Config.Sleep.

package sim

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpumem/gpumem/device"
)

// testCosts gives every call a distinct cost.
func testCosts() Costs {
	return Costs{
		Malloc:            1000,
		MallocPerGiB:      1 << 20, // 1 ns per KiB
		Free:              3,
		MemInfo:           5,
		Synchronize:       7,
		StreamSynchronize: 53,
		StreamCreate:      11,
		EventRecord:       13,
		EventQuery:        17,
		EventSynchronize:  19,
		EventRelease:      23,
		EventWait:         59,
		Reserve:           29,
		Release:           31,
		Map:               37,
		Unmap:             41,
		HostAlloc:         43,
		HostAllocPerGiB:   2 << 20, // 2 ns per KiB
		HostFree:          47,
		Copy:              61,
		CopyPerGiB:        3 << 20, // 3 ns per KiB
		MallocAsync:       67,
		FreeAsync:         71,
	}
}

func TestCosts(t *testing.T) {
	const page = 64 * KiB
	d := mustNew(t, Config{Capacity: 64 * page, PageSize: page, Costs: testCosts()})
	require.Equal(t, testCosts(), d.Costs())
	require.Zero(t, d.Clock())
	step := func(name string, want time.Duration, call func() error) {
		t.Helper()
		before := d.Clock()
		require.NoError(t, call(), name)
		assert.Equal(t, want, d.Clock()-before, name)
	}
	var p device.Ptr
	var s device.Stream
	var e device.Event
	var r device.Ptr
	var h []byte
	step("malloc of one page", 1000+64, func() (err error) { p, err = d.Malloc(page); return })
	step("malloc of three pages", 1000+3*64, func() (err error) { _, err = d.Malloc(3 * page); return })
	step("free: free plus a synchronization", 3+7, func() error { return d.Free(p) })
	step("meminfo", 5, func() error { _, _, err := d.MemInfo(); return err })
	step("synchronize", 7, d.Synchronize)
	step("new stream", 11, func() (err error) { s, err = d.NewStream(); return })
	step("synchronize stream", 53, func() error { return d.SynchronizeStream(s) })
	step("record event", 13, func() (err error) { e, err = d.RecordEvent(s); return })
	step("event query", 17, func() error { _, err := d.EventDone(e); return err })
	step("synchronize event", 19, func() error { return d.SynchronizeEvent(e) })
	step("wait event", 59, func() error { return d.WaitEvent(device.DefaultStream, e) })
	step("release event", 23, func() error { return d.ReleaseEvent(e) })
	step("reserve", 29, func() (err error) { r, err = d.Reserve(8 * page); return })
	step("map of three pages", 3*37, func() error { return d.Map(r, 3*page) })
	step("unmap of two pages", 2*41, func() error { return d.Unmap(r+device.Ptr(page), 2*page) })
	step("unmap of one page", 41, func() error { return d.Unmap(r, page) })
	step("release", 31, func() error { return d.Release(r) })
	step("host alloc of 1 MiB", 43+2*1024, func() (err error) { h, err = d.HostAlloc(MiB); return })
	step("host free", 47, func() error { return d.HostFree(h) })
	step("malloc to copy into", 1000+64, func() (err error) { p, err = d.Malloc(page); return })
	buf := make([]byte, 4*KiB)
	step("copy of 4 KiB from host", 61+4*3, func() error { return d.CopyFromHost(p, buf) })
	step("copy of 4 KiB to host", 61+4*3, func() error { return d.CopyToHost(buf, p) })
	var a, b device.Ptr
	step("malloc async that grows the pool by a page", 67+1000+64, func() (err error) { a, err = d.MallocAsync(1000, s); return })
	step("malloc async from the pool", 67, func() (err error) { b, err = d.MallocAsync(1000, s); return })
	step("free async", 71, func() error { return d.FreeAsync(a, s) })
	step("free async", 71, func() error { return d.FreeAsync(b, s) })
	step("trim returning one chunk", 3, func() error { return d.TrimPool(0) })

	// Test controls and read-only methods cost nothing.
	step("controls", 0, func() error {
		_ = d.Counters()
		_ = d.Allocations()
		_ = d.BytesInUse()
		_ = d.Reservations()
		_ = d.PoolChunks()
		_ = d.ContentPages()
		_, err := d.PoolUsage()
		require.NoError(t, err)
		require.NoError(t, d.ResetPoolPeaks())
		require.NoError(t, d.SetReleaseThreshold(1))
		_ = d.HasStream(s)
		_ = d.Streams()
		_ = d.String()
		_, err = d.PendingWork(s)
		require.NoError(t, err)
		d.FailNthMalloc(0)
		d.FailMallocAbove(0)
		d.FailMallocWhen(nil)
		d.FailFrees(nil)
		d.FailEventQueries(nil)
		require.NoError(t, d.SetStreamBusy(s, true))
		require.NoError(t, d.CompleteStream(s))
		return d.SetStreamBusy(s, false)
	})
}

// TestMallocCostIsPerChargedByte: MallocPerGiB applies to the bytes
// charged (whole pages), as a real cudaMalloc maps whole pages, not to the
// bytes asked for.
func TestMallocCostIsPerChargedByte(t *testing.T) {
	const page = 64 * KiB
	d := mustNew(t, Config{Capacity: 64 * page, PageSize: page, Costs: testCosts()})
	for _, c := range []struct {
		size    uint64
		charged uint64
	}{{1, page}, {page - 1, page}, {page, page}, {page + 1, 2 * page}, {5*page + 7, 6 * page}} {
		before := d.Clock()
		p := mustMalloc(t, d, c.size)
		assert.Equal(t, time.Duration(1000+c.charged/KiB), d.Clock()-before, "malloc of %d bytes", c.size)
		require.NoError(t, d.Free(p))
	}
}

// TestCostsOfFailedCalls: a failed call costs its call, as a failed driver
// call takes time too; a failed Free does not synchronize.
func TestCostsOfFailedCalls(t *testing.T) {
	const page = 64 * KiB
	d := mustNew(t, Config{Capacity: 4 * page, PageSize: page, Costs: testCosts()})
	fails := func(name string, want time.Duration, call func() error) {
		t.Helper()
		before := d.Clock()
		require.Error(t, call(), name)
		assert.Equal(t, want, d.Clock()-before, name)
	}
	fails("malloc of size 0", 1000, func() error { _, err := d.Malloc(0); return err })
	fails("malloc beyond capacity", 1000+5*64, func() error { _, err := d.Malloc(5 * page); return err })
	fails("free", 3, func() error { return d.Free(12345) })
	fails("synchronize stream", 53, func() error { return d.SynchronizeStream(99) })
	fails("record event", 13, func() error { _, err := d.RecordEvent(99); return err })
	fails("event query", 17, func() error { _, err := d.EventDone(999); return err })
	fails("release event", 23, func() error { return d.ReleaseEvent(999) })
	fails("reserve", 29, func() error { _, err := d.Reserve(page + 1); return err })
	fails("map of two pages", 2*37, func() error { return d.Map(device.Ptr(page), 2*page) })
	fails("release", 31, func() error { return d.Release(1) })
}

func TestCostsNegativeMeansFree(t *testing.T) {
	d := mustNew(t, Config{Capacity: GiB, Costs: NoCosts()})
	assert.Equal(t, Costs{}, d.Costs(), "every field resolved to zero")
	p := mustMalloc(t, d, 100*MiB)
	require.NoError(t, d.Free(p))
	require.NoError(t, d.Synchronize())
	s, err := d.NewStream()
	require.NoError(t, err)
	require.NoError(t, d.SynchronizeStream(s))
	e, err := d.RecordEvent(s)
	require.NoError(t, err)
	_, err = d.EventDone(e)
	require.NoError(t, err)
	require.NoError(t, d.SynchronizeEvent(e))
	require.NoError(t, d.ReleaseEvent(e))
	_, _, err = d.MemInfo()
	require.NoError(t, err)
	r, err := d.Reserve(4 * MiB)
	require.NoError(t, err)
	require.NoError(t, d.Map(r, 4*MiB))
	require.NoError(t, d.Unmap(r, 4*MiB))
	require.NoError(t, d.Release(r))
	h, err := d.HostAlloc(MiB)
	require.NoError(t, err)
	require.NoError(t, d.HostFree(h))
	_, err = d.Malloc(0)
	require.Error(t, err)
	assert.Zero(t, d.Clock())
}

func TestCostsFieldDefaults(t *testing.T) {
	def := DefaultCosts()
	for i, f := range []time.Duration{def.Malloc, def.MallocPerGiB, def.Free, def.MemInfo, def.Synchronize,
		def.StreamSynchronize, def.StreamCreate, def.EventRecord, def.EventQuery, def.EventSynchronize,
		def.EventRelease, def.Reserve, def.Release, def.Map, def.Unmap, def.HostAlloc, def.HostAllocPerGiB,
		def.HostFree} {
		assert.Positive(t, f, "field %d", i)
	}

	// The zero value is the default model.
	d := mustNew(t, Config{})
	assert.Equal(t, def, d.Costs())
	mustMalloc(t, d, GiB)
	assert.Equal(t, def.Malloc+def.MallocPerGiB, d.Clock())
	p := mustMalloc(t, d, 2*MiB)
	before := d.Clock()
	require.NoError(t, d.Free(p))
	assert.Equal(t, def.Free+def.Synchronize, d.Clock()-before)

	// A zero field takes its default, a negative one is free, the others
	// keep their figure.
	d = mustNew(t, Config{Capacity: GiB, Costs: Costs{Free: -5, Synchronize: 9, Malloc: -time.Second, MallocPerGiB: -1}})
	want := def
	want.Free, want.Synchronize, want.Malloc, want.MallocPerGiB = 0, 9, 0, 0
	assert.Equal(t, want, d.Costs())
	p = mustMalloc(t, d, 1)
	assert.Zero(t, d.Clock())
	require.NoError(t, d.Free(p))
	assert.Equal(t, time.Duration(9), d.Clock(), "free costs its synchronization")
	_, err := d.NewStream()
	require.NoError(t, err)
	assert.Equal(t, 9+def.StreamCreate, d.Clock())

	// MallocPerGiB is pro rata: half a GiB costs half the rate.
	d = mustNew(t, Config{Costs: Costs{
		Malloc: 10 * time.Microsecond, MallocPerGiB: time.Millisecond,
		Free: 5 * time.Microsecond, Synchronize: 7 * time.Microsecond,
		MemInfo: -1,
	}})
	assert.Zero(t, d.Costs().MemInfo)
	assert.Equal(t, def.EventRecord, d.Costs().EventRecord, "zero fields take the default")
	p = mustMalloc(t, d, GiB/2)
	assert.Equal(t, 510*time.Microsecond, d.Clock())
	_, _, _ = d.MemInfo()
	assert.Equal(t, 510*time.Microsecond, d.Clock(), "a negative cost is free")
	require.NoError(t, d.Free(p))
	assert.Equal(t, 522*time.Microsecond, d.Clock(), "Free costs itself plus a synchronization")
	require.Error(t, d.Free(p))
	assert.Equal(t, 527*time.Microsecond, d.Clock(), "a failed call costs its call")
}

func TestCostsSaturate(t *testing.T) {
	huge := time.Duration(1<<63 - 1)
	assert.Equal(t, huge, perGiB(time.Hour, ^uint64(0)))
	assert.Equal(t, huge, times(time.Second, ^uint64(0)))
	assert.Equal(t, huge, plus(1<<62, 1<<62))
	assert.Equal(t, 3*time.Millisecond, perGiB(2*time.Millisecond, 3*GiB/2))

	d := mustNew(t, Config{Capacity: MaxCapacity, Costs: Costs{Malloc: huge, MallocPerGiB: huge}})
	p := mustMalloc(t, d, MaxCapacity)
	assert.Equal(t, huge, d.Clock())
	require.NoError(t, d.Free(p))
	assert.Equal(t, huge, d.Clock(), "the clock saturates, never wraps")

	d = newDev(t, Config{Costs: Costs{Malloc: time.Hour, MallocPerGiB: time.Hour}})
	for range 3 {
		_, err := d.Malloc(^uint64(0))
		require.Error(t, err)
	}
	assert.Equal(t, huge, d.Clock(), "failed calls saturate it too")
}

func TestSleep(t *testing.T) {
	const cost = 3 * time.Millisecond
	c := NoCosts()
	c.Malloc = cost
	c.Free, c.Synchronize = cost, cost
	c.EventRelease = cost
	c.Reserve, c.Release = cost, cost
	c.Map, c.Unmap = cost, cost
	c.HostAlloc, c.HostFree = cost, cost
	d := mustNew(t, Config{Capacity: GiB, Costs: c, Sleep: true})
	// Lower bounds only: sleeping at least the cost is the behaviour.
	measure := func(name string, want time.Duration, call func() error) {
		t.Helper()
		start := time.Now()
		_ = call()
		assert.GreaterOrEqual(t, time.Since(start), want, name)
	}
	var p, r device.Ptr
	var e device.Event
	var h []byte
	measure("malloc", cost, func() (err error) { p, err = d.Malloc(1); return })
	measure("failed malloc", cost, func() (err error) { _, err = d.Malloc(0); return })
	measure("free", 2*cost, func() error { return d.Free(p) })
	measure("synchronize", cost, d.Synchronize)
	measure("record event", 0, func() (err error) { e, err = d.RecordEvent(0); return })
	measure("release event", cost, func() error { return d.ReleaseEvent(e) })
	measure("reserve", cost, func() (err error) { r, err = d.Reserve(4 * MiB); return })
	measure("map", 2*cost, func() error { return d.Map(r, 4*MiB) })
	measure("unmap", 2*cost, func() error { return d.Unmap(r, 4*MiB) })
	measure("release", cost, func() error { return d.Release(r) })
	measure("host alloc", cost, func() (err error) { h, err = d.HostAlloc(8); return })
	measure("host free", cost, func() error { return d.HostFree(h) })
	assert.Positive(t, d.Clock())
}

func TestSleepDoesNotHoldTheLock(t *testing.T) {
	slow := mustNew(t, Config{Sleep: true, Costs: Costs{Synchronize: 200 * time.Millisecond}})
	done := make(chan struct{})
	go func() {
		_ = slow.Synchronize()
		close(done)
	}()
	// Wait until the sleeper has paid (it counts before sleeping), then
	// take the lock: this must not wait for the sleep to end.
	for slow.Counters().Synchronizations == 0 {
		time.Sleep(time.Millisecond)
	}
	_, _, err := slow.MemInfo()
	require.NoError(t, err)
	select {
	case <-done:
		t.Fatal("Synchronize returned before its simulated cost elapsed")
	default:
	}
	<-done
}
