// This file holds phases and steps: the caller names the phase of its
// program it is in and marks step boundaries; the allocator counts memory
// by phase and finds the allocations whose number keeps growing from step
// to step.

package allocator

import (
	"slices"

	"github.com/gpumem/gpumem/stats"
)

// Phases: SetPhase names the phase the caller is in ("forward",
// "backward", "optimizer"...), and every block allocated from then on
// carries it, until the next SetPhase. The allocator keeps, per phase, the
// bytes and number of its blocks (stats.PhaseStats), updated by the ledger
// with the rest of the stats; an out-of-memory error names the phase it
// happened in and the live bytes of each phase. The phase is the
// allocator's, not a goroutine's: a program whose goroutines run different
// phases on one device at once should not set phases.
//
// Phase names are interned: the first maxPhases distinct names get a slot
// each, later ones share the slot named otherPhase. The phase before any
// SetPhase is the empty name.
//
// Steps: MarkStep marks a step boundary (the start of a training step or
// of a request). At each boundary the allocator counts the allocated
// blocks by (phase, requested size) and keeps the counts of the last
// stats.DefaultStepWindow boundaries; Leaks reports the groups whose count
// grew at each of the last two boundaries or more. Counting walks the
// allocated blocks once per boundary.
const (
	maxPhases  = 1024
	otherPhase = "(other phases)"
)

// phaseState is one phase's name and counts. Guarded by Allocator.mu.
type phaseState struct {
	name        string
	bytes       stats.Stat // allocated bytes of the phase's blocks
	allocations stats.Stat // the phase's allocated blocks
}

// leakKey groups allocations for leak detection.
type leakKey struct {
	phase uint16
	size  uint64
}

// SetPhase makes name the current phase and returns the previous one.
// Blocks allocated from now on belong to it.
func (a *Allocator) SetPhase(name string) (previous string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	previous = a.phases[a.phase].name
	a.phase = a.phaseIDLocked(name)
	a.phaseSetLocked(a.phases[a.phase].name)
	return previous
}

// EnterPhase makes name the current phase and returns a function that
// restores the phase current before, for a scope:
//
//	defer a.EnterPhase("backward")()
func (a *Allocator) EnterPhase(name string) (restore func()) {
	prev := a.SetPhase(name)
	return func() { a.SetPhase(prev) }
}

// Phase returns the current phase.
func (a *Allocator) Phase() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.phases[a.phase].name
}

// phaseIDLocked returns the slot of the phase called name, making one if
// there is room.
func (a *Allocator) phaseIDLocked(name string) uint16 {
	if id, ok := a.phaseIDs[name]; ok {
		return id
	}
	if len(a.phases) >= maxPhases {
		name = otherPhase
		if id, ok := a.phaseIDs[name]; ok {
			return id
		}
	}
	id := uint16(len(a.phases))
	a.phases = append(a.phases, phaseState{name: name})
	a.phaseIDs[name] = id
	return id
}

// PhaseStats returns the counts of every phase that has allocated
// memory, in the order the phases were first named (the phase before any
// SetPhase, named "", first when it allocated anything).
func (a *Allocator) PhaseStats() []stats.PhaseStats {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make([]stats.PhaseStats, 0, len(a.phases))
	for _, ph := range a.phases {
		if ph.allocations.Allocated == 0 && ph.allocations.Current == 0 {
			continue
		}
		out = append(out, stats.PhaseStats{Name: ph.name, AllocatedBytes: ph.bytes, Allocations: ph.allocations})
	}
	return out
}

// MarkStep marks a step boundary named name (the start of a training step
// or of a request) and records how many blocks of each (phase, requested
// size) group are allocated, for Leaks.
func (a *Allocator) MarkStep(name string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	alive := make(map[leakKey]int64)
	a.live.each(func(b *block) {
		alive[leakKey{b.phase, b.requested}]++
	})
	a.steps.Record(alive)
	a.stepMarkedLocked(name)
}

// Leaks returns the groups of allocations whose number alive grew at each
// of the last two step boundaries or more (see MarkStep), largest first;
// it needs three boundaries at least. The groups are by call site and
// requested size when an attached observer records call stacks
// (LeakReporter, such as trace/record's Recorder with stacks), otherwise
// by phase and requested size.
func (a *Allocator) Leaks() []stats.Leak {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, o := range a.observers {
		if r, ok := o.obs.(LeakReporter); ok {
			if leaks, ok := r.Leaks(); ok {
				return leaks
			}
		}
	}
	var out []stats.Leak
	a.steps.Growing(2, func(k leakKey, alive []int64, grew int) {
		out = append(out, stats.Leak{Phase: a.phases[k.phase].name, Size: k.size, Alive: alive, Grew: grew})
	})
	stats.SortLeaks(out)
	return out
}

// liveByPhaseLocked returns the allocated bytes of every phase that holds
// some, largest first.
func (a *Allocator) liveByPhaseLocked() []PhaseBytes {
	var out []PhaseBytes
	for _, ph := range a.phases {
		if ph.bytes.Current > 0 {
			out = append(out, PhaseBytes{Phase: ph.name, Bytes: uint64(ph.bytes.Current)})
		}
	}
	slices.SortStableFunc(out, func(x, y PhaseBytes) int {
		switch {
		case x.Bytes > y.Bytes:
			return -1
		case x.Bytes < y.Bytes:
			return 1
		}
		return 0
	})
	return out
}

// PhaseBytes is the memory that blocks of one phase hold.
type PhaseBytes struct {
	Phase string
	Bytes uint64
}
