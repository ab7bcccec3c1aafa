// Tests of streams, events and held work.

package sim

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpumem/gpumem/device"
)

func TestStreams(t *testing.T) {
	t.Run("ordinal 0", func(t *testing.T) {
		d := newDev(t, Config{})
		assert.True(t, d.HasStream(device.DefaultStream))
		assert.False(t, d.HasStream(1))
		for want := device.Stream(1); want <= 3; want++ {
			s, err := d.NewStream()
			require.NoError(t, err)
			assert.Equal(t, want, s, "ordinal 0's handles are the plain numbers")
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
		requireUnchanged(t, d, before, nil)
	})

	t.Run("ordinal 1", func(t *testing.T) {
		d := newDev(t, Config{Ordinal: 1, Capacity: GiB})
		assert.True(t, d.HasStream(device.DefaultStream))
		assert.False(t, d.HasStream(1))
		for n := uint64(1); n <= 3; n++ {
			s, err := d.NewStream()
			require.NoError(t, err)
			assert.Equal(t, device.Stream(1<<32|n), s, "ordinal 1's stream n is 1<<32 | n")
			assert.True(t, d.HasStream(s))
		}
		assert.False(t, d.HasStream(1<<32|4))
		assert.False(t, d.HasStream(2), "a stream of another device")
		assert.False(t, d.HasStream(^device.Stream(0)))
		assert.Equal(t, 4, d.Streams())
		assert.Equal(t, int64(3), d.Counters().StreamsCreated)

		// Every device numbers its own streams from 1; ordinal 0's
		// handles are not streams of device 1.
		other := mustNew(t, Config{Capacity: GiB})
		s, err := other.NewStream()
		require.NoError(t, err)
		assert.Equal(t, device.Stream(1), s)
		assert.False(t, d.HasStream(s))

		for _, bad := range []device.Stream{1<<32 | 4, 1, 100, ^device.Stream(0)} {
			before := stateOf(d)
			requireDeviceError(t, d.SynchronizeStream(bad), "synchronize stream", 1, device.ErrInvalidStream)
			_, err := d.RecordEvent(bad)
			requireDeviceError(t, err, "record event", 1, device.ErrInvalidStream)
			requireDeviceError(t, d.SetStreamBusy(bad, true), "set stream busy", 1, device.ErrInvalidStream)
			requireDeviceError(t, d.CompleteStream(bad), "complete stream", 1, device.ErrInvalidStream)
			_, err = d.PendingWork(bad)
			requireDeviceError(t, err, "pending work", 1, device.ErrInvalidStream)
			requireUnchanged(t, d, before, nil)
			assert.False(t, d.HasStream(bad))
		}
		for _, s := range []device.Stream{0, 1<<32 | 1, 1<<32 | 2, 1<<32 | 3} {
			require.NoError(t, d.SynchronizeStream(s))
			require.NoError(t, d.SetStreamBusy(s, false))
			require.NoError(t, d.CompleteStream(s))
		}
	})
}

func TestEventsCompleteAtOnceByDefault(t *testing.T) {
	d := mustNew(t, Config{Capacity: GiB})
	s, err := d.NewStream()
	require.NoError(t, err)
	want := device.Event(1)
	for _, st := range []device.Stream{device.DefaultStream, s, s} {
		e, err := d.RecordEvent(st)
		require.NoError(t, err)
		assert.Equal(t, want, e, "events are numbered 1, 2, 3, ...")
		want++
		assert.True(t, eventDone(t, d, e))
		require.NoError(t, d.SynchronizeEvent(e))
		assert.Zero(t, pending(t, d, st))
	}
	c := d.Counters()
	assert.Equal(t, int64(3), c.EventsRecorded)
	assert.Equal(t, int64(3), c.EventQueries)
	assert.Equal(t, int64(3), c.EventSynchronizations)
	// Ids are never reused.
	require.NoError(t, d.ReleaseEvent(3))
	e, err := d.RecordEvent(s)
	require.NoError(t, err)
	assert.Equal(t, device.Event(4), e)
}

func TestEventsOnBusyStream(t *testing.T) {
	finishers := map[string]func(d *Device, s device.Stream) error{
		"CompleteStream":    (*Device).CompleteStream,
		"SynchronizeStream": (*Device).SynchronizeStream,
		"Synchronize":       func(d *Device, _ device.Stream) error { return d.Synchronize() },
	}
	for name, finish := range finishers {
		t.Run(name, func(t *testing.T) {
			d, s, e1, e2 := busyStream(t)
			// Pending events stay pending however often they are asked.
			for range 3 {
				require.False(t, eventDone(t, d, e1))
			}
			require.NoError(t, finish(d, s))
			assert.True(t, eventDone(t, d, e1))
			assert.True(t, eventDone(t, d, e2))
			assert.Zero(t, pending(t, d, s))
			// The stream stays busy for later work.
			e3, err := d.RecordEvent(s)
			require.NoError(t, err)
			assert.False(t, eventDone(t, d, e3))
			require.NoError(t, finish(d, s))
			assert.True(t, eventDone(t, d, e3))
		})
	}

	t.Run("SynchronizeEvent finishes up to its event", func(t *testing.T) {
		d, s, e1, e2 := busyStream(t)
		e3, err := d.RecordEvent(s)
		require.NoError(t, err)
		require.NoError(t, d.SynchronizeEvent(e2))
		assert.True(t, eventDone(t, d, e1), "earlier event")
		assert.True(t, eventDone(t, d, e2))
		assert.False(t, eventDone(t, d, e3), "later event")
		assert.Equal(t, uint64(1), pending(t, d, s))
		// Waiting for an earlier event again undoes nothing.
		require.NoError(t, d.SynchronizeEvent(e1))
		assert.True(t, eventDone(t, d, e2))
		assert.False(t, eventDone(t, d, e3))
		assert.Equal(t, int64(2), d.Counters().EventSynchronizations)
		require.NoError(t, d.SynchronizeEvent(e3))
		assert.True(t, eventDone(t, d, e3))
		// Still busy.
		e4, err := d.RecordEvent(s)
		require.NoError(t, err)
		assert.False(t, eventDone(t, d, e4))
	})

	t.Run("SynchronizeEvent of a released predecessor's successor", func(t *testing.T) {
		d, _, e1, e2 := busyStream(t)
		require.NoError(t, d.ReleaseEvent(e1))
		require.NoError(t, d.SynchronizeEvent(e2))
		assert.True(t, eventDone(t, d, e2))
	})

	t.Run("SetStreamBusy false finishes pending work", func(t *testing.T) {
		d, s, e1, e2 := busyStream(t)
		require.NoError(t, d.SetStreamBusy(s, false))
		assert.True(t, eventDone(t, d, e1))
		assert.True(t, eventDone(t, d, e2))
		e3, err := d.RecordEvent(s)
		require.NoError(t, err)
		assert.True(t, eventDone(t, d, e3), "not busy any more")
	})

	t.Run("SetStreamBusy true again keeps pending work", func(t *testing.T) {
		d, s, e1, _ := busyStream(t)
		require.NoError(t, d.SetStreamBusy(s, true))
		assert.False(t, eventDone(t, d, e1))
	})

	t.Run("other streams are unaffected", func(t *testing.T) {
		d, s, e1, _ := busyStream(t)
		s2, err := d.NewStream()
		require.NoError(t, err)
		e, err := d.RecordEvent(s2)
		require.NoError(t, err)
		assert.True(t, eventDone(t, d, e))
		e0, err := d.RecordEvent(device.DefaultStream)
		require.NoError(t, err)
		assert.True(t, eventDone(t, d, e0))
		require.NoError(t, d.CompleteStream(s2))
		require.NoError(t, d.SynchronizeStream(device.DefaultStream))
		require.NoError(t, d.SetStreamBusy(s2, false))
		require.NoError(t, d.SynchronizeEvent(e))
		assert.False(t, eventDone(t, d, e1))
		require.NoError(t, d.SynchronizeStream(s))
		assert.True(t, eventDone(t, d, e1))
	})

	t.Run("a stream synchronization leaves other busy streams alone", func(t *testing.T) {
		d := newDev(t, Config{})
		s1, _ := d.NewStream()
		s2, _ := d.NewStream()
		require.NoError(t, d.SetStreamBusy(s1, true))
		require.NoError(t, d.SetStreamBusy(s2, true))
		e1, _ := d.RecordEvent(s1)
		e2, _ := d.RecordEvent(s2)
		require.NoError(t, d.SynchronizeStream(s1))
		assert.True(t, eventDone(t, d, e1))
		assert.False(t, eventDone(t, d, e2))
		require.NoError(t, d.Synchronize())
		assert.True(t, eventDone(t, d, e2))
		e3, _ := d.RecordEvent(s2)
		assert.False(t, eventDone(t, d, e3), "busy survives a synchronization")
		c := d.Counters()
		assert.Equal(t, int64(1), c.Synchronizations)
		assert.Equal(t, int64(1), c.StreamSynchronizations)
	})

	t.Run("Free does not finish held work", func(t *testing.T) {
		d, s, e1, _ := busyStream(t)
		syncs := d.Counters().Synchronizations
		p := mustMalloc(t, d, 1)
		require.NoError(t, d.Free(p))
		assert.Equal(t, syncs+1, d.Counters().Synchronizations, "free counts a synchronization")
		assert.False(t, eventDone(t, d, e1))
		assert.Equal(t, uint64(2), pending(t, d, s))
	})

	t.Run("the default stream can be busy too", func(t *testing.T) {
		d := mustNew(t, Config{Capacity: GiB})
		require.NoError(t, d.SetStreamBusy(device.DefaultStream, true))
		e, err := d.RecordEvent(device.DefaultStream)
		require.NoError(t, err)
		other, err := d.RecordEvent(device.DefaultStream)
		require.NoError(t, err)
		assert.False(t, eventDone(t, d, e))
		require.NoError(t, d.SynchronizeStream(device.DefaultStream))
		assert.True(t, eventDone(t, d, e))
		later, err := d.RecordEvent(device.DefaultStream)
		require.NoError(t, err)
		assert.False(t, eventDone(t, d, later))
		require.NoError(t, d.Synchronize())
		assert.True(t, eventDone(t, d, later))
		assert.True(t, eventDone(t, d, other))
	})
}

func TestReleasedEvent(t *testing.T) {
	d, s, e1, e2 := busyStream(t)
	require.NoError(t, d.ReleaseEvent(e1))
	assert.Equal(t, int64(1), d.Counters().EventsReleased)
	_, err := d.EventDone(e1)
	requireDeviceError(t, err, "query event", 0, device.ErrInvalidEvent)
	requireDeviceError(t, d.SynchronizeEvent(e1), "synchronize event", 0, device.ErrInvalidEvent)
	requireDeviceError(t, d.ReleaseEvent(e1), "release event", 0, device.ErrInvalidEvent)
	// The other event is untouched, and releasing finished nothing.
	assert.False(t, eventDone(t, d, e2))
	assert.Equal(t, uint64(2), pending(t, d, s))
	for _, bad := range []device.Event{0, e1, e2 + 1, 99, ^device.Event(0)} {
		before := stateOf(d)
		_, err := d.EventDone(bad)
		require.ErrorIs(t, err, device.ErrInvalidEvent, "event %d", bad)
		require.ErrorIs(t, d.SynchronizeEvent(bad), device.ErrInvalidEvent)
		require.ErrorIs(t, d.ReleaseEvent(bad), device.ErrInvalidEvent)
		requireUnchanged(t, d, before, nil)
	}
	c := d.Counters()
	assert.Equal(t, int64(2), c.EventsRecorded)
	assert.Equal(t, int64(1), c.EventsReleased)
	// Releasing did not cancel the work: the later event finishes with its
	// stream, and ids are never reused.
	require.NoError(t, d.CompleteStream(s))
	assert.True(t, eventDone(t, d, e2))
	next, err := d.RecordEvent(s)
	require.NoError(t, err)
	assert.Equal(t, device.Event(3), next, "ids are never reused")
}

// TestWaitEvent: a stream that waits for an event of a busy stream holds
// its later work until that event is done, on a stream that is not busy
// too; synchronizing the waiting stream runs the awaited work first; a
// wait on a done event, or on the stream's own event, holds nothing.
func TestWaitEvent(t *testing.T) {
	d := newDev(t, Config{})
	a, b := busyAndIdle(t, d)
	ea, err := d.RecordEvent(a) // pending: a is busy
	require.NoError(t, err)

	before, err := d.RecordEvent(b) // queued before the wait: done at once
	require.NoError(t, err)
	require.NoError(t, d.WaitEvent(b, ea))
	require.NoError(t, d.ReleaseEvent(ea), "the wait outlives the event")
	after, err := d.RecordEvent(b)
	require.NoError(t, err)
	done, err := d.EventDone(before)
	require.NoError(t, err)
	assert.True(t, done, "work queued before the wait does not wait")
	done, err = d.EventDone(after)
	require.NoError(t, err)
	assert.False(t, done, "b's later work waits for a's")
	n, _ := d.PendingWork(b)
	assert.EqualValues(t, 1, n)

	// a's work runs: b's waiting work runs with it.
	require.NoError(t, d.CompleteStream(a))
	assert.True(t, eventDone(t, d, after))

	// Synchronizing the waiting stream runs the awaited work first.
	ea2, _ := d.RecordEvent(a)
	require.NoError(t, d.WaitEvent(b, ea2))
	e3, _ := d.RecordEvent(b)
	assert.False(t, eventDone(t, d, e3))
	require.NoError(t, d.SynchronizeStream(b))
	assert.True(t, eventDone(t, d, ea2), "a ran: b waited for it")
	assert.True(t, eventDone(t, d, e3))

	// Chains: c waits for b, which waits for a.
	c, _ := d.NewStream()
	ea3, _ := d.RecordEvent(a)
	require.NoError(t, d.WaitEvent(b, ea3))
	eb, _ := d.RecordEvent(b)
	require.NoError(t, d.WaitEvent(c, eb))
	ec, _ := d.RecordEvent(c)
	assert.False(t, eventDone(t, d, ec))
	require.NoError(t, d.SynchronizeEvent(ec))
	for _, e := range []device.Event{ea3, eb, ec} {
		assert.True(t, eventDone(t, d, e), "event %d", e)
	}

	// Nothing to wait for: done events, own events.
	ea4, _ := d.RecordEvent(a)
	require.NoError(t, d.WaitEvent(a, ea4))
	require.NoError(t, d.SynchronizeEvent(ea4))
	require.NoError(t, d.WaitEvent(b, ea4))
	e5, _ := d.RecordEvent(b)
	assert.True(t, eventDone(t, d, e5))

	// A device-wide synchronization ends every wait.
	ea5, _ := d.RecordEvent(a)
	require.NoError(t, d.WaitEvent(b, ea5))
	require.NoError(t, d.Synchronize())
	e6, _ := d.RecordEvent(b)
	assert.True(t, eventDone(t, d, e6))
	assert.EqualValues(t, 7, d.Counters().EventWaits)

	before2 := stateOf(d)
	assert.ErrorIs(t, d.WaitEvent(99, e6), device.ErrInvalidStream)
	assert.ErrorIs(t, d.WaitEvent(b, 1<<40), device.ErrInvalidEvent)
	requireUnchanged(t, d, before2, nil)
}

// TestWaitStream: a stream that waits for a busy stream holds its later
// work until the work queued on that stream before the wait has run, and
// no more: work queued there after the wait does not hold it. No event is
// left in the table, and a wait on the stream itself holds nothing.
func TestWaitStream(t *testing.T) {
	d := newDev(t, Config{})
	a, b := busyAndIdle(t, d)
	c0 := d.Counters()

	require.NoError(t, d.WaitStream(b, a))
	eb, err := d.RecordEvent(b)
	require.NoError(t, err)
	assert.False(t, eventDone(t, d, eb), "b's later work waits for a's")
	n, _ := d.PendingWork(a)
	assert.EqualValues(t, 1, n, "the wait's record is a's pending work")
	c1 := d.Counters()
	assert.EqualValues(t, 1, c1.StreamWaits-c0.StreamWaits)
	assert.Zero(t, c1.EventWaits-c0.EventWaits)
	assert.EqualValues(t, 1, c1.EventsRecorded-c0.EventsRecorded, "b's event only")
	assert.Equal(t, 1, d.events.len(), "the wait leaves no event behind")

	// Work queued on a after the wait does not hold b: running a's
	// first unit (the wait's record) is enough.
	ea, _ := d.RecordEvent(a)
	require.NoError(t, d.SynchronizeEvent(eb))
	assert.False(t, eventDone(t, d, ea), "a's later work still pending")
	assert.True(t, eventDone(t, d, eb))

	// A stream waiting on itself, or on one with nothing pending, holds
	// nothing.
	require.NoError(t, d.WaitStream(b, b))
	require.NoError(t, d.CompleteStream(a))
	require.NoError(t, d.SetStreamBusy(a, false))
	require.NoError(t, d.WaitStream(b, a))
	assert.True(t, eventDone(t, d, recordOn(t, d, b)))
	assert.EqualValues(t, 3, d.Counters().StreamWaits-c0.StreamWaits)

	// The clock charges a record and a wait.
	costs := d.Costs()
	before := d.Clock()
	require.NoError(t, d.WaitStream(b, a))
	assert.Equal(t, costs.EventRecord+costs.EventWait, d.Clock()-before)

	before2 := stateOf(d)
	assert.ErrorIs(t, d.WaitStream(99, a), device.ErrInvalidStream)
	assert.ErrorIs(t, d.WaitStream(b, 99), device.ErrInvalidStream)
	requireUnchanged(t, d, before2, nil)
}

// TestPassedWaitRunsTheWorkItHeld: a stream that is not busy, held by a
// wait for a busy stream, with more work recorded after that wait, runs
// that work once a wait is passed on its behalf: CompleteStream, or
// SynchronizeEvent, of a third stream that waits for it finishes the busy
// stream's awaited work, passes the wait, and leaves no wait at all. (The
// device model's state machine found it: the held stream's later event
// stayed pending, because the settle after the run looked only while
// waits were left.)
func TestPassedWaitRunsTheWorkItHeld(t *testing.T) {
	for _, how := range []string{"complete stream", "synchronize event"} {
		t.Run(how, func(t *testing.T) {
			d := newDev(t, Config{})
			a, b := busyAndIdle(t, d)
			c, err := d.NewStream()
			require.NoError(t, err)
			require.NoError(t, d.WaitStream(b, a)) // b waits for busy a
			require.NoError(t, d.WaitStream(c, b)) // c waits for b
			eb := recordOn(t, d, b)                // b's work after its wait
			ec := recordOn(t, d, c)
			require.False(t, eventDone(t, d, eb))
			require.False(t, eventDone(t, d, ec))
			if how == "complete stream" {
				require.NoError(t, d.CompleteStream(c))
			} else {
				require.NoError(t, d.SynchronizeEvent(ec))
			}
			assert.True(t, eventDone(t, d, ec))
			assert.True(t, eventDone(t, d, eb), "b is not busy and waits for nothing now")
			assert.Zero(t, pending(t, d, b))
			assert.Zero(t, pending(t, d, c))
			assert.Zero(t, pending(t, d, a), "a's awaited work ran, and a has no other")
		})
	}
}

// busyAndIdle makes two streams, the first busy.
func busyAndIdle(t *testing.T, d *Device) (busy, idle device.Stream) {
	t.Helper()
	busy, err := d.NewStream()
	require.NoError(t, err)
	idle, err = d.NewStream()
	require.NoError(t, err)
	require.NoError(t, d.SetStreamBusy(busy, true))
	return busy, idle
}

func recordOn(t *testing.T, d *Device, s device.Stream) device.Event {
	t.Helper()
	e, err := d.RecordEvent(s)
	require.NoError(t, err)
	return e
}

func TestProgressed(t *testing.T) {
	d, err := New(Config{})
	require.NoError(t, err)
	var _ device.ProgressReporter = d
	s1, _ := d.NewStream()
	s2, _ := d.NewStream()
	require.NoError(t, d.SetStreamBusy(s1, true))
	require.NoError(t, d.SetStreamBusy(s2, true))
	collect := func(mark uint64) ([]device.Stream, uint64, bool) {
		var got []device.Stream
		now, ok := d.Progressed(mark, func(s device.Stream) { got = append(got, s) })
		return got, now, ok
	}
	_, mark, ok := collect(0)
	require.True(t, ok)
	_, _ = d.RecordEvent(s1)
	_, _ = d.RecordEvent(s2)
	got, mark2, ok := collect(mark)
	require.True(t, ok)
	assert.Empty(t, got, "busy streams ran nothing")
	assert.Equal(t, mark, mark2)
	require.NoError(t, d.CompleteStream(s2))
	got, mark, ok = collect(mark2)
	require.True(t, ok)
	assert.Equal(t, []device.Stream{s2}, got)
	require.NoError(t, d.Synchronize())
	got, _, ok = collect(mark)
	require.True(t, ok)
	assert.Equal(t, []device.Stream{s1}, got, "s2 had nothing left to run")
	for range maxProgressLog + 1 { // the log starts again: an old mark no longer answers
		_, _, _ = collect(mark2) // a caller asking: each progress is a new entry
		_, _ = d.RecordEvent(s1)
		require.NoError(t, d.CompleteStream(s1))
		_, _ = d.RecordEvent(s2)
		require.NoError(t, d.CompleteStream(s2))
	}
	_, _, ok = collect(mark)
	assert.False(t, ok, "too old")
	_, _, ok = collect(1 << 62)
	assert.False(t, ok, "not a mark of this device")
}

// TestProgressAfterAnAnswerIsReported: a stream whose newest entry in the
// log is older than a caller's mark is logged again when it runs more work
// (the log used to skip a stream that was its last entry, so that a caller
// that had asked since never heard of the new work), and a stream that
// runs again before anyone asked is not logged twice.
func TestProgressAfterAnAnswerIsReported(t *testing.T) {
	d, err := New(Config{})
	require.NoError(t, err)
	s, _ := d.NewStream()
	_, _ = d.RecordEvent(s) // done at once: logged
	var got []device.Stream
	mark, ok := d.Progressed(0, func(x device.Stream) { got = append(got, x) })
	require.True(t, ok)
	require.Equal(t, []device.Stream{s}, got)

	require.NoError(t, d.SetStreamBusy(s, true))
	e, _ := d.RecordEvent(s)
	require.NoError(t, d.CompleteStream(s))
	got = nil
	mark2, ok := d.Progressed(mark, func(x device.Stream) { got = append(got, x) })
	require.True(t, ok)
	assert.Equal(t, []device.Stream{s}, got, "s ran event %d after the mark", e)

	for range 10 { // no one asks in between: one entry
		_, _ = d.RecordEvent(s)
		require.NoError(t, d.CompleteStream(s))
	}
	got = nil
	mark3, ok := d.Progressed(mark2, func(x device.Stream) { got = append(got, x) })
	require.True(t, ok)
	assert.Equal(t, []device.Stream{s}, got)
	assert.Equal(t, mark2+1, mark3)
}

// TestSynchronizeVisitsPendingStreams: a Synchronize visits the streams
// left with work since the last one, not every stream the device made.
// Each of n new streams gets one held event and a Synchronize: n visits in
// all, where a walk of every stream would make n(n+1)/2 (the trace of a
// stream per allocation was quadratic so). While a stream waits on
// another's event, every stream is visited.
func TestSynchronizeVisitsPendingStreams(t *testing.T) {
	const n = 1000
	d := newDev(t, Config{})
	for range n {
		s, err := d.NewStream()
		require.NoError(t, err)
		require.NoError(t, d.SetStreamBusy(s, true))
		_, err = d.RecordEvent(s)
		require.NoError(t, err)
		require.NoError(t, d.SetStreamBusy(s, false))
		require.NoError(t, d.Synchronize())
	}
	assert.EqualValues(t, n, d.Counters().StreamVisits, "one visit per stream with work")
	require.NoError(t, d.Synchronize())
	assert.EqualValues(t, n, d.Counters().StreamVisits, "nothing pending, nothing visited")

	// A wait: every stream (n and the default one) is visited once.
	a, err := d.NewStream()
	require.NoError(t, err)
	require.NoError(t, d.SetStreamBusy(a, true))
	e, err := d.RecordEvent(a)
	require.NoError(t, err)
	require.NoError(t, d.WaitEvent(device.DefaultStream, e))
	require.NoError(t, d.Synchronize())
	assert.EqualValues(t, n+n+2, d.Counters().StreamVisits)
}

// TestStreamWaitsArray: the waits of a stream keep their order through
// passes and pushes, the array starts over once every wait is passed,
// and a push that would grow it moves the waits left to the front.
func TestStreamWaitsArray(t *testing.T) {
	var st streamState
	for i := range 4 {
		st.pushWait(streamWait{pos: uint64(i)})
	}
	st.popWait()
	st.popWait()
	c := cap(st.waits)
	for i := 4; len(st.waits) < c; i++ {
		st.pushWait(streamWait{pos: uint64(i)})
	}
	st.pushWait(streamWait{pos: 99}) // full: moves the two left to the front
	assert.Equal(t, 0, st.head)
	assert.Equal(t, c, cap(st.waits), "room made without growing")
	var got []uint64
	for st.hasWaits() {
		got = append(got, st.waits[st.head].pos)
		st.popWait()
	}
	assert.Equal(t, uint64(2), got[0])
	assert.Equal(t, uint64(99), got[len(got)-1])
	for i := 1; i < len(got)-1; i++ {
		assert.Equal(t, got[i-1]+1, got[i])
	}
	assert.Equal(t, 0, st.head)
	assert.Empty(t, st.waits)
	assert.Equal(t, c, cap(st.waits), "the array is kept")
}
