// This file holds Validator, the checker of memtrace's stateful rules
// (which IDs are live), shared by replay and the converters.

package trace

import (
	"fmt"
	"math/bits"
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
	live idSet // live IDs, marked when the allocation failed
}

// NewValidator returns a Validator with no live blocks.
func NewValidator() *Validator {
	return &Validator{}
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
	// The two ops of nearly every line, when Op.Check has nothing to say.
	switch {
	case op.Kind == Alloc && op.Tag == "" && op.Name == "" && op.Flags == 0:
		if !v.live.add(op.ID) {
			return false, v.reused(op, line)
		}
		return false, nil
	case op.Kind == Free && op.Size == 0 && op.Stream == 0 && op.Tag == "" && op.Name == "" && op.Flags == 0:
		failed, ok := v.live.remove(op.ID)
		if !ok {
			return false, notLive(op, line)
		}
		return failed, nil
	}
	if err := op.Check(); err != nil {
		return false, &StateError{Line: line, Text: Excerpt(op.String()), Msg: err.Error()}
	}
	switch op.Kind {
	case Alloc:
		if !v.live.add(op.ID) {
			return false, v.reused(op, line)
		}
	case Free:
		failed, ok := v.live.remove(op.ID)
		if !ok {
			return false, notLive(op, line)
		}
		return failed, nil
	case RecordStream:
		failed, ok := v.live.get(op.ID)
		if !ok {
			return false, notLive(op, line)
		}
		return failed, nil
	}
	return false, nil
}

// reused is the error for an a of a live ID.
func (v *Validator) reused(op Op, line int) error {
	msg := fmt.Sprintf("ID %d is already live", op.ID)
	if failed, _ := v.live.get(op.ID); failed {
		msg += " (its allocation failed, but it was not freed)"
	}
	return &StateError{Line: line, Text: op.String(), Msg: msg}
}

// notLive is the error for an f or r of an ID that is not live.
func notLive(op Op, line int) error {
	return &StateError{Line: line, Text: op.String(), Msg: fmt.Sprintf("ID %d is not live", op.ID)}
}

// MarkFailed records that the allocation of live ID id failed: its block
// does not exist, and a later f or r of it is to be skipped.
func (v *Validator) MarkFailed(id uint64) error {
	failed, ok := v.live.get(id)
	switch {
	case !ok:
		return fmt.Errorf("memtrace: MarkFailed(%d): ID is not live", id)
	case failed:
		return fmt.Errorf("memtrace: MarkFailed(%d): already marked", id)
	}
	v.live.mark(id)
	return nil
}

// Live returns the number of live IDs, failed allocations included.
func (v *Validator) Live() int { return v.live.n }

// LiveIDs returns the live IDs in increasing order: at the end of a trace,
// the blocks it never freed.
func (v *Validator) LiveIDs() []uint64 {
	ids := make([]uint64, 0, v.live.n)
	for i, used := range v.live.used {
		if used != 0 {
			ids = append(ids, v.live.ids[i])
		}
	}
	slices.Sort(ids)
	return ids
}

// idSet is a set of IDs, each with a mark (a failed allocation): an
// open-addressing hash table with linear probing and backward-shift
// deletion, kept at most half full, so that its memory follows the number
// of live IDs and an add or a remove costs a hash and a probe or two,
// without the hashing and bookkeeping of a Go map.
type idSet struct {
	ids   []uint64
	used  []uint8 // 0: empty slot; 1: live; 2: live and marked
	shift uint8
	n     int
}

func (s *idSet) home(id uint64) int { return int((id * 0x9E3779B97F4A7C15) >> s.shift) }

// find returns the slot of id, or -1.
func (s *idSet) find(id uint64) int {
	if s.n == 0 {
		return -1
	}
	mask := len(s.ids) - 1
	for i := s.home(id); ; i = (i + 1) & mask {
		switch {
		case s.used[i] == 0:
			return -1
		case s.ids[i] == id:
			return i
		}
	}
}

// get reports whether id is in the set, and its mark.
func (s *idSet) get(id uint64) (marked, ok bool) {
	i := s.find(id)
	if i < 0 {
		return false, false
	}
	return s.used[i] == 2, true
}

// add puts id in the set, unmarked, and reports whether it was absent.
func (s *idSet) add(id uint64) bool {
	if 2*(s.n+1) > len(s.ids) {
		s.grow()
	}
	mask := len(s.ids) - 1
	i := s.home(id)
	for ; s.used[i] != 0; i = (i + 1) & mask {
		if s.ids[i] == id {
			return false
		}
	}
	s.ids[i], s.used[i] = id, 1
	s.n++
	return true
}

// mark marks id, which is in the set.
func (s *idSet) mark(id uint64) { s.used[s.find(id)] = 2 }

// remove takes id out of the set and returns its mark; ok is false when
// it was absent.
func (s *idSet) remove(id uint64) (marked, ok bool) {
	i := s.find(id)
	if i < 0 {
		return false, false
	}
	marked = s.used[i] == 2
	mask := len(s.ids) - 1
	hole := i
	for j := (i + 1) & mask; s.used[j] != 0; j = (j + 1) & mask {
		if (j-s.home(s.ids[j]))&mask >= (j-hole)&mask {
			s.ids[hole], s.used[hole] = s.ids[j], s.used[j]
			hole = j
		}
	}
	s.used[hole] = 0
	s.n--
	return marked, true
}

func (s *idSet) grow() {
	ids, used := s.ids, s.used
	size := max(2*len(ids), 64)
	s.ids, s.used = make([]uint64, size), make([]uint8, size)
	s.shift = uint8(64 - bits.Len(uint(size-1)))
	s.n = 0
	for i, u := range used {
		if u != 0 {
			s.add(ids[i])
			if u == 2 {
				s.mark(ids[i])
			}
		}
	}
}
