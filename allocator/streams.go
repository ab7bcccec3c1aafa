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
// them (the lock-free table of the shards, a map of the cold shard's
// streams), the others in a set, so that a known stream costs a lookup
// (and no allocation) however many streams there are.
//
// A stream once known stays known (the device interface destroys no
// stream), so the streams found known lately are kept in a small table
// by a hash of their value (knownRecent), which answers the next
// RecordStream on one of them without the searches.
func (a *Allocator) knownStreamLocked(s device.Stream) bool {
	h := knownSlot(s)
	if s == device.DefaultStream || a.knownRecent[h] == s {
		return true
	}
	if a.streamIndexesLocked(s) == nil {
		if _, ok := a.streams[s]; !ok {
			if c, ok := a.dev.(device.StreamChecker); ok && !c.HasStream(s) {
				return false
			}
			if a.streams == nil {
				a.streams = make(map[device.Stream]struct{})
			}
			a.streams[s] = struct{}{}
		}
	}
	a.knownRecent[h] = s
	return true
}

// knownSlot is stream s's slot in Allocator.knownRecent: the top bits of
// a multiplicative hash, since a backend's streams may be aligned
// addresses whose low bits are all zero.
func knownSlot(s device.Stream) int {
	return int(uint64(s) * 0x9E3779B97F4A7C15 >> (64 - knownRecentBits))
}

// knownRecentBits is the log2 of the number of Allocator.knownRecent's
// slots.
const knownRecentBits = 4

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
	a.mu.Lock()
	a.enter() // lockAll, inlined
	defer a.unlockAll()
	b, sh := a.liveBlockLocked(p, nil)
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
	// Recorded during a capture, its work is ordered by the capture's
	// end: a free that waits for that records no event on s (capture.go).
	a.addUseLocked(b, s, a.captures > 0)
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
	if b.Uses == 0 {
		return 0, nil
	}
	if a.captures > 0 {
		return a.deferUntilNoCaptureLocked(b), nil
	}
	n, err := a.events.Record(b, a.usesOf(b))
	if err != nil {
		return 0, fmt.Errorf("allocator: free %v on device %d: %w", b.Ptr(), a.ordinal, err)
	}
	a.dropUsesLocked(b)
	return n, nil
}

// eventDoneLocked counts one finished event of b's pending free, and
// completes the free after the last.
func (a *Allocator) eventDoneLocked(b *freeindex.Block) {
	b.EventCount--
	if b.EventCount == 0 {
		a.completeFreeLocked(b, false)
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

// streamUses is the record of the streams an allocated block was recorded
// on (RecordStream), other than its own: streams, in the order they were
// first recorded, each once; capture, those of them recorded while a
// capture was underway. The records live in the allocator's slab
// (Allocator.useRecs), named from the block by Block.Uses (1 + the index);
// a record no block names is on the free list (Allocator.freeUses), or is
// held by a free that waits for the end of the captures (deferredFree),
// and keeps its slices' arrays, so that recording a stream and deferring
// a free allocate nothing once the slab has grown to the number of
// recorded blocks live at once.
type streamUses struct {
	streams []device.Stream
	capture []device.Stream
}

// usesOf returns the streams b was recorded on, other than its own (nil
// when none). The slice is the record's: valid until b's record changes.
func (a *Allocator) usesOf(b *freeindex.Block) []device.Stream {
	if b.Uses == 0 {
		return nil
	}
	return a.useRecs[b.Uses-1].streams
}

// addUseLocked records stream s on the allocated block b (not its user's:
// RecordStream and the policy's lending see to that), as
// used during a capture too when capturing is set; a stream recorded
// already is not added again. It gives b a record first if it has none.
func (a *Allocator) addUseLocked(b *freeindex.Block, s device.Stream, capturing bool) {
	if b.Uses == 0 {
		b.Uses = a.newUsesLocked()
	}
	u := &a.useRecs[b.Uses-1]
	if !slices.Contains(u.streams, s) {
		u.streams = append(u.streams, s)
	}
	if capturing && !slices.Contains(u.capture, s) {
		u.capture = append(u.capture, s)
	}
}

// newUsesLocked returns the name (1 + the index) of an empty record, from
// the free list when it has one.
func (a *Allocator) newUsesLocked() int32 {
	if n := len(a.freeUses); n > 0 {
		i := a.freeUses[n-1]
		a.freeUses = a.freeUses[:n-1]
		return i
	}
	a.useRecs = append(a.useRecs, streamUses{})
	return int32(len(a.useRecs))
}

// freeUsesLocked empties the record named i and puts it on the free list.
func (a *Allocator) freeUsesLocked(i int32) {
	u := &a.useRecs[i-1]
	u.streams = u.streams[:0]
	u.capture = u.capture[:0]
	a.freeUses = append(a.freeUses, i)
}

// dropUsesLocked forgets the streams b was recorded on: its record goes
// back to the free list, and b is no longer recorded.
func (a *Allocator) dropUsesLocked(b *freeindex.Block) {
	if b.Uses != 0 {
		a.freeUsesLocked(b.Uses)
	}
	b.Uses = 0
}

// checkUsesLocked checks the records of recorded streams, given every
// block of every segment with Uses set (a recorded block): it is allocated; each record is named
// by one block or one deferred free, or is on the free list, and not two
// of these; a block's record lists at least one stream, none twice, and
// its capture streams are among them; a record on the free list is
// empty.
func (a *Allocator) checkUsesLocked(recorded []*freeindex.Block, bad func(string, ...any)) {
	owner := make([]int, len(a.useRecs)) // 0 none, 1 a block, 2 a deferred free, 3 the free list
	claim := func(i int32, who int, what string) bool {
		if i <= 0 || int(i) > len(a.useRecs) {
			bad("%s names stream record %d of %d", what, i, len(a.useRecs))
			return false
		}
		if owner[i-1] != 0 {
			bad("stream record %d is named twice (%s)", i, what)
			return false
		}
		owner[i-1] = who
		return true
	}
	for _, b := range recorded {
		what := fmt.Sprintf("block %v", b.Ptr())
		if lb, _ := a.liveBlockLocked(b.Ptr(), nil); !b.Allocated || lb != b {
			bad("stream uses are kept for %v, which is not an allocated, recorded block (record %d)", b.Ptr(), b.Uses)
		}
		if b.Uses == 0 || !claim(b.Uses, 1, what) {
			continue
		}
		u := a.useRecs[b.Uses-1]
		if len(u.streams) == 0 {
			bad("block %v is recorded on no stream", b.Ptr())
		}
		for j, s := range u.streams {
			if slices.Contains(u.streams[:j], s) {
				bad("block %v: stream %d recorded twice", b.Ptr(), s)
			}
		}
		for _, s := range u.capture {
			if !slices.Contains(u.streams, s) {
				bad("block %v: stream %d recorded during a capture is not among its streams", b.Ptr(), s)
			}
		}
	}
	for _, d := range a.deferred {
		if d.uses != 0 {
			claim(d.uses, 2, fmt.Sprintf("deferred free %v", d.b.Ptr()))
		}
	}
	for _, i := range a.freeUses {
		if claim(i, 3, "the free list") {
			if u := a.useRecs[i-1]; len(u.streams) != 0 || len(u.capture) != 0 {
				bad("stream record %d on the free list is not empty", i)
			}
		}
	}
	for i, o := range owner {
		if o == 0 {
			bad("stream record %d is lost: no block, deferred free or free list names it", i+1)
		}
	}
}
