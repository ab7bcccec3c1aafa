// Package deferred holds the queue of frees that wait for device work: the
// one mechanism behind RecordStream in both of gpumem's allocators (device
// memory in package allocator, pinned host memory in allocator/host).
//
// # Model
//
// A caller frees memory that work queued on other streams may still be
// using. Record records one device event on each of those streams and files
// it, with the item it guards, in that stream's queue. Events of one stream
// complete in the order they were recorded, so a queue is read from the
// front only: Poll asks the device about the front events of each stream
// and completes those that are done, stopping at the first that is not;
// Drain waits for every event. When the device tells which streams ran
// work (device.ProgressReporter), Poll asks about the streams that did
// since the last Poll, that have new events, or whose last query failed,
// and no other: an event not done at one Poll can be done at the next only
// if its stream ran, so the answers, and what completes, are the same as
// asking every stream, at a cost that follows what ran. Completing an event calls the caller's
// function with the item; an item recorded on several streams is completed
// once per event, and the caller counts (each allocator keeps a count of
// outstanding events on its block and finishes the free at zero).
//
// # Policy on device failures
//
//   - An event that cannot be recorded: the events already recorded for the
//     item are released and every stream it was used on is synchronized
//     instead, which proves the work finished just as well; Record then
//     returns 0 and the caller completes the free at once. Only when a
//     synchronization fails too does Record return an error, and then
//     nothing has been queued: the caller's free fails and changes nothing.
//   - A query that fails counts as "not done": the item stays pending,
//     which is safe, and the next Poll asks again.
//   - A wait that fails (Drain) leaves that event, and those after it on its
//     stream, queued; the error is returned.
//   - An event that cannot be released after completing is kept and its
//     release retried by every later Poll and Drain, so that no event
//     handle is lost to a passing failure.
//
// A Queue is not safe for concurrent use: its owner guards it with its own
// lock and calls the device with that lock held.
package deferred

import (
	"errors"
	"fmt"
	"iter"
	"slices"

	"github.com/gpumem/gpumem/device"
)

// Queue holds the pending events of one device, per stream. The zero
// Queue is not usable; make one with New. T is what an event guards (a
// block).
type Queue[T any] struct {
	dev device.Device
	// streams holds one queue per stream with events outstanding, sorted
	// by stream. Invariant: no queue is empty after Poll or Drain returns.
	streams []*streamQueue[T]
	// With a device that reports progress: due lists the queues the next
	// Poll asks about (each marked due), and mark is the device's mark of
	// the last Poll (marked once there was one).
	prog    device.ProgressReporter
	due     []*streamQueue[T]
	mark    uint64
	marked  bool
	n       int            // events outstanding over all streams
	spare   []device.Event // completed events whose release failed, to retry
	scratch []device.Event // events recorded by the Record in progress
	// free holds the stream queues compact took out of streams, empty,
	// each with its array kept, for push to reuse: a stream whose queue
	// empties and fills again, the common case, allocates nothing.
	free []*streamQueue[T]
	// emptied is set by pop when a queue empties, for compact.
	emptied bool
	// progressed is q.markProgressed, bound once by New so that Poll
	// hands the device no new closure each time.
	progressed func(device.Stream)
}

type streamQueue[T any] struct {
	stream  device.Stream
	entries []entry[T] // oldest first, from head
	head    int
	due     bool // in Queue.due
}

type entry[T any] struct {
	ev   device.Event
	item T
}

// New returns an empty queue for dev.
func New[T any](dev device.Device) *Queue[T] {
	q := &Queue[T]{dev: dev}
	q.prog, _ = dev.(device.ProgressReporter)
	q.progressed = q.markProgressed
	return q
}

// Len returns the number of events outstanding.
func (q *Queue[T]) Len() int { return q.n }

// Record records an event on each stream of streams, for item, and returns
// how many it queued: len(streams), or 0 when the device could not record
// an event and the streams were synchronized instead (see the package
// doc). On an error nothing is queued.
func (q *Queue[T]) Record(item T, streams []device.Stream) (int, error) {
	evs := q.scratch[:0]
	defer func() { clear(evs); q.scratch = evs[:0] }()
	for _, s := range streams {
		ev, err := q.dev.RecordEvent(s)
		if err != nil {
			for _, e := range evs {
				q.release(e)
			}
			for _, s2 := range streams {
				if serr := q.dev.SynchronizeStream(s2); serr != nil {
					return 0, fmt.Errorf("recording an event on stream %d: %w (synchronizing stream %d instead failed too: %v)", s, err, s2, serr)
				}
			}
			return 0, nil
		}
		evs = append(evs, ev)
	}
	for i, s := range streams {
		q.push(s, entry[T]{ev: evs[i], item: item})
	}
	return len(streams), nil
}

// push files e at the back of stream s's queue.
func (q *Queue[T]) push(s device.Stream, e entry[T]) {
	i, found := q.find(s)
	if !found {
		q.streams = slices.Insert(q.streams, i, q.newStreamQueue(s))
	}
	sq := q.streams[i]
	sq.entries = append(sq.entries, e)
	q.n++
	if q.prog != nil {
		q.markDue(sq) // the event may be done already
	}
}

// newStreamQueue returns an empty queue for stream s, one of free if
// there is one.
func (q *Queue[T]) newStreamQueue(s device.Stream) *streamQueue[T] {
	n := len(q.free)
	if n == 0 {
		return &streamQueue[T]{stream: s}
	}
	sq := q.free[n-1]
	q.free[n-1] = nil
	q.free = q.free[:n-1]
	sq.stream = s
	return sq
}

// find returns the place of stream s's queue in q.streams, or where it
// would go.
func (q *Queue[T]) find(s device.Stream) (int, bool) {
	lo, hi := 0, len(q.streams)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if q.streams[m].stream < s {
			lo = m + 1
		} else {
			hi = m
		}
	}
	return lo, lo < len(q.streams) && q.streams[lo].stream == s
}

// markDue lists sq for the next Poll.
func (q *Queue[T]) markDue(sq *streamQueue[T]) {
	if !sq.due {
		sq.due = true
		q.due = append(q.due, sq)
	}
}

// Poll completes the events that are done, calling done with the item of
// each, oldest first on each stream.
func (q *Queue[T]) Poll(done func(T)) {
	q.retryReleases()
	if q.n == 0 {
		// Nothing to complete, and no queue is listed (an empty queue is
		// in free, and due is empty after Poll and Drain). The device's
		// progress until the next event concerns none: push lists the
		// queue of each new event, and a mark left behind only makes a
		// later Poll ask more.
		return
	}
	if q.prog == nil {
		for _, sq := range q.streams {
			q.poll(sq, done)
		}
		q.compact()
		return
	}
	// The mark is taken before the queries: what runs after it is
	// reported to the next Poll.
	now, ok := q.prog.Progressed(q.mark, q.progressed)
	if !ok || !q.marked {
		for _, sq := range q.streams {
			q.markDue(sq)
		}
	}
	q.mark, q.marked = now, true
	list := q.due
	q.due = nil
	for _, sq := range list {
		sq.due = false
		if !q.poll(sq, done) {
			q.markDue(sq) // a query failed: ask again
		}
	}
	clear(list)
	if q.due == nil {
		q.due = list[:0] // keep the array
	}
	q.compact()
}

// markProgressed lists the queue of stream s, if it has one, for the
// Poll in progress.
func (q *Queue[T]) markProgressed(s device.Stream) {
	if i, found := q.find(s); found {
		q.markDue(q.streams[i])
	}
}

// poll completes the front events of sq that are done, and reports
// whether every query succeeded.
func (q *Queue[T]) poll(sq *streamQueue[T], done func(T)) bool {
	for sq.head < len(sq.entries) {
		ok, err := q.dev.EventDone(sq.entries[sq.head].ev)
		if err != nil {
			return false
		}
		if !ok {
			break
		}
		q.pop(sq, done)
	}
	return true
}

// Drain waits for every event and completes it, calling done with its
// item. An event whose wait fails stays queued with those after it on its
// stream, and is asked about by the next Poll; the errors are returned
// together.
func (q *Queue[T]) Drain(done func(T)) error {
	q.retryReleases()
	var errs []error
	for _, sq := range q.streams {
		for sq.head < len(sq.entries) {
			if err := q.dev.SynchronizeEvent(sq.entries[sq.head].ev); err != nil {
				errs = append(errs, fmt.Errorf("waiting for stream %d: %w", sq.stream, err))
				if q.prog != nil {
					q.markDue(sq)
				}
				break
			}
			q.pop(sq, done)
		}
	}
	q.compact()
	// Drop the queues it emptied from the list of the next Poll.
	q.due = slices.DeleteFunc(q.due, func(sq *streamQueue[T]) bool {
		if sq.head == len(sq.entries) {
			sq.due = false
			return true
		}
		return false
	})
	return errors.Join(errs...)
}

// pop completes the front event of sq.
func (q *Queue[T]) pop(sq *streamQueue[T], done func(T)) {
	e := sq.entries[sq.head]
	sq.entries[sq.head] = entry[T]{}
	sq.head++
	q.n--
	switch {
	case sq.head == len(sq.entries):
		q.emptied = true // compact moves it to free
	case sq.head > 64 && sq.head*2 > len(sq.entries):
		// Reclaim the consumed front of a long queue.
		n := copy(sq.entries, sq.entries[sq.head:])
		clear(sq.entries[n:])
		sq.entries = sq.entries[:n]
		sq.head = 0
	}
	q.release(e.ev)
	done(e.item)
}

// release destroys a completed event, keeping it for a later try if the
// device refuses.
func (q *Queue[T]) release(ev device.Event) {
	if err := q.dev.ReleaseEvent(ev); err != nil {
		q.spare = append(q.spare, ev)
	}
}

// Release destroys ev, an event its caller recorded and no longer needs
// (one that guarded nothing in the queue); if the device refuses, the
// event is kept and its release retried by every later Poll and Drain,
// as for the queue's own events.
func (q *Queue[T]) Release(ev device.Event) { q.release(ev) }

func (q *Queue[T]) retryReleases() {
	if len(q.spare) == 0 {
		return
	}
	q.spare = slices.DeleteFunc(q.spare, func(ev device.Event) bool {
		return q.dev.ReleaseEvent(ev) == nil
	})
}

// Unreleased returns the number of completed events whose release the
// device refused and that wait for a retry.
func (q *Queue[T]) Unreleased() int { return len(q.spare) }

// compact moves the stream queues pop emptied to free; it looks at the
// queues only when pop said one emptied. An emptied queue's entries were
// zeroed by pop, so its array holds no item.
func (q *Queue[T]) compact() {
	if !q.emptied {
		return
	}
	q.emptied = false
	q.streams = slices.DeleteFunc(q.streams, func(sq *streamQueue[T]) bool {
		if sq.head == len(sq.entries) {
			sq.entries, sq.head = sq.entries[:0], 0
			q.free = append(q.free, sq)
			return true
		}
		return false
	})
}

// Items yields the item of every outstanding event (an item recorded on
// several streams once per event), stream by stream, for invariant checks
// and error messages.
func (q *Queue[T]) Items() iter.Seq[T] {
	return func(yield func(T) bool) {
		for _, sq := range q.streams {
			for _, e := range sq.entries[sq.head:] {
				if !yield(e.item) {
					return
				}
			}
		}
	}
}
