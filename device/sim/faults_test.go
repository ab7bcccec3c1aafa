// Tests of fault injection: each fault fails what it says and changes
// nothing else.

package sim

import (
	"errors"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpumem/gpumem/device"
)

func TestFailNthMalloc(t *testing.T) {
	const page = 4096
	d := newDev(t, Config{Capacity: 64 * page, PageSize: page})
	r, err := d.Reserve(8 * page)
	require.NoError(t, err)
	mustMalloc(t, d, 1)
	d.FailNthMalloc(3)
	mustMalloc(t, d, 1)  // 1
	_, err = d.Malloc(0) // invalid: not counted
	require.ErrorIs(t, err, device.ErrInvalidSize)
	require.NoError(t, d.Map(r, page)) // 2: Map counts too
	before := stateOf(d)
	_, err = d.Malloc(1) // 3
	requireDeviceError(t, err, "malloc", 0, device.ErrOutOfMemory)
	assert.Contains(t, err.Error(), "FailNthMalloc")
	requireUnchanged(t, d, before, failedMalloc)
	assert.Equal(t, int64(2), d.Counters().FailedMallocs, "the invalid call and the injected one")
	// Once only, and the failed call took no address.
	assert.Equal(t, d.MemoryBase()+2*page, mustMalloc(t, d, 1))
	for range 5 {
		mustMalloc(t, d, 1)
	}

	// 1 is the next call; a failed Map maps nothing.
	d.FailNthMalloc(2)
	mustMalloc(t, d, 1)
	before = stateOf(d)
	err = d.Map(r+page, 2*page)
	requireDeviceError(t, err, "map", 0, device.ErrOutOfMemory)
	requireUnchanged(t, d, before, failedMap)
	d.FailNthMalloc(1)
	before = stateOf(d)
	require.ErrorIs(t, d.Map(r+page, 2*page), device.ErrOutOfMemory)
	requireUnchanged(t, d, before, failedMap)
	require.NoError(t, d.Map(r+page, 3*page), "nothing was mapped by the failed calls")

	d.FailNthMalloc(1)
	_, err = d.Malloc(1)
	require.ErrorIs(t, err, device.ErrOutOfMemory)

	// Calls with invalid arguments are not counted.
	d.FailNthMalloc(2)
	_, err = d.Malloc(0)
	require.ErrorIs(t, err, device.ErrInvalidSize)
	require.ErrorIs(t, d.Map(r+1, page), device.ErrInvalidArgument)
	require.ErrorIs(t, d.Map(r, page), device.ErrInvalidArgument, "already mapped")
	mustMalloc(t, d, 1)
	_, err = d.Malloc(1)
	require.ErrorIs(t, err, device.ErrOutOfMemory, "the second counted call")

	// Turned off.
	d.FailNthMalloc(2)
	d.FailNthMalloc(0)
	for range 4 {
		mustMalloc(t, d, 1)
	}
	d.FailNthMalloc(2)
	d.FailNthMalloc(-1)
	for range 4 {
		mustMalloc(t, d, 1)
	}
}

func TestFailNthMallocCountsOutOfMemoryCalls(t *testing.T) {
	// A call that fails anyway (not enough free memory, or more than the
	// device has) is still a call: the count moves on.
	for _, size := range []uint64{3 * 4096, 100 * 4096} {
		d := newDev(t, Config{Capacity: 2 * 4096, PageSize: 4096})
		d.FailNthMalloc(2)
		_, err := d.Malloc(size)
		require.ErrorIs(t, err, device.ErrOutOfMemory)
		_, err = d.Malloc(1)
		require.ErrorIs(t, err, device.ErrOutOfMemory, "size %d: second call fails", size)
		mustMalloc(t, d, 1)
	}
}

func TestFailMallocAbove(t *testing.T) {
	const page = 4096
	d := newDev(t, Config{Capacity: 64 * page, PageSize: page})
	r, err := d.Reserve(16 * page)
	require.NoError(t, err)
	d.FailMallocAbove(4 * page)
	mustMalloc(t, d, 4*page) // not more than the limit
	before := stateOf(d)
	_, err = d.Malloc(4*page + 1)
	requireDeviceError(t, err, "malloc", 0, device.ErrOutOfMemory)
	assert.Contains(t, err.Error(), "FailMallocAbove")
	requireUnchanged(t, d, before, failedMalloc)
	require.NoError(t, d.Map(r, 4*page))
	before = stateOf(d)
	require.ErrorIs(t, d.Map(r+4*page, 8*page), device.ErrOutOfMemory)
	requireUnchanged(t, d, before, failedMap)
	// Still on for the next call.
	_, err = d.Malloc(5 * page)
	require.ErrorIs(t, err, device.ErrOutOfMemory)
	d.FailMallocAbove(0)
	mustMalloc(t, d, 5*page)
	require.NoError(t, d.Map(r+4*page, 8*page))
}

func TestFailMallocWhen(t *testing.T) {
	const page = 4096
	d := newDev(t, Config{Capacity: 64 * page, PageSize: page})
	var asked []uint64
	var calls atomic.Int64
	d.FailMallocWhen(func(size uint64) bool {
		calls.Add(1)
		asked = append(asked, size)
		// The predicate runs without the device's lock: it may call it.
		_ = d.BytesInUse()
		_ = d.Counters()
		return size == 3*page
	})
	mustMalloc(t, d, 2*page)
	before := stateOf(d)
	_, err := d.Malloc(3 * page)
	requireDeviceError(t, err, "malloc", 0, device.ErrOutOfMemory)
	assert.Contains(t, err.Error(), "FailMallocWhen")
	requireUnchanged(t, d, before, failedMalloc)
	r, err := d.Reserve(8 * page)
	require.NoError(t, err)
	before = stateOf(d)
	require.ErrorIs(t, d.Map(r, 3*page), device.ErrOutOfMemory)
	requireUnchanged(t, d, before, failedMap)
	require.ErrorIs(t, d.Map(r, 0), device.ErrInvalidArgument, "arguments are checked before faults")
	require.NoError(t, d.Map(r, 2*page))
	assert.Equal(t, []uint64{2 * page, 3 * page, 3 * page, 0, 2 * page}, asked)
	assert.Equal(t, int64(5), calls.Load(), "once per Malloc and Map call, valid or not")
	d.FailMallocWhen(nil)
	mustMalloc(t, d, 3*page)
	assert.Len(t, asked, 5, "off: the predicate is not called")
}

func TestFailFrees(t *testing.T) {
	const page = 4096
	errBoom := errors.New("boom")
	d := newDev(t, Config{Ordinal: 9, Capacity: 64 * page, PageSize: page})
	p := mustMalloc(t, d, page)
	r, err := d.Reserve(4 * page)
	require.NoError(t, err)
	require.NoError(t, d.Map(r, 4*page))
	d.FailFrees(errBoom)

	before := stateOf(d)
	err = d.Free(p)
	requireDeviceError(t, err, "free", 9, errBoom)
	assert.NotErrorIs(t, err, device.ErrInvalidPointer)
	requireUnchanged(t, d, before, failedFree)
	before = stateOf(d)
	err = d.Unmap(r, 2*page)
	requireDeviceError(t, err, "unmap", 9, errBoom)
	requireUnchanged(t, d, before, failedUnmap)
	// Bad arguments still fail with their own errors.
	before = stateOf(d)
	require.ErrorIs(t, d.Free(p+page), device.ErrInvalidPointer)
	require.ErrorIs(t, d.Unmap(r+4*page, page), device.ErrInvalidArgument)
	requireUnchanged(t, d, before, failedFree)
	c := d.Counters()
	assert.Equal(t, int64(2), c.FailedFrees)
	assert.Equal(t, int64(1), c.FailedUnmaps)
	// Mallocs still work.
	q := mustMalloc(t, d, page)

	d.FailFrees(nil)
	require.NoError(t, d.Free(p))
	require.NoError(t, d.Free(q))
	require.NoError(t, d.Unmap(r, 4*page), "all four pages were still mapped")
	require.NoError(t, d.Release(r))
	assert.Zero(t, d.BytesInUse())
}

func TestFailEventQueries(t *testing.T) {
	errBoom := errors.New("driver lost")
	d, s, e1, _ := busyStream(t)
	d.FailEventQueries(errBoom)
	before := stateOf(d)
	done, err := d.EventDone(e1)
	requireDeviceError(t, err, "query event", 0, errBoom)
	assert.False(t, done)
	requireDeviceError(t, d.SynchronizeEvent(e1), "synchronize event", 0, errBoom)
	requireUnchanged(t, d, before, failedEventQueries(2))
	// Unknown events keep their own error; recording and releasing work.
	_, err = d.EventDone(999)
	require.ErrorIs(t, err, device.ErrInvalidEvent)
	e3, err := d.RecordEvent(s)
	require.NoError(t, err)
	require.NoError(t, d.ReleaseEvent(e3))
	assert.Equal(t, int64(2), d.Counters().FailedEventQueries)

	d.FailEventQueries(nil)
	assert.False(t, eventDone(t, d, e1), "the failed SynchronizeEvent finished nothing")
	require.NoError(t, d.SynchronizeEvent(e1))
	assert.True(t, eventDone(t, d, e1))
}
