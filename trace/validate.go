// This file holds Validator, the checker of memtrace's stateful rules
// (which IDs are live, which pools exist, are paused, and which streams
// are routed or capture), shared by replay and the converters.

package trace

import (
	"fmt"
	"math/bits"
	"slices"
)

// Validator checks the rules of memtrace that a single line cannot show:
// an f or r must name a live ID, and an a must not reuse one; a pool line
// must name a pool made by a P line and not dropped since, and a P line
// must not name one; a stream is routed (u) or captures (g) into one pool
// at a time, u - ends a route and e a capture, each of a stream that has
// one; a pool is dropped (d) only while no stream uses it and it is not
// paused; z pauses a pool that is not paused, w resumes a paused one,
// and a paused pool is not routed to or captured into. Feed it every
// op in order with Check. A replay that meets an out-of-memory error on an
// a calls MarkFailed; the later f (or r) of that ID is then accepted and
// reported as one to skip, as the format asks.
//
// Its memory grows with the number of live blocks, not with the trace,
// but for one byte per ID below 2^22 up to the largest used (see idSet).
//
// A Validator is not safe for concurrent use.
type Validator struct {
	live idSet // live IDs, marked when the allocation failed

	pools  map[string]*poolState // made and not dropped, by name
	routes map[uint64]route      // streams routed to a pool or capturing into one
}

// poolState is what the Validator knows of a pool.
type poolState struct {
	paused bool
	users  int // streams routed to it or capturing into it
}

// route is a stream's pool: by u (capture false) or g (capture true).
type route struct {
	pool    string
	capture bool
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
	case MakePool, UsePool, BeginCapture, EndCapture, PausePool, ResumePool, DropPool:
		if msg := v.pool(op); msg != "" {
			return false, &StateError{Line: line, Text: Excerpt(op.String()), Msg: msg}
		}
	}
	return false, nil
}

// CheckBatch applies ops, read from lines (lines[i] is the line of
// ops[i]; the ops past the end of lines are left out), in order, as
// Check does one op at a time, and stops at the first broken rule: it
// returns the number of ops applied and, if it stopped early, Check's
// error for the next one, which changes nothing. It reports no skips: a
// caller that calls MarkFailed uses Check.
func (v *Validator) CheckBatch(ops []Op, lines []int) (int, error) {
	ops = ops[:min(len(ops), len(lines))]
	lines = lines[:len(ops)]
	for i := range ops {
		op := &ops[i]
		// Check's first two cases, without copying the op; a broken rule
		// changes nothing, so Check finds it again below.
		switch {
		case op.Kind == Alloc && op.Tag == "" && op.Name == "":
			if v.live.add(op.ID) {
				continue
			}
		case op.Kind == Free && op.Size == 0 && op.Stream == 0 && op.Tag == "" && op.Name == "":
			if _, ok := v.live.remove(op.ID); ok {
				continue
			}
		}
		if _, err := v.Check(*op, lines[i]); err != nil {
			return i, err
		}
	}
	return len(ops), nil
}

// pool applies the pool line op (valid on its own) to the pools and
// routes, or returns the rule it breaks and changes nothing.
func (v *Validator) pool(op Op) string {
	if v.pools == nil {
		v.pools, v.routes = map[string]*poolState{}, map[uint64]route{}
	}
	r, routed := v.routes[op.Stream]
	switch op.Kind {
	case EndCapture:
		if !routed || !r.capture {
			return fmt.Sprintf("stream %d is not capturing (no g line began a capture on it)", op.Stream)
		}
		v.pools[r.pool].users--
		delete(v.routes, op.Stream)
		return ""
	case UsePool, BeginCapture:
		if op.Kind == UsePool && op.Name == DefaultPool {
			switch {
			case !routed:
				return fmt.Sprintf("stream %d is not routed to a pool", op.Stream)
			case r.capture:
				return fmt.Sprintf("stream %d captures into pool %s; an e line ends the capture", op.Stream, Quote(r.pool))
			}
			v.pools[r.pool].users--
			delete(v.routes, op.Stream)
			return ""
		}
	}
	p := v.pools[op.Name]
	if op.Kind == MakePool {
		if p != nil {
			return fmt.Sprintf("pool %s exists (drop it with a d line first)", Quote(op.Name))
		}
		v.pools[op.Name] = &poolState{}
		return ""
	}
	if p == nil {
		return fmt.Sprintf("no pool named %s (make it with a P line; a d line drops it)", Quote(op.Name))
	}
	switch op.Kind {
	case UsePool, BeginCapture:
		switch {
		case routed && r.capture:
			return fmt.Sprintf("stream %d captures into pool %s already", op.Stream, Quote(r.pool))
		case routed:
			return fmt.Sprintf("stream %d is already routed to pool %s (u - %d routes it back)", op.Stream, Quote(r.pool), op.Stream)
		case p.paused:
			return fmt.Sprintf("pool %s is paused (a w line resumes it)", Quote(op.Name))
		}
		p.users++
		v.routes[op.Stream] = route{op.Name, op.Kind == BeginCapture}
	case PausePool:
		if p.paused {
			return fmt.Sprintf("pool %s is paused already", Quote(op.Name))
		}
		p.paused = true
	case ResumePool:
		if !p.paused {
			return fmt.Sprintf("pool %s is not paused", Quote(op.Name))
		}
		p.paused = false
	case DropPool:
		switch {
		case p.users > 0:
			return fmt.Sprintf("pool %s is in use on %d stream(s) (u - or e lines end that)", Quote(op.Name), p.users)
		case p.paused:
			return fmt.Sprintf("pool %s is paused (a w line resumes it before its d)", Quote(op.Name))
		}
		delete(v.pools, op.Name)
	}
	return ""
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
	for id, st := range v.live.dense {
		if st != 0 {
			ids = append(ids, uint64(id))
		}
	}
	for i, used := range v.live.used {
		if used != 0 {
			ids = append(ids, v.live.ids[i])
		}
	}
	slices.Sort(ids)
	return ids
}

// maxDenseID bounds the IDs that idSet keeps in its dense table.
const maxDenseID = 1 << 22

// idSet is a set of IDs, each with a mark (a failed allocation). IDs below
// maxDenseID, those of nearly every trace (which numbers its blocks from
// 0), index a table of one byte each, grown to the largest such ID seen
// (at most 4 MiB); the others are kept in an open-addressing hash table
// with linear probing and backward-shift deletion, kept at most half
// full, so that its memory follows the number of live IDs and an add or
// a remove costs a hash and a probe or two, without the hashing and
// bookkeeping of a Go map.
type idSet struct {
	dense []uint8 // by ID below maxDenseID: 0 absent; 1 live; 2 live and marked

	ids    []uint64 // the hash table of the IDs from maxDenseID up
	used   []uint8  // 0: empty slot; 1: live; 2: live and marked
	shift  uint8
	hashed int // IDs in the hash table

	n int // IDs in the set
}

func (s *idSet) home(id uint64) int { return int((id * 0x9E3779B97F4A7C15) >> s.shift) }

// find returns the slot of id (at least maxDenseID) in the hash table, or
// -1.
func (s *idSet) find(id uint64) int {
	if s.hashed == 0 {
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
	if id < maxDenseID {
		if id < uint64(len(s.dense)) {
			return s.dense[id] == 2, s.dense[id] != 0
		}
		return false, false
	}
	i := s.find(id)
	if i < 0 {
		return false, false
	}
	return s.used[i] == 2, true
}

// add puts id in the set, unmarked, and reports whether it was absent.
func (s *idSet) add(id uint64) bool {
	if id < maxDenseID {
		if id >= uint64(len(s.dense)) {
			n := min(max(2*len(s.dense), int(id)+1, 1024), maxDenseID)
			s.dense = append(s.dense, make([]uint8, n-len(s.dense))...)
		}
		if s.dense[id] != 0 {
			return false
		}
		s.dense[id] = 1
		s.n++
		return true
	}
	if 2*(s.hashed+1) > len(s.ids) {
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
	s.hashed++
	s.n++
	return true
}

// mark marks id, which is in the set.
func (s *idSet) mark(id uint64) {
	if id < maxDenseID {
		s.dense[id] = 2
		return
	}
	s.used[s.find(id)] = 2
}

// remove takes id out of the set and returns its mark; ok is false when
// it was absent.
func (s *idSet) remove(id uint64) (marked, ok bool) {
	if id < maxDenseID {
		if id >= uint64(len(s.dense)) || s.dense[id] == 0 {
			return false, false
		}
		marked = s.dense[id] == 2
		s.dense[id] = 0
		s.n--
		return marked, true
	}
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
	s.hashed--
	s.n--
	return marked, true
}

// grow doubles the hash table.
func (s *idSet) grow() {
	ids, used := s.ids, s.used
	size := max(2*len(ids), 64)
	s.ids, s.used = make([]uint64, size), make([]uint8, size)
	s.shift = uint8(64 - bits.Len(uint(size-1)))
	s.n -= s.hashed
	s.hashed = 0
	for i, u := range used {
		if u != 0 {
			s.add(ids[i])
			if u == 2 {
				s.mark(ids[i])
			}
		}
	}
}
