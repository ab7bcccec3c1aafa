//go:build cuda

// streams.go: streams and events, and the handle tables that stand between
// callers and the driver's stream and event pointers.

package cuda

import (
	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/device/cuda/internal/cudadrv"
	"gorgonia.org/cu"
)

// streamEntry is a row of the stream table: the driver stream, and
// whether it was adopted (the caller's, never destroyed here) or created
// by NewStream (destroyed by Close).
type streamEntry struct {
	cs      cu.Stream
	adopted bool
}

// streamLocked returns the driver stream behind s. The caller holds
// d.streamMu (read or write).
func (d *Device) streamLocked(op string, s device.Stream) (cu.Stream, error) {
	if s == device.DefaultStream {
		return cu.NoStream, nil
	}
	e, ok := d.streams[s]
	if !ok {
		return cu.NoStream, usageError(op, d.ordinal, device.ErrInvalidStream, "stream %d was not created or adopted by this device, or was released", uint64(s))
	}
	return e.cs, nil
}

// NewStream creates a non-blocking stream (CU_STREAM_NON_BLOCKING: it does
// not synchronize with the default stream, like the streams of PyTorch's
// pool). It lives until Close.
func (d *Device) NewStream() (device.Stream, error) {
	if err := d.enter("new stream"); err != nil {
		return 0, err
	}
	defer d.life.RUnlock()
	var cs cu.Stream
	c := d.call(func() int {
		var err error
		cs, err = cu.MakeStream(cu.NonBlocking)
		return codeOf(err)
	})
	if c != cudadrv.Success {
		return 0, driverError("new stream", d.ordinal, c, subjectNone)
	}
	d.streamMu.Lock()
	d.nextStream++
	// The handle carries the ordinal in its high bits, so that a stream of
	// another device is never taken for one of this device.
	h := device.Stream(uint64(d.ordinal)<<32) | d.nextStream
	d.streams[h] = streamEntry{cs: cs}
	d.streamMu.Unlock()
	return h, nil
}

// HasStream reports whether s is the default stream, a stream this device
// created, or one it adopted and has not released (device.StreamChecker).
func (d *Device) HasStream(s device.Stream) bool {
	if s == device.DefaultStream {
		return true
	}
	d.streamMu.RLock()
	defer d.streamMu.RUnlock()
	_, ok := d.streams[s]
	return ok
}

// SynchronizeStream waits for the work queued on s (cuStreamSynchronize).
func (d *Device) SynchronizeStream(s device.Stream) error {
	if err := d.enter("synchronize stream"); err != nil {
		return err
	}
	defer d.life.RUnlock()
	d.streamMu.RLock()
	defer d.streamMu.RUnlock()
	cs, err := d.streamLocked("synchronize stream", s)
	if err != nil {
		return err
	}
	if c := d.call(func() int { return codeOf(cs.Synchronize()) }); c != cudadrv.Success {
		return driverError("synchronize stream", d.ordinal, c, subjectStream)
	}
	return nil
}

// RecordEvent creates an event without timing (CU_EVENT_DISABLE_TIMING,
// the cheapest kind) and records it on s.
func (d *Device) RecordEvent(s device.Stream) (device.Event, error) {
	if err := d.enter("record event"); err != nil {
		return 0, err
	}
	defer d.life.RUnlock()
	d.streamMu.RLock()
	defer d.streamMu.RUnlock()
	cs, err := d.streamLocked("record event", s)
	if err != nil {
		return 0, err
	}
	var ev cu.Event
	var what subject
	c := d.call(func() int {
		var err error
		if ev, err = cu.MakeEvent(cu.DisableTiming); err != nil {
			what = subjectNone
			return codeOf(err)
		}
		if c := codeOf(ev.Record(cs)); c != cudadrv.Success {
			what = subjectStream
			cu.DestroyEvent(&ev)
			return c
		}
		return cudadrv.Success
	})
	if c != cudadrv.Success {
		return 0, driverError("record event", d.ordinal, c, what)
	}
	d.eventMu.Lock()
	d.nextEvent++
	h := d.nextEvent
	d.events[h] = ev
	d.eventMu.Unlock()
	return h, nil
}

// eventLocked returns the driver event behind e. The caller holds
// d.eventMu (read or write).
func (d *Device) eventLocked(op string, e device.Event) (cu.Event, error) {
	ev, ok := d.events[e]
	if !ok {
		return cu.Event{}, usageError(op, d.ordinal, device.ErrInvalidEvent, "event %d was not recorded by this device or was released", uint64(e))
	}
	return ev, nil
}

// EventDone reports whether the work before e has finished (cuEventQuery;
// CUDA_ERROR_NOT_READY means not yet).
func (d *Device) EventDone(e device.Event) (bool, error) {
	if err := d.enter("query event"); err != nil {
		return false, err
	}
	defer d.life.RUnlock()
	d.eventMu.RLock()
	defer d.eventMu.RUnlock()
	ev, err := d.eventLocked("query event", e)
	if err != nil {
		return false, err
	}
	switch c := d.call(func() int { return codeOf(ev.Query()) }); c {
	case cudadrv.Success:
		return true, nil
	case cudadrv.ErrNotReady:
		return false, nil
	default:
		return false, driverError("query event", d.ordinal, c, subjectEvent)
	}
}

// SynchronizeEvent waits until e is done (cuEventSynchronize).
func (d *Device) SynchronizeEvent(e device.Event) error {
	if err := d.enter("synchronize event"); err != nil {
		return err
	}
	defer d.life.RUnlock()
	d.eventMu.RLock()
	defer d.eventMu.RUnlock()
	ev, err := d.eventLocked("synchronize event", e)
	if err != nil {
		return err
	}
	if c := d.call(func() int { return codeOf(ev.Synchronize()) }); c != cudadrv.Success {
		return driverError("synchronize event", d.ordinal, c, subjectEvent)
	}
	return nil
}

// ReleaseEvent destroys e (cuEventDestroy). The handle is forgotten even
// if the driver fails, so it can never reach the driver again.
func (d *Device) ReleaseEvent(e device.Event) error {
	if err := d.enter("release event"); err != nil {
		return err
	}
	defer d.life.RUnlock()
	d.eventMu.Lock()
	defer d.eventMu.Unlock()
	ev, err := d.eventLocked("release event", e)
	if err != nil {
		return err
	}
	delete(d.events, e)
	if c := d.call(func() int { return codeOf(cu.DestroyEvent(&ev)) }); c != cudadrv.Success {
		return driverError("release event", d.ordinal, c, subjectEvent)
	}
	return nil
}

// WaitEvent makes the work queued on s from now on wait until e is done
// (cuStreamWaitEvent), without blocking the caller (device.StreamWaiter).
// The event may be released afterwards.
func (d *Device) WaitEvent(s device.Stream, e device.Event) error {
	if err := d.enter("wait event"); err != nil {
		return err
	}
	defer d.life.RUnlock()
	d.streamMu.RLock()
	defer d.streamMu.RUnlock()
	cs, err := d.streamLocked("wait event", s)
	if err != nil {
		return err
	}
	d.eventMu.RLock()
	defer d.eventMu.RUnlock()
	ev, err := d.eventLocked("wait event", e)
	if err != nil {
		return err
	}
	if c := d.call(func() int { return codeOf(cs.Wait(ev, 0)) }); c != cudadrv.Success {
		return driverError("wait event", d.ordinal, c, subjectEvent)
	}
	return nil
}

// WaitStream makes the work queued on s from now on wait until the work
// queued on t so far is done, without blocking the caller
// (device.StreamWaiter): it records an event on t (cuEventRecord) and makes
// s wait on it (cuStreamWaitEvent), leaving no event to release. The event
// is the device's own: the first call creates it without timing
// (CU_EVENT_DISABLE_TIMING), later calls record the same one again, and
// Close destroys it. One event is enough because cuStreamWaitEvent waits
// for the record that is most recent when it is called, and the event may
// be recorded again or destroyed right after; d.waitMu keeps another
// WaitStream from recording it between this call's record and wait.
// Waiting on s itself changes nothing and makes no driver call. Unknown
// streams fail with device.ErrInvalidStream before the driver sees them.
func (d *Device) WaitStream(s, t device.Stream) error {
	if err := d.enter("wait stream"); err != nil {
		return err
	}
	defer d.life.RUnlock()
	d.streamMu.RLock()
	defer d.streamMu.RUnlock()
	cs, err := d.streamLocked("wait stream", s)
	if err != nil {
		return err
	}
	ct, err := d.streamLocked("wait stream", t)
	if err != nil {
		return err
	}
	if s == t {
		return nil
	}
	d.waitMu.Lock()
	defer d.waitMu.Unlock()
	var what subject
	c := d.call(func() int {
		if d.waitEvent == (cu.Event{}) {
			ev, err := cu.MakeEvent(cu.DisableTiming)
			if c := codeOf(err); c != cudadrv.Success {
				what = subjectNone
				return c
			}
			d.waitEvent = ev
		}
		// A failed record or wait leaves the event as it was, fit to be
		// recorded by the next call; an invalid handle can only be one of
		// the streams, since the event is the device's own.
		if c := codeOf(d.waitEvent.Record(ct)); c != cudadrv.Success {
			what = subjectStream
			return c
		}
		if c := codeOf(cs.Wait(d.waitEvent, 0)); c != cudadrv.Success {
			what = subjectStream
			return c
		}
		return cudadrv.Success
	})
	if c != cudadrv.Success {
		return driverError("wait stream", d.ordinal, c, what)
	}
	return nil
}
