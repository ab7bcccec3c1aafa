// Streams and events: a queue position per stream, and a test's control
// over when queued work finishes.

package sim

import "github.com/gpumem/gpumem/device"

// streamState is one stream's queue. The only work the simulation knows
// about is recorded events, so a queue is two positions: how many events
// were recorded on it and how many of those have finished (a prefix, since
// a stream runs its work in order); WaitStream's record on the awaited
// stream and the stream-ordered pool's frees count as events here.
// WaitEvent and WaitStream add waits: the stream's work past a wait's
// position runs only once the awaited work of another stream has run.
type streamState struct {
	busy      bool         // recorded work stays pending until completed
	queued    uint64       // events recorded so far
	completed uint64       // events finished; completed <= queued
	waits     []streamWait // waits[head:]: waits not yet passed, by position
	head      int          // waits[:head] are passed; 0 when none is left
	listed    bool         // in Device.unfinished
	logged    uint64       // 1 + the mark of the stream's newest entry in Device.progress; 0: none
	external  uintptr      // the name it was adopted under (AdoptStreamHandle); 0 for NewStream's
	released  bool         // an adopted stream released: its handle is invalid
}

// streamWait holds the work of a stream after its first pos events until
// stream dep has finished seq events.
type streamWait struct {
	pos, seq uint64
	dep      int
}

// hasWaits reports whether the stream has waits not yet passed.
func (st *streamState) hasWaits() bool { return st.head < len(st.waits) }

// popWait passes the stream's first wait. The stream's waits keep one
// array: it starts over once every wait is passed, and an append that
// would grow it moves the waits left to the front first.
func (st *streamState) popWait() {
	st.head++
	if st.head == len(st.waits) {
		st.clearWaits()
	}
}

// clearWaits drops every wait of the stream.
func (st *streamState) clearWaits() { st.waits, st.head = st.waits[:0], 0 }

// pushWait adds w after the stream's other waits.
func (st *streamState) pushWait(w streamWait) {
	if st.head > 0 && len(st.waits) == cap(st.waits) {
		st.waits = st.waits[:copy(st.waits, st.waits[st.head:])]
		st.head = 0
	}
	st.waits = append(st.waits, w)
}

// waitLocked makes the work queued on stream i from now on wait until
// stream dep has finished its first seq events: nothing if dep is i or
// has finished them.
func (d *Device) waitLocked(i, dep int, seq uint64) {
	if st := &d.streams[i]; dep != i && d.streams[dep].completed < seq {
		st.pushWait(streamWait{pos: st.queued, seq: seq, dep: dep})
		d.waits++
	}
}

// finishLocked runs the work of stream i up to its first upTo events, and
// first the awaited work of other streams that this work waits for. A
// wait can only name work recorded before it, so the recursion ends.
func (d *Device) finishLocked(i int, upTo uint64) {
	st := &d.streams[i]
	if st.completed < upTo {
		d.progressedLocked(i)
	}
	for st.completed < upTo {
		if st.hasWaits() && st.waits[st.head].pos < upTo {
			w := st.waits[st.head]
			st.completed = max(st.completed, w.pos)
			d.finishLocked(w.dep, w.seq)
			st.popWait()
			d.waits--
			continue
		}
		st.completed = upTo
	}
}

// settleLocked lets every stream that is not busy run as far as its waits
// allow, until nothing moves. Without waits every such stream has finished
// already, unless passed: a wait was just passed (finishLocked) that may
// have held the rest of a stream's work, which then runs though no wait is
// left.
func (d *Device) settleLocked(passed bool) {
	for moved := passed || d.waits > 0; moved; {
		moved = false
		for i := range d.streams {
			st := &d.streams[i]
			for !st.busy && st.completed < st.queued {
				if st.hasWaits() {
					w := st.waits[st.head]
					if d.streams[w.dep].completed < w.seq {
						if w.pos > st.completed {
							st.completed, moved = w.pos, true
							d.progressedLocked(i)
						}
						break
					}
					st.popWait()
					d.waits--
					continue
				}
				st.completed, moved = st.queued, true
				d.progressedLocked(i)
			}
		}
	}
}

// maxProgressLog bounds the log of streams that ran work (Progressed):
// past it the log starts again, and a caller whose mark is older than the
// log's start asks about every stream.
const maxProgressLog = 4096

// progressedLocked logs that stream i finished more of its work. The
// stream's newest entry stands for this progress too when it is still in
// the log and no caller has a mark past it (no Progressed answered since
// it was logged; every mark a caller holds is at most progressAsked), so
// a stream has at most one entry between two calls of Progressed.
func (d *Device) progressedLocked(i int) {
	st := &d.streams[i]
	if st.logged > d.progressAsked && st.logged > d.progressBase {
		return
	}
	n := len(d.progress)
	if n == maxProgressLog {
		d.progressBase += uint64(n)
		d.progress = d.progress[:0]
	}
	d.progress = append(d.progress, int32(i))
	st.logged = d.progressBase + uint64(len(d.progress))
}

// Progressed calls f on each stream that finished more of its work since
// mark, and returns the mark of now (device.ProgressReporter). It is a
// query of the simulation: it costs and counts nothing.
func (d *Device) Progressed(mark uint64, f func(device.Stream)) (now uint64, ok bool) {
	d.mu.Lock()
	now = d.progressBase + uint64(len(d.progress))
	d.progressAsked = now
	if mark < d.progressBase || mark > now {
		d.mu.Unlock()
		return now, false
	}
	if mark == now { // nothing ran since: the common answer
		d.mu.Unlock()
		return now, true
	}
	d.progressedSince(mark, f) // unlocks d.mu
	return now, true
}

// progressedSince calls f on each stream logged from mark on, after
// unlocking d.mu (Progressed; mark is in the log).
func (d *Device) progressedSince(mark uint64, f func(device.Stream)) {
	var buf [64]device.Stream
	list := buf[:0]
	for _, i := range d.progress[mark-d.progressBase:] {
		list = append(list, d.streamHandle(int(i)))
	}
	d.mu.Unlock()
	for _, s := range list {
		f(s)
	}
}

// eventState is a recorded event: it is done once its stream has finished
// seq events.
type eventState struct {
	stream int // index into Device.streams
	seq    uint64
}

// Synchronize finishes the work queued on every stream (busy streams stay
// busy for work queued later). Without waits between streams it visits only
// the streams where work was left pending since the last Synchronize, so
// that its cost does not grow with streams that hold nothing.
func (d *Device) Synchronize() error {
	d.mu.Lock()
	if d.waits > 0 {
		d.c.StreamVisits += int64(len(d.streams))
		for i := range d.streams {
			st := &d.streams[i]
			if st.completed < st.queued {
				d.progressedLocked(i)
			}
			st.completed = st.queued
			st.clearWaits()
		}
		d.waits = 0
	} else {
		d.c.StreamVisits += int64(len(d.unfinished))
		for _, i := range d.unfinished {
			if d.streams[i].completed < d.streams[i].queued {
				d.progressedLocked(i)
			}
			d.streams[i].completed = d.streams[i].queued
		}
	}
	for _, i := range d.unfinished {
		d.streams[i].listed = false
	}
	d.unfinished = d.unfinished[:0]
	d.c.Synchronizations++
	t := d.payLocked(d.costs.Synchronize)
	t += d.settlePoolLocked()
	d.mu.Unlock()
	nap(t)
	return nil
}

// NewStream creates a stream. A device numbers its streams 1, 2, 3, ... in
// creation order; the handle carries the ordinal too (see streamHandle).
func (d *Device) NewStream() (device.Stream, error) {
	d.mu.Lock()
	d.streams = append(d.streams, streamState{})
	s := d.streamHandle(len(d.streams) - 1)
	d.c.StreamsCreated++
	t := d.payLocked(d.costs.StreamCreate)
	d.mu.Unlock()
	nap(t)
	return s, nil
}

// HasStream reports whether s is a stream of this device.
func (d *Device) HasStream(s device.Stream) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	_, ok := d.streamIndex(s)
	return ok
}

// streamHandle returns the handle of the stream at index i: 0 for the
// default stream, else the ordinal in the high 32 bits and i in the low
// ones, so that a stream of another device is never taken for one of this
// device (on ordinal 0 the handles are simply 1, 2, 3, ...).
func (d *Device) streamHandle(i int) device.Stream {
	if i == 0 {
		return device.DefaultStream
	}
	return device.Stream(uint64(d.ordinal)<<32 | uint64(i))
}

// streamIndex returns the index of the stream with handle s.
func (d *Device) streamIndex(s device.Stream) (int, bool) {
	if s == device.DefaultStream {
		return 0, true
	}
	if uint64(s)>>32 != uint64(d.ordinal) {
		return 0, false
	}
	i := int(uint32(s))
	return i, i > 0 && i < len(d.streams) && !d.streams[i].released
}

// Streams returns how many streams the device has, the default one
// included.
func (d *Device) Streams() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.streams)
}

// streamLocked returns the state of stream s, or the error of op on a
// stream that is not this device's.
func (d *Device) streamLocked(op string, s device.Stream) (*streamState, error) {
	if i, ok := d.streamIndex(s); ok {
		return &d.streams[i], nil
	}
	return nil, d.noStream(op, s)
}

// noStream is streamLocked's error.
func (d *Device) noStream(op string, s device.Stream) error {
	return d.fail(op, device.ErrInvalidStream, "stream %#x is not a stream of device %d (it has %d)", uint64(s), d.ordinal, len(d.streams))
}

// SynchronizeStream finishes the work queued on s so far.
func (d *Device) SynchronizeStream(s device.Stream) error {
	d.mu.Lock()
	t := d.payLocked(d.costs.StreamSynchronize)
	st, err := d.streamLocked("synchronize stream", s)
	if err == nil {
		d.runLocked(s, st.queued)
		d.c.StreamSynchronizations++
		t += d.settlePoolLocked()
	}
	d.mu.Unlock()
	nap(t)
	return err
}

// SetStreamBusy holds the work of s: while s is busy, events recorded on it
// stay pending until something finishes them (CompleteStream,
// SynchronizeStream, Synchronize, or SynchronizeEvent of one of them).
// SetStreamBusy(s, false) finishes the pending work and makes later work
// finish at once again. It is a test control: it costs and counts nothing.
func (d *Device) SetStreamBusy(s device.Stream, busy bool) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	st, err := d.streamLocked("set stream busy", s)
	if err != nil {
		return err
	}
	st.busy = busy
	if !busy {
		d.runLocked(s, st.queued)
	}
	return nil
}

// runLocked finishes the work queued on the stream s up to its first upTo
// events, with the work it waits for, and lets the streams that wait for
// it move on.
func (d *Device) runLocked(s device.Stream, upTo uint64) {
	i, _ := d.streamIndex(s)
	d.finishSettledLocked(i, upTo)
}

// finishSettledLocked runs the work of stream i up to its first upTo
// events (finishLocked), then lets every stream run as far as its waits
// allow (settleLocked), passing the waits finishLocked passed.
func (d *Device) finishSettledLocked(i int, upTo uint64) {
	w := d.waits
	d.finishLocked(i, upTo)
	d.settleLocked(d.waits < w)
}

// CompleteStream finishes the work queued on s so far, as if the device had
// run it; a busy stream stays busy for work recorded later. It is a test
// control: it costs and counts nothing.
func (d *Device) CompleteStream(s device.Stream) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	st, err := d.streamLocked("complete stream", s)
	if err != nil {
		return err
	}
	d.runLocked(s, st.queued)
	return nil
}

// PendingWork returns how many events recorded on s have not finished.
func (d *Device) PendingWork(s device.Stream) (uint64, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	st, err := d.streamLocked("pending work", s)
	if err != nil {
		return 0, err
	}
	return st.queued - st.completed, nil
}

// RecordEvent records an event on s and returns its id: 1, 2, 3, ... in
// recording order, never reused. On a stream that is not busy the event is
// done at once.
func (d *Device) RecordEvent(s device.Stream) (device.Event, error) {
	d.mu.Lock()
	t := d.payLocked(d.costs.EventRecord)
	idx, ok := d.streamIndex(s) // streamLocked's, written out: one lookup for the state and the index
	if !ok {
		err := d.noStream("record event", s)
		d.mu.Unlock()
		nap(t)
		return 0, err
	}
	st := &d.streams[idx]
	d.queueLocked(idx)
	e := d.events.add(eventState{stream: idx, seq: st.queued})
	d.c.EventsRecorded++
	d.mu.Unlock()
	nap(t)
	return e, nil
}

// queueLocked queues one unit of work on stream i (an event, or a free of
// the stream-ordered pool): on a stream that is not busy it finishes at
// once, unless the stream waits for other streams' work.
//
// A stream that is not busy and waits for nothing has run all its work
// (every change of the streams settles them, settleLocked), and no
// stream can wait for the work just queued, so the new work finishes and
// nothing else moves: only a stream with waits of its own settles them.
func (d *Device) queueLocked(i int) {
	st := &d.streams[i]
	st.queued++
	if !st.busy {
		if !st.hasWaits() {
			st.completed = st.queued
			d.progressedLocked(i)
		} else {
			d.settleLocked(false)
		}
	}
	if st.completed < st.queued && !st.listed {
		st.listed = true
		d.unfinished = append(d.unfinished, i)
	}
}

// eventLocked finds e, then applies FailEventQueries.
func (d *Device) eventLocked(op string, e device.Event) (eventState, error) {
	ev, ok := d.events.get(e)
	if !ok {
		return ev, d.fail(op, device.ErrInvalidEvent, "event %d does not exist or was released", e)
	}
	if err := d.faults.eventErr; err != nil {
		d.c.FailedEventQueries++
		return ev, d.fail(op, err, "event %d: injected fault", e)
	}
	return ev, nil
}

// EventDone reports whether the work before e has finished, without
// finishing anything.
func (d *Device) EventDone(e device.Event) (bool, error) {
	d.mu.Lock()
	t := d.payLocked(d.costs.EventQuery)
	ev, err := d.eventLocked("query event", e)
	done := false
	if err == nil {
		done = d.streams[ev.stream].completed >= ev.seq
		d.c.EventQueries++
	}
	d.mu.Unlock()
	nap(t)
	return done, err
}

// SynchronizeEvent waits for e: the work of e's stream up to and including
// e finishes, as it would once a real caller had waited for it. Work
// recorded on the stream after e stays pending.
func (d *Device) SynchronizeEvent(e device.Event) error {
	d.mu.Lock()
	t := d.payLocked(d.costs.EventSynchronize)
	ev, err := d.eventLocked("synchronize event", e)
	if err == nil {
		d.finishSettledLocked(ev.stream, ev.seq)
		d.c.EventSynchronizations++
		t += d.settlePoolLocked()
	}
	d.mu.Unlock()
	nap(t)
	return err
}

// ReleaseEvent destroys e; its id then fails with device.ErrInvalidEvent.
// Releasing an event does not finish or cancel the work before it.
func (d *Device) ReleaseEvent(e device.Event) error {
	d.mu.Lock()
	t := d.payLocked(d.costs.EventRelease)
	ok := d.events.remove(e)
	if ok {
		d.c.EventsReleased++
	}
	d.mu.Unlock()
	nap(t)
	if !ok {
		return d.fail("release event", device.ErrInvalidEvent, "event %d does not exist or was released", e)
	}
	return nil
}

// WaitEvent makes the work recorded on s from now on wait until e is done
// (device.StreamWaiter, cuStreamWaitEvent): while e's stream has not run
// the work before e, events recorded later on s stay pending even on a
// stream that is not busy, and synchronizing s, or completing it, runs
// that work first. Waiting on an event of s itself, or on one already
// done, changes nothing. The event may be released afterwards.
func (d *Device) WaitEvent(s device.Stream, e device.Event) error {
	d.mu.Lock()
	t := d.payLocked(d.costs.EventWait)
	var err error
	if i, ok := d.streamIndex(s); !ok { // streamLocked's, written out, as in RecordEvent
		err = d.noStream("wait event", s)
	} else if ev, ok := d.events.get(e); !ok {
		err = d.fail("wait event", device.ErrInvalidEvent, "event %d does not exist or was released", e)
	} else {
		d.waitLocked(i, ev.stream, ev.seq)
		d.c.EventWaits++
	}
	d.mu.Unlock()
	nap(t)
	return err
}

// WaitStream makes the work recorded on s from now on wait until the work
// queued on t so far is done (device.StreamWaiter): what RecordEvent on t,
// WaitEvent on s and ReleaseEvent do together, with no event in the table.
// It costs a record and a wait on the clock (a CUDA backend records an
// event it keeps and waits on it) and counts as a StreamWait. Waiting on
// s itself changes nothing.
func (d *Device) WaitStream(s, t device.Stream) error {
	d.mu.Lock()
	tm := d.payLocked(d.costs.EventRecord + d.costs.EventWait)
	i, iok := d.streamIndex(s)
	j, jok := d.streamIndex(t)
	var err error
	switch {
	case !iok:
		err = d.noStream("wait stream", s)
	case !jok:
		err = d.noStream("wait stream", t)
	default:
		if i != j {
			d.queueLocked(j) // the record's place in t's queue
			d.waitLocked(i, j, d.streams[j].queued)
		}
		d.c.StreamWaits++
	}
	d.mu.Unlock()
	nap(tm)
	return err
}
