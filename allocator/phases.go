// This file holds phases and steps: the caller names the phase of its
// program it is in and marks step boundaries; the allocator counts memory
// by phase and finds the allocations whose number keeps growing from step
// to step.

package allocator

import (
	"slices"

	"github.com/gpumem/gpumem/allocator/internal/freeindex"
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
// Counting: until a second phase is named, every block is of the first
// phase, whose counts are then those of allocation and allocated_bytes
// (all pools), and nothing more is counted. From the second phase on
// (Allocator.phased), each shard counts its blocks' bytes and number per
// phase (shard.ph), as it counts the other stats, and each phase's bytes
// and blocks are two rows of the peaks (phaseRow), kept by the same
// machinery as the other stats' (counters.go, the peaks package):
// per-shard limits that add up to at most the peak, passed only by a
// change that may make a new peak, which then raises it (with one shard),
// or raises it in the world, or waits for a cut that counts the
// operations waiting for it one after another. So the phase stats are
// exact under concurrency as the others are: the peaks are those of the
// order the stats follow (DESIGN.md, Locking), for one goroutine the order
// of its calls.
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

// phaseInfo is one phase: its name. (Its peaks are rows of the peaks,
// phaseRow, while blocks are counted by phase.)
type phaseInfo struct {
	name string
}

// phaseCount is one phase's counts on one shard: the bytes and the number
// of its allocated blocks, with their limits (see count); the ledger
// changes them (add, sub).
type phaseCount struct {
	bytes, blocks count
}

// of returns the bytes (j = 0) or blocks (j = 1) count.
func (c *phaseCount) of(j int) *count {
	if j == 0 {
		return &c.bytes
	}
	return &c.blocks
}

// phaseCount returns the shard's counts of phase id, making room for
// them on its first block of that phase.
func (sh *shard) phaseCount(id uint16) *phaseCount {
	if int(id) >= len(sh.ph) {
		sh.ph = append(sh.ph, make([]phaseCount, int(id)+1-len(sh.ph))...)
	}
	return &sh.ph[id]
}

// peekPhase returns the shard's counts of phase id, or nil when it has
// none (all zero).
func (sh *shard) peekPhase(id uint16) *phaseCount {
	if int(id) < len(sh.ph) {
		return &sh.ph[id]
	}
	return nil
}

// leakKey groups allocations for leak detection.
type leakKey struct {
	phase uint16
	size  uint64
}

// SetPhase makes name the current phase and returns the previous one.
// Blocks allocated from now on belong to it.
func (a *Allocator) SetPhase(name string) (previous string) {
	if !a.made() {
		return ""
	}
	a.lockAll()
	defer a.unlockAll()
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
	if !a.made() {
		return ""
	}
	a.lockAll()
	defer a.unlockAll()
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
	if !a.phased {
		a.phasesStartedLocked()
	}
	id := uint16(len(a.phases))
	a.phases = append(a.phases, phaseInfo{name: name})
	a.phaseIDs[name] = id
	a.phaseAddedLocked()
	return id
}

// phaseStatsLocked returns the bytes and blocks of phase id as stats.
func (a *Allocator) phaseStatsLocked(id uint16) (bytes, blocks stats.Stat) {
	if !a.phased { // one phase: its counts are allocation's and allocated_bytes'
		var arr stats.StatArray
		a.sumLocked(int(stats.AllocatedBytes), &arr)
		bytes = arr[stats.All]
		a.sumLocked(int(stats.Allocation), &arr)
		return bytes, arr[stats.All]
	}
	var out [2]stats.Stat
	for _, o := range a.shards {
		if oc := o.peekPhase(id); oc != nil {
			for j := range 2 {
				n := oc.of(j)
				out[j].Current += n.Value()
				out[j].Allocated += n.increases
				out[j].Freed += n.decreases(n.Value(), n.increases)
			}
		}
	}
	out[0].Peak, out[1].Peak = a.peaks.Peak(phaseRow(id, 0)), a.peaks.Peak(phaseRow(id, 1))
	return out[0], out[1]
}

// PhaseStats returns the counts of every phase that has allocated
// memory, in the order the phases were first named (the phase before any
// SetPhase, named "", first when it allocated anything).
func (a *Allocator) PhaseStats() []stats.PhaseStats {
	if !a.made() {
		return nil
	}
	a.lockAll()
	defer a.unlockAll()
	out := make([]stats.PhaseStats, 0, len(a.phases))
	for id, ph := range a.phases {
		bytes, blocks := a.phaseStatsLocked(uint16(id))
		if blocks.Allocated == 0 && blocks.Current == 0 {
			continue
		}
		out = append(out, stats.PhaseStats{Name: ph.name, AllocatedBytes: bytes, Allocations: blocks})
	}
	return out
}

// MarkStep marks a step boundary named name (the start of a training step
// or of a request) and records how many blocks of each (phase, requested
// size) group are allocated, for Leaks. Under PolicyPlanned it is also
// where the step just seen is planned, if it repeats the one before it or
// fits the largest sizes of the steps before it, and where a plan is
// kept or ended; the first mark stops the policy's own search for steps.
func (a *Allocator) MarkStep(name string) {
	if !a.made() {
		return
	}
	a.lockAll()
	defer a.unlockAll()
	if p := a.pol; p != nil && p.plan != nil {
		p.plan.auto, p.plan.autoDue = nil, false // the program marks its steps
	}
	a.steps.Record(a.markStepLocked())
	if a.pol != nil && a.pol.plan != nil {
		a.planStepLocked() // planned policy: plan the step just seen
	}
	a.stepMarkedLocked(name)
}

// Leaks returns the groups of allocations whose number alive grew at each
// of the last two step boundaries or more (see MarkStep), largest first;
// it needs three boundaries at least. The groups are by call site and
// requested size when an attached observer records call stacks
// (LeakReporter, such as trace/record's Recorder with stacks), otherwise
// by phase and requested size.
func (a *Allocator) Leaks() []stats.Leak {
	if !a.made() {
		return nil
	}
	a.lockAll()
	defer a.unlockAll()
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
	for id, ph := range a.phases {
		if bytes, _ := a.phaseStatsLocked(uint16(id)); bytes.Current > 0 {
			out = append(out, PhaseBytes{Phase: ph.name, Bytes: uint64(bytes.Current)})
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

// checkPhasesLocked adds the phases' invariants to CheckInvariants: the
// current phase and every block's phase are phases (so 0, the first,
// until others are named: the hand-out writes a block's phase only while
// blocks are counted by phase); while blocks are counted by phase, every
// shard's count of a phase equals its allocated blocks of that phase,
// and the peaks have two rows per phase (their limits and peaks are
// checked with the other rows, checkPeaksLocked).
func (a *Allocator) checkPhasesLocked(bad func(format string, args ...any)) {
	if a.phase >= uint16(len(a.phases)) {
		bad("the current phase %d is not a phase", a.phase)
	}
	want := map[*shard][][2]int64{}
	for _, sh := range a.shards {
		sh.live.Each(func(b *freeindex.Block) {
			if int(b.Phase) >= len(a.phases) {
				bad("block %v has phase %d, which is not a phase", b.Ptr(), b.Phase)
				return
			}
			w := want[sh]
			if len(w) <= int(b.Phase) {
				w = append(w, make([][2]int64, int(b.Phase)+1-len(w))...)
			}
			w[b.Phase][0] += int64(b.Size())
			w[b.Phase][1]++
			want[sh] = w
		})
	}
	rows := numStatRows
	if a.phased {
		rows += 2 * len(a.phases)
	}
	if a.peaks.Rows() != rows {
		bad("the peaks have %d rows, want %d (phases counted: %v, %d phases)", a.peaks.Rows(), rows, a.phased, len(a.phases))
	}
	if !a.phased {
		return
	}
	for id := range a.phases {
		for j := range 2 {
			for _, sh := range a.shards {
				var v, w int64
				if c := sh.peekPhase(uint16(id)); c != nil {
					v = c.of(j).Value()
				}
				if ws := want[sh]; id < len(ws) {
					w = ws[id][j]
				}
				if pv, paused := a.parkedPhaseLocked(sh, id, j); paused {
					// A paused pool's blocks leave their phases; what it
					// parked is what they say.
					if v != 0 || pv != w {
						bad("phase %q of stream %d in a paused pool: count %d is %d, parked %d, blocks say %d", a.phases[id].name, sh.stream, j, v, pv, w)
					}
				} else if v != w {
					bad("phase %q of stream %d: count %d is %d, blocks say %d", a.phases[id].name, sh.stream, j, v, w)
				}
			}
		}
	}
}
