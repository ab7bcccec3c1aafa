// This file holds the observer interface through which the allocator
// publishes what it does (for trace recorders and profilers).

package allocator

import (
	"slices"

	"github.com/gpumem/gpumem/device"
)

// EventKind says what an Event reports.
type EventKind uint8

// The kinds of Event, named after PyTorch's memory-history trace actions.
const (
	EventAlloc         EventKind = iota + 1 // a block was handed to a caller (alloc)
	EventFreeRequested                      // a caller freed a block (free_requested)
	EventFreeCompleted                      // a freed block returned to the cache (free_completed)
	EventSegmentAlloc                       // a segment was obtained from the device (segment_alloc)
	EventSegmentFree                        // a segment was returned to the device (segment_free)
	EventRecordStream                       // a block was recorded on another stream
	EventEmptyCache                         // EmptyCache was called
	EventOutOfMemory                        // Alloc is about to return an out-of-memory error (oom)
	EventSegmentMap                         // pages were mapped into an expandable segment (segment_map)
	EventSegmentUnmap                       // pages of an expandable segment were unmapped (segment_unmap)
)

var eventKindNames = [...]string{
	EventAlloc:         "alloc",
	EventFreeRequested: "free_requested",
	EventFreeCompleted: "free_completed",
	EventSegmentAlloc:  "segment_alloc",
	EventSegmentFree:   "segment_free",
	EventRecordStream:  "record_stream",
	EventEmptyCache:    "empty_cache",
	EventOutOfMemory:   "oom",
	EventSegmentMap:    "segment_map",
	EventSegmentUnmap:  "segment_unmap",
}

// String returns the PyTorch-style name of the kind.
func (k EventKind) String() string {
	if int(k) < len(eventKindNames) && eventKindNames[k] != "" {
		return eventKindNames[k]
	}
	return "unknown"
}

// Event is one thing the allocator did. Fields that do not apply to a kind
// are zero.
type Event struct {
	Kind      EventKind
	Ptr       device.Ptr    // block or segment address
	Size      uint64        // block or segment size in bytes
	Requested uint64        // bytes the caller asked for (alloc, free, oom)
	Stream    device.Stream // the block's stream; for EventRecordStream the stream recorded
}

// Observer receives the allocator's events. Observe is called with the
// allocator's lock held, in the order the events happen, from the
// goroutine whose call caused them: it must be quick and must not call the
// allocator (that would deadlock). The Event is passed by value; keep a
// copy, not a pointer.
type Observer interface {
	Observe(e Event)
}

type observerEntry struct {
	id  uint64
	obs Observer
}

// Attach registers o to receive every later event and returns a function
// that detaches it.
func (a *Allocator) Attach(o Observer) (detach func()) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.nextID++
	id := a.nextID
	a.observers = append(slices.Clip(a.observers), observerEntry{id: id, obs: o})
	return func() {
		a.mu.Lock()
		defer a.mu.Unlock()
		a.observers = slices.DeleteFunc(slices.Clone(a.observers), func(e observerEntry) bool { return e.id == id })
	}
}

func (a *Allocator) notifyLocked(e Event) {
	for _, o := range a.observers {
		o.obs.Observe(e)
	}
}
