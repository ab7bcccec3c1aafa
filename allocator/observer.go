// This file holds the observer interface through which the allocator
// publishes what it does (for trace recorders and profilers).

package allocator

import (
	"slices"

	"github.com/gpumem/gpumem/device"
)

// ActionKind says what an Action reports.
type ActionKind uint8

// The kinds of Action, named after PyTorch's memory-history trace actions.
const (
	ActionAlloc         ActionKind = iota + 1 // a block was handed to a caller (alloc)
	ActionFreeRequested                       // a caller freed a block (free_requested)
	ActionFreeCompleted                       // a freed block returned to the cache (free_completed)
	ActionSegmentAlloc                        // a segment was obtained from the device (segment_alloc)
	ActionSegmentFree                         // a segment was returned to the device (segment_free)
	ActionRecordStream                        // a block was recorded on another stream
	ActionEmptyCache                          // EmptyCache was called
	ActionOutOfMemory                         // Alloc is about to return an out-of-memory error (oom)
	ActionSegmentMap                          // pages were mapped into an expandable segment (segment_map)
	ActionSegmentUnmap                        // pages of an expandable segment were unmapped (segment_unmap)
	ActionPhase                               // the current phase changed (SetPhase)
	ActionStep                                // a step boundary was marked (MarkStep)
)

var actionKindNames = [...]string{
	ActionAlloc:         "alloc",
	ActionFreeRequested: "free_requested",
	ActionFreeCompleted: "free_completed",
	ActionSegmentAlloc:  "segment_alloc",
	ActionSegmentFree:   "segment_free",
	ActionRecordStream:  "record_stream",
	ActionEmptyCache:    "empty_cache",
	ActionOutOfMemory:   "oom",
	ActionSegmentMap:    "segment_map",
	ActionSegmentUnmap:  "segment_unmap",
	ActionPhase:         "phase",
	ActionStep:          "step",
}

// String returns the PyTorch-style name of the kind.
func (k ActionKind) String() string {
	if int(k) < len(actionKindNames) && actionKindNames[k] != "" {
		return actionKindNames[k]
	}
	return "unknown"
}

// Action is one thing the allocator did. Fields that do not apply to a kind
// are zero.
type Action struct {
	Kind      ActionKind
	Ptr       device.Ptr    // block or segment address
	Size      uint64        // block or segment size in bytes
	Requested uint64        // bytes the caller asked for (alloc, free, oom)
	Stream    device.Stream // the block's stream (for ActionAlloc the caller's, see Allocator.Alloc); for ActionRecordStream the stream recorded
	// Phase is the block's phase (the phase current when it was handed
	// out) for the block actions; the current phase for ActionPhase (the
	// new one), ActionStep and ActionOutOfMemory.
	Phase string
	// Step is the name of the step boundary, for ActionStep.
	Step string
}

// Observer receives the allocator's events. Observe is called with the
// allocator's locks held (all of them: DESIGN.md, Locking), in the order the events happen, from the
// goroutine whose call caused them: it must be quick and must not call the
// allocator (that would deadlock). The Action is passed by value; keep a
// copy, not a pointer.
type Observer interface {
	Observe(e Action)
}

type observerEntry struct {
	id  uint64
	obs Observer
}

// Attach registers o to receive every later event and returns a function
// that detaches it.
func (a *Allocator) Attach(o Observer) (detach func()) {
	if !a.made() {
		return func() {}
	}
	a.lockAll()
	defer a.unlockAll()
	a.nextID++
	id := a.nextID
	a.observers = append(slices.Clip(a.observers), observerEntry{id: id, obs: o})
	a.setHooksLocked()
	return func() {
		a.lockAll()
		defer a.unlockAll()
		a.observers = slices.DeleteFunc(slices.Clone(a.observers), func(e observerEntry) bool { return e.id == id })
		a.setHooksLocked()
	}
}

func (a *Allocator) notifyLocked(e Action) {
	for _, o := range a.observers {
		o.obs.Observe(e)
	}
}
