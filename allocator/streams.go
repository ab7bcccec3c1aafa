// This file holds streams: which streams are valid, RecordStream, and the
// frees deferred until work on other streams finishes (steps 3 and 4 of
// the free ladder), on the queue shared with the host allocator.

package allocator

import (
	"fmt"
	"slices"

	"github.com/gpumem/gpumem/allocator/internal/freeindex"
	"github.com/gpumem/gpumem/device"
)

// knownStreamLocked reports whether s is a stream of the device, without
// giving it free indexes: a stream a block is recorded on need not
// allocate. Streams are asked of the device once, when it can tell
// (device.StreamChecker), and remembered: those with free indexes by
// them (a binary search of the shards, a map of the cold shard's
// streams), the others in a set, so that a known stream costs a lookup
// (and no allocation) however many streams there are.
func (a *Allocator) knownStreamLocked(s device.Stream) bool {
	if s == device.DefaultStream || a.streamIndexesLocked(s) != nil {
		return true
	}
	if _, ok := a.streams[s]; ok {
		return true
	}
	if c, ok := a.dev.(device.StreamChecker); ok && !c.HasStream(s) {
		return false
	}
	if a.streams == nil {
		a.streams = make(map[device.Stream]struct{})
	}
	a.streams[s] = struct{}{}
	return true
}

// RecordStream marks the allocated block at p as used on stream s too, as
// PyTorch's recordStream: when the block is freed, it is reused only after
// the work queued on s by then has finished. Recording the block's own
// stream does nothing, and so does recording the zero Ptr (what Alloc
// returns for 0 bytes), as in PyTorch.
func (a *Allocator) RecordStream(p device.Ptr, s device.Stream) error {
	if p == 0 {
		return nil
	}
	if !a.made() {
		return errNotMade
	}
	a.lockAll()
	defer a.unlockAll()
	b, sh := a.liveBlockLocked(p)
	if b == nil {
		return a.invalidPointerLocked("record stream for", p)
	}
	if sh.pool != nil && sh.pool.paused {
		return fmt.Errorf("allocator: record stream for %v on device %d: its pool %q is paused; resume it first", p, a.ordinal, sh.pool.name)
	}
	if !a.knownStreamLocked(s) {
		return fmt.Errorf("allocator: record stream for %v: stream %d is not a stream of device %d: %w", p, s, a.ordinal, device.ErrInvalidStream)
	}
	if s == a.userStreamLocked(b) { // policy: a lent block's user is its borrower
		return nil
	}
	if a.uses == nil {
		a.uses = make(map[*freeindex.Block][]device.Stream)
	}
	if u := a.uses[b]; !slices.Contains(u, s) {
		a.uses[b] = append(u, s)
	}
	b.Recorded = true
	if a.captures > 0 {
		// Its work is ordered by the capture's end: a free that waits for
		// that records no event on s (capture.go).
		if a.captureUses == nil {
			a.captureUses = make(map[*freeindex.Block][]device.Stream)
		}
		if cu := a.captureUses[b]; !slices.Contains(cu, s) {
			a.captureUses[b] = append(cu, s)
		}
	}
	if a.pol != nil {
		a.noteRecordedLocked(s) // policy: no lending to or from s
	}
	a.streamRecordedLocked(b, s)
	return nil
}

// deferFreeLocked records an event on every stream the allocated block b
// was used on, and returns how many are now outstanding: 0 when b was
// recorded on no other stream, or when the events could not be recorded
// and the streams were synchronized instead. On an error nothing changed.
func (a *Allocator) deferFreeLocked(b *freeindex.Block) (int, error) {
	if !b.Recorded {
		return 0, nil
	}
	if a.captures > 0 {
		return a.deferUntilNoCaptureLocked(b), nil
	}
	n, err := a.events.Record(b, a.uses[b])
	if err != nil {
		return 0, fmt.Errorf("allocator: free %v on device %d: %w", b.Ptr(), a.ordinal, err)
	}
	delete(a.uses, b)
	delete(a.captureUses, b)
	b.Recorded = false
	return n, nil
}

// eventDoneLocked counts one finished event of b's pending free, and
// completes the free after the last.
func (a *Allocator) eventDoneLocked(b *freeindex.Block) {
	b.EventCount--
	if b.EventCount == 0 {
		a.finishFreeLocked(a.shardOf(b.Seg().Free()), b, false)
	}
}

// processEventsLocked is step 1 of the allocation ladder (PyTorch's
// process_events), but while a capture is underway, when no event may be
// queried: it records the events of the frees that waited for the end of
// the captures, then completes the deferred frees whose events are done.
func (a *Allocator) processEventsLocked() {
	if a.captures > 0 {
		return
	}
	_ = a.insertDeferredLocked() // an error leaves them waiting for the next try
	a.pollEventsLocked()
}

// pollEventsLocked completes the deferred frees whose events are done
// (PyTorch's process_events).
func (a *Allocator) pollEventsLocked() {
	a.events.Poll(a.eventDone)
}

// drainEventsLocked waits for every outstanding event and completes the
// frees waiting on them (PyTorch's synchronize_and_free_events; counted
// in num_sync_all_streams).
func (a *Allocator) drainEventsLocked() error {
	a.streamsSyncedLocked()
	if err := a.events.Drain(a.eventDone); err != nil {
		return fmt.Errorf("allocator: device %d: %w", a.ordinal, err)
	}
	return nil
}
