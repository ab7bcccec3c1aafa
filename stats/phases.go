// This file holds what the allocator counts by phase and by step: the
// memory of each phase of a training loop, and the groups of allocations
// whose number alive keeps growing from step to step (leaks).

package stats

import (
	"cmp"
	"slices"
)

// PhaseStats is what an allocator counts for one phase of the caller's
// program (the name given to SetPhase: "forward", "backward",
// "optimizer"...), over the blocks allocated while that phase was
// current: their bytes (the Stat of allocated_bytes, restricted to the
// phase: Current is what is still allocated, Peak the most that was at
// once) and their number (the Stat of allocation, so Allocated counts
// every allocation the phase made).
type PhaseStats struct {
	Name           string
	AllocatedBytes Stat
	Allocations    Stat
}

// Leak is a group of allocations whose number alive grew at each of the
// last Grew step boundaries (at least two): memory kept alive across
// iterations, as a list that grows every step keeps it. State made once
// (weights, optimizer moments) grows at one boundary at most and is not
// reported.
type Leak struct {
	// The group: allocations of one phase and requested size, or, when
	// call stacks are recorded, of one call site (Site) and size.
	Phase string
	Site  string
	Size  uint64
	// Alive is the number of the group's allocations alive at each of the
	// last step boundaries, oldest first; its last entry is the count at
	// the last boundary (Count), not after it.
	Alive []int64
	// Grew is the number of consecutive boundaries, ending with the last,
	// at which the count grew.
	Grew int
}

// Count returns the number of the group's allocations alive at the last
// step boundary.
func (l *Leak) Count() int64 {
	if len(l.Alive) == 0 {
		return 0
	}
	return l.Alive[len(l.Alive)-1]
}

// Bytes returns the bytes the group held at the last step boundary.
func (l *Leak) Bytes() uint64 { return uint64(l.Count()) * l.Size }

// StepCounts keeps, for each group of allocations (any comparable key),
// the number alive at the most recent step boundaries, and finds the
// groups whose number grew at each of the last boundaries. The zero value
// is ready to use and keeps DefaultStepWindow boundaries.
type StepCounts[K comparable] struct {
	// Window is the number of boundaries kept (at least 3 are needed to
	// see growth at two); 0 means DefaultStepWindow.
	Window int
	snaps  []map[K]int64 // oldest first
}

// DefaultStepWindow is the number of step boundaries a StepCounts keeps
// by default.
const DefaultStepWindow = 8

// Record adds the counts at a new step boundary. The map is kept; the
// caller must not change it afterwards.
func (s *StepCounts[K]) Record(alive map[K]int64) {
	w := s.Window
	if w <= 0 {
		w = DefaultStepWindow
	}
	s.snaps = append(s.snaps, alive)
	if len(s.snaps) > w {
		s.snaps[0] = nil
		s.snaps = s.snaps[len(s.snaps)-w:]
	}
}

// Boundaries returns the number of boundaries kept.
func (s *StepCounts[K]) Boundaries() int { return len(s.snaps) }

// Growing calls f for every group whose number alive grew at each of at
// least min of the last boundaries (min below 2 counts as 2), with the
// counts at the boundaries kept, oldest first, and the length of the
// growth. Groups are visited in no particular order.
func (s *StepCounts[K]) Growing(min int, f func(key K, alive []int64, grew int)) {
	min = max(min, 2)
	n := len(s.snaps)
	if n < min+1 {
		return
	}
	for k, last := range s.snaps[n-1] {
		grew := 0
		for i := n - 1; i > 0 && s.snaps[i][k] > s.snaps[i-1][k]; i-- {
			grew++
		}
		if grew < min {
			continue
		}
		alive := make([]int64, n)
		for i, m := range s.snaps {
			alive[i] = m[k]
		}
		alive[n-1] = last
		f(k, alive, grew)
	}
}

// SortLeaks orders leaks by bytes held at the last boundary, largest
// first, then by phase, site and size, so that reports are stable.
func SortLeaks(leaks []Leak) {
	slices.SortFunc(leaks, func(x, y Leak) int {
		if c := cmp.Compare(y.Bytes(), x.Bytes()); c != 0 {
			return c
		}
		if c := cmp.Compare(x.Phase, y.Phase); c != 0 {
			return c
		}
		if c := cmp.Compare(x.Site, y.Site); c != 0 {
			return c
		}
		return cmp.Compare(x.Size, y.Size)
	})
}
