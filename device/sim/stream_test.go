// Tests of streams, events and held work.

package sim

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpumem/gpumem/device"
)

func TestStreamsAreNumberedInCreationOrder(t *testing.T) {
	d := newDev(t, Config{})
	assert.True(t, d.HasStream(device.DefaultStream))
	assert.False(t, d.HasStream(1))
	for want := device.Stream(1); want <= 3; want++ {
		s, err := d.NewStream()
		require.NoError(t, err)
		assert.Equal(t, want, s)
	}
	assert.Equal(t, 4, d.Streams())
	assert.Equal(t, int64(3), d.Counters().StreamsCreated)

	before := stateOf(d)
	for _, bad := range []device.Stream{4, 1 << 40} {
		assert.ErrorIs(t, d.SynchronizeStream(bad), device.ErrInvalidStream)
		_, err := d.RecordEvent(bad)
		assert.ErrorIs(t, err, device.ErrInvalidStream)
		assert.ErrorIs(t, d.SetStreamBusy(bad, true), device.ErrInvalidStream)
		assert.ErrorIs(t, d.CompleteStream(bad), device.ErrInvalidStream)
		_, err = d.PendingWork(bad)
		assert.ErrorIs(t, err, device.ErrInvalidStream)
	}
	assert.Equal(t, before, stateOf(d))
}

func TestEventsOnIdleStreamsAreDoneAtOnce(t *testing.T) {
	d := newDev(t, Config{})
	s, _ := d.NewStream()
	e1, err := d.RecordEvent(device.DefaultStream)
	require.NoError(t, err)
	e2, err := d.RecordEvent(s)
	require.NoError(t, err)
	assert.Equal(t, device.Event(1), e1)
	assert.Equal(t, device.Event(2), e2)
	for _, e := range []device.Event{e1, e2} {
		done, err := d.EventDone(e)
		require.NoError(t, err)
		assert.True(t, done)
	}
	c := d.Counters()
	assert.Equal(t, int64(2), c.EventsRecorded)
	assert.Equal(t, int64(2), c.EventQueries)
}

func TestBusyStreamHoldsEventsUntilCompleted(t *testing.T) {
	d := newDev(t, Config{})
	s, _ := d.NewStream()
	require.NoError(t, d.SetStreamBusy(s, true))
	e1, _ := d.RecordEvent(s)
	e2, _ := d.RecordEvent(s)
	other, _ := d.RecordEvent(device.DefaultStream)
	n, err := d.PendingWork(s)
	require.NoError(t, err)
	assert.Equal(t, uint64(2), n)

	assertDone := func(e device.Event, want bool) {
		t.Helper()
		done, err := d.EventDone(e)
		require.NoError(t, err)
		assert.Equal(t, want, done, "event %d", e)
	}
	assertDone(e1, false)
	assertDone(e2, false)
	assertDone(other, true)

	// Free synchronizes the device in cost and count, but held work stays.
	p, _ := d.Malloc(1)
	require.NoError(t, d.Free(p))
	assertDone(e1, false)

	require.NoError(t, d.CompleteStream(s))
	assertDone(e1, true)
	assertDone(e2, true)

	// Still busy: later work is held again.
	e3, _ := d.RecordEvent(s)
	assertDone(e3, false)
	require.NoError(t, d.SetStreamBusy(s, false))
	assertDone(e3, true) // not busy any more: pending work finished
	e4, _ := d.RecordEvent(s)
	assertDone(e4, true)
}

func TestSynchronizeEventFinishesUpToThatEvent(t *testing.T) {
	d := newDev(t, Config{})
	s, _ := d.NewStream()
	require.NoError(t, d.SetStreamBusy(s, true))
	e1, _ := d.RecordEvent(s)
	e2, _ := d.RecordEvent(s)
	e3, _ := d.RecordEvent(s)
	require.NoError(t, d.SynchronizeEvent(e2))
	for e, want := range map[device.Event]bool{e1: true, e2: true, e3: false} {
		done, err := d.EventDone(e)
		require.NoError(t, err)
		assert.Equal(t, want, done, "event %d", e)
	}
	// Synchronizing an older event does not undo anything.
	require.NoError(t, d.SynchronizeEvent(e1))
	done, _ := d.EventDone(e2)
	assert.True(t, done)
	assert.Equal(t, int64(2), d.Counters().EventSynchronizations)
	n, _ := d.PendingWork(s)
	assert.Equal(t, uint64(1), n)
}

func TestSynchronizeFinishesEveryStream(t *testing.T) {
	d := newDev(t, Config{})
	s1, _ := d.NewStream()
	s2, _ := d.NewStream()
	require.NoError(t, d.SetStreamBusy(s1, true))
	require.NoError(t, d.SetStreamBusy(s2, true))
	e1, _ := d.RecordEvent(s1)
	e2, _ := d.RecordEvent(s2)

	require.NoError(t, d.SynchronizeStream(s1))
	done1, _ := d.EventDone(e1)
	done2, _ := d.EventDone(e2)
	assert.True(t, done1)
	assert.False(t, done2, "a stream synchronization leaves other streams alone")

	require.NoError(t, d.Synchronize())
	done2, _ = d.EventDone(e2)
	assert.True(t, done2)
	e3, _ := d.RecordEvent(s2)
	done3, _ := d.EventDone(e3)
	assert.False(t, done3, "busy survives a synchronization")
	c := d.Counters()
	assert.Equal(t, int64(1), c.Synchronizations)
	assert.Equal(t, int64(1), c.StreamSynchronizations)
}

func TestReleasedAndUnknownEvents(t *testing.T) {
	d := newDev(t, Config{})
	s, _ := d.NewStream()
	require.NoError(t, d.SetStreamBusy(s, true))
	e, _ := d.RecordEvent(s)
	later, _ := d.RecordEvent(s)
	require.NoError(t, d.ReleaseEvent(e))
	assert.Equal(t, int64(1), d.Counters().EventsReleased)

	before := stateOf(d)
	for _, bad := range []device.Event{0, e, 99} {
		_, err := d.EventDone(bad)
		assert.ErrorIs(t, err, device.ErrInvalidEvent, "event %d", bad)
		assert.ErrorIs(t, d.SynchronizeEvent(bad), device.ErrInvalidEvent)
		assert.ErrorIs(t, d.ReleaseEvent(bad), device.ErrInvalidEvent)
	}
	assert.Equal(t, before, stateOf(d))
	// Releasing did not finish or cancel the work: the later event is
	// still pending, and finishes with its stream.
	n, _ := d.PendingWork(s)
	assert.Equal(t, uint64(2), n)
	require.NoError(t, d.CompleteStream(s))
	done, err := d.EventDone(later)
	require.NoError(t, err)
	assert.True(t, done)
	next, _ := d.RecordEvent(s)
	assert.Equal(t, device.Event(3), next, "ids are never reused")
}

func TestDefaultStreamCanBeBusy(t *testing.T) {
	d := newDev(t, Config{})
	require.NoError(t, d.SetStreamBusy(device.DefaultStream, true))
	e, _ := d.RecordEvent(device.DefaultStream)
	done, _ := d.EventDone(e)
	assert.False(t, done)
	require.NoError(t, d.SynchronizeStream(device.DefaultStream))
	done, _ = d.EventDone(e)
	assert.True(t, done)
}
