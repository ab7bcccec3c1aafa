package deferred

import (
	"errors"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/device/sim"
	"github.com/gpumem/gpumem/internal/simtest"
)

// flaky is a simulated device whose event calls can be made to fail.
type flaky struct {
	*sim.Device
	failRecord, failRelease, failSync, failWait bool
	released                                    int
}

var errInjected = errors.New("injected")

func (f *flaky) RecordEvent(s device.Stream) (device.Event, error) {
	if f.failRecord {
		return 0, errInjected
	}
	return f.Device.RecordEvent(s)
}

func (f *flaky) ReleaseEvent(e device.Event) error {
	if f.failRelease {
		return errInjected
	}
	f.released++
	return f.Device.ReleaseEvent(e)
}

func (f *flaky) SynchronizeStream(s device.Stream) error {
	if f.failSync {
		return errInjected
	}
	return f.Device.SynchronizeStream(s)
}

func (f *flaky) SynchronizeEvent(e device.Event) error {
	if f.failWait {
		return errInjected
	}
	return f.Device.SynchronizeEvent(e)
}

func newFlaky(t *testing.T) (*flaky, device.Stream, device.Stream) {
	d := simtest.New(t)
	s1, _ := d.NewStream()
	s2, _ := d.NewStream()
	require.NoError(t, d.SetStreamBusy(s1, true))
	require.NoError(t, d.SetStreamBusy(s2, true))
	return &flaky{Device: d}, s1, s2
}

func TestEventsCompleteInStreamOrder(t *testing.T) {
	f, s1, s2 := newFlaky(t)
	q := New[string](f)
	n, err := q.Record("a", []device.Stream{s1, s2})
	require.NoError(t, err)
	assert.Equal(t, 2, n)
	_, _ = q.Record("b", []device.Stream{s1})
	assert.Equal(t, 3, q.Len())
	assert.Equal(t, []string{"a", "b", "a"}, slices.Collect(q.Items()))

	var done []string
	collect := func(s string) { done = append(done, s) }
	q.Poll(collect)
	assert.Empty(t, done, "busy streams: nothing is done")

	require.NoError(t, f.CompleteStream(s1))
	q.Poll(collect)
	assert.Equal(t, []string{"a", "b"}, done, "stream 1's events, oldest first")
	assert.Equal(t, 1, q.Len())

	require.NoError(t, q.Drain(collect))
	assert.Equal(t, []string{"a", "b", "a"}, done)
	assert.Zero(t, q.Len())
	assert.Empty(t, q.streams, "empty stream queues are dropped")
	assert.Equal(t, 3, f.released)
}

func TestRecordFailureSynchronizesInstead(t *testing.T) {
	f, s1, s2 := newFlaky(t)
	q := New[int](f)
	f.failRecord = true
	n, err := q.Record(7, []device.Stream{s1, s2})
	require.NoError(t, err)
	assert.Zero(t, n, "nothing queued: the streams were synchronized")
	assert.Zero(t, q.Len())
	w, _ := f.PendingWork(s1)
	assert.Zero(t, w, "stream 1 was synchronized")
}

func TestRecordFailureReleasesWhatItRecorded(t *testing.T) {
	f, s1, _ := newFlaky(t)
	bad, _ := f.NewStream()
	q := New[int](f)
	// The second stream is unknown to the device: its record fails after
	// the first succeeded, and synchronizing it fails too.
	n, err := q.Record(7, []device.Stream{s1, bad + 100})
	require.Error(t, err)
	assert.Zero(t, n)
	assert.Zero(t, q.Len(), "nothing is queued on an error")
	assert.Equal(t, 1, f.released, "the event recorded on stream 1 was released")
}

func TestFailedReleaseIsRetried(t *testing.T) {
	f, s1, _ := newFlaky(t)
	q := New[int](f)
	_, _ = q.Record(1, []device.Stream{s1})
	require.NoError(t, f.CompleteStream(s1))
	f.failRelease = true
	var done []int
	q.Poll(func(i int) { done = append(done, i) })
	assert.Equal(t, []int{1}, done, "the item completes even if its event cannot be released")
	assert.Equal(t, 1, q.Unreleased())
	f.failRelease = false
	q.Poll(func(int) {})
	assert.Zero(t, q.Unreleased(), "the release was retried")
	assert.Equal(t, 1, f.released)
}

func TestReleaseOfACallersEventIsRetried(t *testing.T) {
	f, s1, _ := newFlaky(t)
	q := New[int](f)
	ev, err := f.RecordEvent(s1)
	require.NoError(t, err)
	f.failRelease = true
	q.Release(ev)
	assert.Equal(t, 1, q.Unreleased(), "kept for a retry")
	assert.Zero(t, q.Len(), "it guards nothing")
	f.failRelease = false
	require.NoError(t, q.Drain(func(int) {}))
	assert.Zero(t, q.Unreleased(), "the release was retried")
	assert.Equal(t, 1, f.released)
}

func TestFailedWaitKeepsTheEvent(t *testing.T) {
	f, s1, _ := newFlaky(t)
	q := New[int](f)
	_, _ = q.Record(1, []device.Stream{s1})
	f.failWait = true
	err := q.Drain(func(int) { t.Fatal("completed an event whose wait failed") })
	require.ErrorIs(t, err, errInjected)
	assert.Equal(t, 1, q.Len())
	f.failWait = false
	count := 0
	require.NoError(t, q.Drain(func(int) { count++ }))
	assert.Equal(t, 1, count)
}

func TestQueryFailureCountsAsNotDone(t *testing.T) {
	f, s1, _ := newFlaky(t)
	q := New[int](f)
	_, _ = q.Record(1, []device.Stream{s1})
	require.NoError(t, f.CompleteStream(s1))
	f.FailEventQueries(errInjected)
	q.Poll(func(int) { t.Fatal("completed an event whose query failed") })
	assert.Equal(t, 1, q.Len())
	f.FailEventQueries(nil)
	count := 0
	q.Poll(func(int) { count++ })
	assert.Equal(t, 1, count)
}

func TestLongQueueCompacts(t *testing.T) {
	f, s1, _ := newFlaky(t)
	q := New[int](f)
	for i := range 200 {
		_, _ = q.Record(i, []device.Stream{s1})
	}
	require.NoError(t, f.CompleteStream(s1))
	_, _ = q.Record(200, []device.Stream{s1}) // recorded after the completion: not done
	got := 0
	q.Poll(func(int) { got++ })
	assert.Equal(t, 200, got)
	require.Len(t, q.streams, 1)
	// pop reclaims the consumed front once it is past 64 entries and half
	// the queue: 101 popped of 201, then 65 of 100, leaving 34 of 35.
	assert.Equal(t, 34, q.streams[0].head, "the consumed front was reclaimed")
	assert.Len(t, q.streams[0].entries, 35)
	assert.Equal(t, []int{200}, slices.Collect(q.Items()))
}

func TestEmptiedQueuesAreReused(t *testing.T) {
	f, s1, s2 := newFlaky(t)
	q := New[string](f)
	_, _ = q.Record("a", []device.Stream{s1})
	first := q.streams[0]
	require.NoError(t, f.CompleteStream(s1))
	var done []string
	q.Poll(func(s string) { done = append(done, s) })
	require.Equal(t, []string{"a"}, done)
	require.Empty(t, q.streams)
	require.Equal(t, []*streamQueue[string]{first}, q.free, "the emptied queue is kept")

	_, _ = q.Record("b", []device.Stream{s2})
	_, _ = q.Record("c", []device.Stream{s2})
	require.Len(t, q.streams, 1)
	assert.Same(t, first, q.streams[0], "another stream's queue reuses it")
	assert.Equal(t, s2, q.streams[0].stream)
	assert.Empty(t, q.free)
	assert.Equal(t, []string{"b", "c"}, slices.Collect(q.Items()))
	q.Poll(func(s string) { done = append(done, s) })
	assert.Equal(t, []string{"a"}, done, "stream 2 is busy: nothing more is done")
	require.NoError(t, f.CompleteStream(s2))
	q.Poll(func(s string) { done = append(done, s) })
	assert.Equal(t, []string{"a", "b", "c"}, done)
}

func TestQueueWithoutProgressKeepsNoDueList(t *testing.T) {
	d := simtest.New(t)
	s1, _ := d.NewStream()
	s2, _ := d.NewStream()
	q := New[int](struct{ device.Device }{d}) // hides device.ProgressReporter
	require.Nil(t, q.prog)
	got := 0
	for i := range 100 {
		_, _ = q.Record(i, []device.Stream{[]device.Stream{s1, s2}[i%2]})
		q.Poll(func(int) { got++ })
	}
	assert.Equal(t, 100, got)
	assert.Empty(t, q.due, "Poll asks every queue; nothing lists them")
	assert.LessOrEqual(t, len(q.free), 1)
}

// asking counts the device's Progressed calls.
type asking struct {
	*sim.Device
	asked int
}

func (a *asking) Progressed(mark uint64, f func(device.Stream)) (uint64, bool) {
	a.asked++
	return a.Device.Progressed(mark, f)
}

func TestEmptyQueuePollsNothing(t *testing.T) {
	f, s1, s2 := newFlaky(t)
	a := &asking{Device: f.Device}
	q := New[string](a)
	q.Poll(func(string) { t.Fatal("nothing is queued") })
	assert.Zero(t, a.asked, "an empty queue does not ask the device")

	_, _ = q.Record("a", []device.Stream{s1})
	var done []string
	q.Poll(func(s string) { done = append(done, s) })
	assert.Empty(t, done)
	assert.Equal(t, 1, a.asked)
	require.NoError(t, f.CompleteStream(s1))
	q.Poll(func(s string) { done = append(done, s) })
	require.Equal(t, []string{"a"}, done)

	// s2 runs work while the queue is empty and unasked; an event
	// recorded later on s2 is still seen done once it is.
	require.NoError(t, f.SetStreamBusy(s2, false))
	q.Poll(func(string) { t.Fatal("nothing is queued") })
	asked := a.asked
	_, _ = q.Record("b", []device.Stream{s2})
	q.Poll(func(s string) { done = append(done, s) })
	assert.Equal(t, []string{"a", "b"}, done)
	assert.Equal(t, asked+1, a.asked)
	assert.Zero(t, q.Len())
}
