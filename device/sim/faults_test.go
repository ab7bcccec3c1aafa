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
	d := newDev(t, Config{})
	r, err := d.Reserve(16 * MiB)
	require.NoError(t, err)
	d.FailNthMalloc(3)
	_, err = d.Malloc(1) // 1
	require.NoError(t, err)
	_, err = d.Malloc(0) // invalid: not counted
	require.ErrorIs(t, err, device.ErrInvalidSize)
	require.NoError(t, d.Map(r, 2*MiB)) // 2: Map counts too
	before := stateOf(d)
	free, _, _ := d.MemInfo()
	_, err = d.Malloc(1) // 3
	require.ErrorIs(t, err, device.ErrOutOfMemory)
	assert.Contains(t, err.Error(), "FailNthMalloc")
	var de *device.Error
	require.True(t, errors.As(err, &de))
	assert.Equal(t, "malloc", de.Op)
	assert.Equal(t, before.Counters.MemInfos+1, stateOf(d).Counters.MemInfos)
	after := stateOf(d)
	after.Counters.MemInfos = before.Counters.MemInfos
	assert.Equal(t, before, after)
	free2, _, _ := d.MemInfo()
	assert.Equal(t, free, free2)
	assert.Equal(t, int64(2), d.Counters().FailedMallocs)

	p, err := d.Malloc(1) // once only
	require.NoError(t, err)
	assert.Equal(t, d.MemoryBase()+device.Ptr(2*MiB), p, "the failed call took no address")

	d.FailNthMalloc(1)
	before = stateOf(d)
	require.ErrorIs(t, d.Map(r+device.Ptr(2*MiB), 2*MiB), device.ErrOutOfMemory)
	assert.Equal(t, before, stateOf(d))
	assert.Equal(t, int64(1), d.Counters().FailedMaps)

	d.FailNthMalloc(2)
	d.FailNthMalloc(0) // off
	for range 3 {
		_, err := d.Malloc(1)
		require.NoError(t, err)
	}
}

func TestFailMallocAbove(t *testing.T) {
	d := newDev(t, Config{})
	r, _ := d.Reserve(64 * MiB)
	d.FailMallocAbove(4 * MiB)
	before := stateOf(d)
	_, err := d.Malloc(4*MiB + 1)
	require.ErrorIs(t, err, device.ErrOutOfMemory)
	assert.Contains(t, err.Error(), "FailMallocAbove")
	require.ErrorIs(t, d.Map(r, 6*MiB), device.ErrOutOfMemory)
	assert.Equal(t, before, stateOf(d))

	p, err := d.Malloc(4 * MiB) // not more than the limit
	require.NoError(t, err)
	require.NoError(t, d.Map(r, 4*MiB))
	d.FailMallocAbove(0)
	_, err = d.Malloc(64 * MiB)
	require.NoError(t, err)
	require.NoError(t, d.Free(p))
}

func TestFailMallocWhen(t *testing.T) {
	d := newDev(t, Config{})
	r, _ := d.Reserve(64 * MiB)
	var calls atomic.Int64
	d.FailMallocWhen(func(size uint64) bool {
		calls.Add(1)
		// The predicate runs without the device's lock: it may read it.
		_ = d.Counters()
		return size == 3*MiB
	})
	before := stateOf(d)
	_, err := d.Malloc(3 * MiB)
	require.ErrorIs(t, err, device.ErrOutOfMemory)
	assert.Contains(t, err.Error(), "FailMallocWhen")
	require.ErrorIs(t, d.Map(r, 0), device.ErrInvalidArgument, "arguments are checked before faults")
	err = d.Map(r, 4*MiB)
	require.NoError(t, err, "4 MiB is not 3 MiB")
	require.NoError(t, d.Unmap(r, 4*MiB))
	assert.Equal(t, before.Allocs, d.Allocations())
	_, err = d.Malloc(2 * MiB)
	require.NoError(t, err)
	assert.Equal(t, int64(4), calls.Load(), "once per Malloc and Map call")
	d.FailMallocWhen(nil)
	_, err = d.Malloc(3 * MiB)
	require.NoError(t, err)
}

func TestFailFrees(t *testing.T) {
	d := newDev(t, Config{})
	p, _ := d.Malloc(MiB)
	r, _ := d.Reserve(4 * MiB)
	require.NoError(t, d.Map(r, 2*MiB))
	boom := errors.New("boom")
	d.FailFrees(boom)
	before := stateOf(d)

	err := d.Free(p)
	require.ErrorIs(t, err, boom)
	assert.NotErrorIs(t, err, device.ErrInvalidPointer)
	var de *device.Error
	require.True(t, errors.As(err, &de))
	assert.Equal(t, "free", de.Op)
	err = d.Unmap(r, 2*MiB)
	require.ErrorIs(t, err, boom)
	assert.ErrorIs(t, d.Free(p+1), device.ErrInvalidPointer, "bad arguments keep their own error")
	assert.Equal(t, before, stateOf(d))
	c := d.Counters()
	assert.Equal(t, int64(2), c.FailedFrees)
	assert.Equal(t, int64(1), c.FailedUnmaps)

	d.FailFrees(nil)
	require.NoError(t, d.Free(p))
	require.NoError(t, d.Unmap(r, 2*MiB))
}

func TestFailEventQueries(t *testing.T) {
	d := newDev(t, Config{})
	s, _ := d.NewStream()
	require.NoError(t, d.SetStreamBusy(s, true))
	e, _ := d.RecordEvent(s)
	boom := errors.New("driver lost")
	d.FailEventQueries(boom)
	before := stateOf(d)

	done, err := d.EventDone(e)
	require.ErrorIs(t, err, boom)
	assert.False(t, done)
	require.ErrorIs(t, d.SynchronizeEvent(e), boom)
	_, err = d.EventDone(e + 1)
	require.ErrorIs(t, err, device.ErrInvalidEvent, "unknown events keep their own error")
	assert.Equal(t, before, stateOf(d), "the failed synchronization finished nothing")
	assert.Equal(t, int64(2), d.Counters().FailedEventQueries)

	d.FailEventQueries(nil)
	done, err = d.EventDone(e)
	require.NoError(t, err)
	assert.False(t, done)
	require.NoError(t, d.SynchronizeEvent(e))
	done, _ = d.EventDone(e)
	assert.True(t, done)
}
