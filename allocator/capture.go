// This file holds graph capture: a stream's allocations go to a named pool
// while it captures (BeginCapture, EndCapture), and the frees that would
// record events wait until no capture is underway, as PyTorch 2.6's
// beginAllocateToPool, endAllocateToPool and
// insert_events_deferred_until_no_capture do.

package allocator

import (
	"errors"
	"fmt"
	"slices"

	"github.com/gpumem/gpumem/allocator/internal/freeindex"
	"github.com/gpumem/gpumem/device"
)

// deferredFree is the free of a block recorded on other streams, made
// while a capture was underway: its events wait until no capture is
// (uses: the name of the record of the streams to record them on, those
// recorded during a capture left out, whose work the capture's end
// orders; 0 when none is left).
type deferredFree struct {
	b    *freeindex.Block
	uses int32
}

// BeginCapture starts a graph capture on stream s into pool p, as
// torch.cuda.graph does (PyTorch's beginAllocateToPool with a filter that
// matches s): s's allocations go to p until EndCapture(s). While any
// capture is underway, as in PyTorch 2.6:
//
//   - no stream event is queried: pending frees are not completed, and
//     the free of a block recorded on other streams (RecordStream) records
//     no event but waits, pending, until no capture is underway; then its
//     events are recorded on the streams it was recorded on before the
//     capture began (those recorded during it are ordered by the capture's
//     end);
//   - a block freed on its own stream is cached at once, and serves the
//     next allocation of its pool and stream within the capture.
//
// Where gpumem differs: PyTorch releases cached memory on the way to an
// out-of-memory error even during a capture (and then fails an internal
// assertion, since it may not wait for events); gpumem does not release
// cached memory while a capture is underway, so a request the device
// cannot serve fails at once with an *OutOfMemoryError, and EmptyCache
// fails with an error and changes nothing. A released pool's memory waits
// for the end of the captures too.
//
// A stream that is routed or capturing already, a pool that is being
// captured into on another stream, or a pool released, is an error, and
// nothing changes. The pool outlives the capture: it keeps its blocks
// until ReleasePool (PyTorch's releasePool, when the graph is reset).
func (a *Allocator) BeginCapture(p *Pool, s device.Stream) error {
	if !a.made() {
		return errNotMade
	}
	a.lockAll()
	defer a.unlockAll()
	if p != nil && p.a == a {
		for t, r := range a.route {
			if r.pool == p && r.capture {
				return fmt.Errorf("allocator: begin capture into %q: stream %d is capturing into it already", p.name, t)
			}
		}
	}
	if err := a.routeLocked("begin capture into", p, s, true); err != nil {
		return err
	}
	a.captures++
	return nil
}

// EndCapture ends the capture on stream s (PyTorch's endAllocateToPool):
// s allocates in the default pool again. When no capture is underway
// after it, the frees that waited record their events; an error doing so
// leaves those frees waiting (the next allocation that takes every lock
// tries again) and is returned, but the capture ends. A stream that is
// not capturing is an error, and nothing changes.
func (a *Allocator) EndCapture(s device.Stream) error {
	if !a.made() {
		return errNotMade
	}
	a.lockAll()
	defer a.unlockAll()
	r, ok := a.route[s]
	if !ok || !r.capture {
		return fmt.Errorf("allocator: end capture: stream %d is not capturing", s)
	}
	a.unrouteLocked(s, r)
	a.captures--
	err := a.insertDeferredLocked()
	if selfCheck {
		a.selfCheckLocked("EndCapture")
	}
	return err
}

// Capturing reports whether a capture is underway on stream s, and into
// which pool.
func (a *Allocator) Capturing(s device.Stream) (*Pool, bool) {
	if !a.made() {
		return nil, false
	}
	a.lockAll()
	defer a.unlockAll()
	if r, ok := a.route[s]; ok && r.capture {
		return r.pool, true
	}
	return nil, false
}

// errCapturing is EmptyCache's error while a capture is underway.
var errCapturing = errors.New("allocator: a graph capture is underway: cached memory cannot be released (it would wait for stream events); end the capture first")

// deferUntilNoCaptureLocked takes the free of b, allocated and recorded on
// other streams, while a capture is underway: b's uses move to a deferred
// free, and b stays pending with one event to come (not queued). It
// returns 1, the count of b's outstanding events.
func (a *Allocator) deferUntilNoCaptureLocked(b *freeindex.Block) int {
	i := b.Uses
	u := &a.useRecs[i-1]
	if cu := u.capture; len(cu) > 0 {
		u.streams = slices.DeleteFunc(u.streams, func(s device.Stream) bool { return slices.Contains(cu, s) })
		u.capture = cu[:0]
	}
	if len(u.streams) == 0 {
		a.freeUsesLocked(i)
		i = 0
	}
	b.Uses = 0
	a.deferred = append(a.deferred, deferredFree{b: b, uses: i})
	return 1
}

// insertDeferredLocked records the events of the frees that waited for
// the end of the captures, when none is underway
// (insert_events_deferred_until_no_capture), and completes those with no
// stream left to wait for. On an error the rest wait still.
func (a *Allocator) insertDeferredLocked() error {
	if a.captures > 0 || len(a.deferred) == 0 {
		return nil
	}
	for i, d := range a.deferred {
		var uses []device.Stream
		if d.uses != 0 {
			uses = a.useRecs[d.uses-1].streams
		}
		n, err := a.events.Record(d.b, uses)
		if err != nil {
			a.deferred = slices.Delete(a.deferred, 0, i)
			return fmt.Errorf("allocator: free %v on device %d, after a capture: %w", d.b.Ptr(), a.ordinal, err)
		}
		if d.uses != 0 {
			a.freeUsesLocked(d.uses)
		}
		if d.b.EventCount = int32(n); n == 0 {
			a.completeFreeLocked(d.b, false)
		}
		a.deferred[i] = deferredFree{}
	}
	a.deferred = a.deferred[:0]
	return nil
}

// checkCaptureLocked checks the captures' bookkeeping: the count of
// captures is the count of capturing routes; every deferred free is of a
// pending block with one event to come and none queued, and there are
// deferred frees only while a capture is underway or after a failed
// insertion. (The streams recorded during a capture are checked with
// the rest of the records, checkUsesLocked.)
func (a *Allocator) checkCaptureLocked(queued map[*freeindex.Block]int32, bad func(string, ...any)) {
	n := 0
	for _, r := range a.route {
		if r.capture {
			n++
		}
	}
	if n != a.captures {
		bad("%d captures counted, %d streams capturing", a.captures, n)
	}
	for _, d := range a.deferred {
		if d.b.Allocated || d.b.EventCount != 1 || queued[d.b] != 0 || d.b.Uses != 0 {
			bad("deferred free %v is not a pending block waiting for one event", d.b.Ptr())
		}
	}
}

// isDeferred reports whether b's free waits for the end of the captures.
func (a *Allocator) isDeferred(b *freeindex.Block) bool {
	return slices.ContainsFunc(a.deferred, func(d deferredFree) bool { return d.b == b })
}
