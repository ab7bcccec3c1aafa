// This file holds Validator, the checker of memtrace's stateful rules
// (which IDs are live), shared by replay and the converters.

package trace

import (
	"fmt"
	"slices"
)

// Validator checks the rules of memtrace that a single line cannot show:
// an f or r must name a live ID, and an a must not reuse one. Feed it every
// op in order with Check. A replay that meets an out-of-memory error on an
// a calls MarkFailed; the later f (or r) of that ID is then accepted and
// reported as one to skip, as the format asks.
//
// Its memory grows with the number of live blocks, not with the trace.
// A Validator is not safe for concurrent use.
type Validator struct {
	live map[uint64]bool // live IDs; true when the allocation failed
}

// NewValidator returns a Validator with no live blocks.
func NewValidator() *Validator {
	return &Validator{live: make(map[uint64]bool)}
}

// StateError is an op that breaks the live-ID rules. Line is the op's line
// number (0 if unknown), Text the op's memtrace line (cut to MaxQuote
// bytes, see Excerpt).
type StateError struct {
	Line int
	Text string
	Msg  string
}

func (e *StateError) Error() string {
	if e.Line == 0 {
		return fmt.Sprintf("memtrace: %q: %s", e.Text, e.Msg)
	}
	return fmt.Sprintf("memtrace line %d: %q: %s", e.Line, e.Text, e.Msg)
}

// Check applies op, read from line, to the set of live IDs. It returns
// skip = true for an f or r of a block whose allocation failed (see
// MarkFailed): the caller should not pass it to an allocator. A broken
// rule is a *StateError and changes nothing.
func (v *Validator) Check(op Op, line int) (skip bool, err error) {
	if err := op.Check(); err != nil {
		return false, &StateError{Line: line, Text: Excerpt(op.String()), Msg: err.Error()}
	}
	switch op.Kind {
	case Alloc:
		if failed, ok := v.live[op.ID]; ok {
			msg := fmt.Sprintf("ID %d is already live", op.ID)
			if failed {
				msg += " (its allocation failed, but it was not freed)"
			}
			return false, &StateError{Line: line, Text: op.String(), Msg: msg}
		}
		v.live[op.ID] = false
	case Free, RecordStream:
		failed, ok := v.live[op.ID]
		if !ok {
			return false, &StateError{Line: line, Text: op.String(),
				Msg: fmt.Sprintf("ID %d is not live", op.ID)}
		}
		if op.Kind == Free {
			delete(v.live, op.ID)
		}
		return failed, nil
	}
	return false, nil
}

// MarkFailed records that the allocation of live ID id failed: its block
// does not exist, and a later f or r of it is to be skipped.
func (v *Validator) MarkFailed(id uint64) error {
	failed, ok := v.live[id]
	switch {
	case !ok:
		return fmt.Errorf("memtrace: MarkFailed(%d): ID is not live", id)
	case failed:
		return fmt.Errorf("memtrace: MarkFailed(%d): already marked", id)
	}
	v.live[id] = true
	return nil
}

// Live returns the number of live IDs, failed allocations included.
func (v *Validator) Live() int { return len(v.live) }

// LiveIDs returns the live IDs in increasing order: at the end of a trace,
// the blocks it never freed.
func (v *Validator) LiveIDs() []uint64 {
	ids := make([]uint64, 0, len(v.live))
	for id := range v.live {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}
