// Package memlog logs an allocator's memory through log/slog while a
// program runs: a memory line every N steps, each new peak with the phase
// and step in which it was reached, and each out-of-memory error. It is
// the "print the memory every few steps" of a training loop, ready made.
//
//	rep, err := memlog.New(a, logger, memlog.Options{Every: 100})
//	...
//	defer rep.Close()
//	for i := range steps {
//		rep.Step(strconv.Itoa(i)) // a.MarkStep, then log what is due
//		...
//	}
//
// # Model
//
// A Reporter is an allocator.Observer. The allocator calls its Observe
// with the allocator's locks held, for every action: there it only counts,
// in a few arithmetic operations under a mutex of its own. It follows
// allocated bytes (alloc and free_requested actions) and reserved bytes
// (segment_alloc, segment_free, segment_map, segment_unmap actions) from
// the figures the actions carry, so it knows the moment each reaches a
// new high, and the phase and step current then; it counts step
// boundaries (MarkStep) and notes when a memory line is due. It never
// logs, reads the allocator or blocks in Observe: a slow log handler, or
// one that reads the allocator (which would deadlock), must not run under
// the allocator's locks.
//
// The logging happens outside the lock, in the caller's goroutine, when
// the caller asks: Step marks a step boundary (the allocator's MarkStep)
// and then logs what is due; Flush logs what is due without marking a
// step; Close logs what is left and detaches the reporter. An
// out-of-memory error also logs, from the allocator's OnOutOfMemory hook,
// which runs outside the lock in the goroutine whose Alloc failed. The
// Reporter starts no goroutine. A program that marks steps with the
// allocator's MarkStep directly (a replay, say) calls Flush after it; the
// boundaries are counted either way.
//
// # What is logged
//
// Every Every-th step boundary logs the memory line (message "gpu
// memory"): the device, the step's name, the number of boundaries so far,
// the phase current at the boundary, stats.Line's human form and the
// allocator's stats as a group of byte counts (allocated, reserved,
// max_allocated, max_reserved; see stats.DeviceStats.LogValue), read
// when the line is written. If several lines fell due before a Flush,
// only the last is written, with a count of the skipped ones.
//
// A new peak (message "gpu memory peak") is logged for allocated bytes
// (key allocated_bytes.all.peak) and reserved bytes
// (reserved_bytes.all.peak) separately, with the peak in bytes and the
// phase and step in which it was reached. To avoid flooding the log while
// memory climbs, a peak is logged only when it exceeds the last logged
// peak of its kind by PeakGrowth (5% by default), and at most once per
// step: a peak reached in the step already reported waits for the next
// step boundary's Flush, and the peak then reported is the highest reached
// meanwhile. Close reports a peak still waiting.
//
// An out-of-memory error (message "gpu out of memory", level Error) logs
// the phase it happened in, the bytes requested and the stats, after
// anything else due, so that the last peak and its phase come first (the
// once-per-step limit does not hold it back then).
//
// # Exactness
//
// A peak is new when it is above every value the reporter has seen,
// starting from the allocator's peaks when the reporter was created (a
// peak reached before is not reported); a ResetPeakStats of the allocator
// does not lower the bar. The reporter starts from the allocator's stats
// read when New attaches it: create it before other goroutines use the
// allocator, or its peaks may be off by what those goroutines allocated
// between that read and the attachment. The memory lines are the
// allocator's own stats and are always exact.
package memlog

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sync"

	"github.com/gpumem/gpumem/allocator"
	"github.com/gpumem/gpumem/stats"
)

// Defaults for the zero Options.
const (
	DefaultEvery      = 100  // steps between two memory lines
	DefaultPeakGrowth = 0.05 // a new peak is logged once 5% above the last one logged
)

// The keys of the two peaks, as the stat attribute of a peak record names
// them (PyTorch's memory_stats keys).
const (
	AllocatedPeakKey = "allocated_bytes.all.peak"
	ReservedPeakKey  = "reserved_bytes.all.peak"
)

// Options configure a Reporter. The zero Options log a memory line every
// DefaultEvery steps and peaks as DefaultPeakGrowth says, at level Info.
type Options struct {
	// Every is the number of step boundaries between two memory lines: 1
	// logs one at every boundary. 0 means DefaultEvery; a negative value
	// logs no memory lines (peaks and out-of-memory errors only).
	Every int

	// PeakGrowth is how much a peak must exceed the last logged peak of
	// its kind, as a fraction of it, to be logged (0.05 is 5%). 0 means
	// DefaultPeakGrowth; a negative value logs every new peak (still at
	// most once per step).
	PeakGrowth float64

	// NoPeaks turns off the peak records.
	NoPeaks bool

	// Level is the level of the memory lines and peak records; the zero
	// value is slog.LevelInfo. Out-of-memory errors are logged at
	// slog.LevelError.
	Level slog.Level
}

// Reporter logs one allocator's memory. Create it with New; it is safe for
// concurrent use.
type Reporter struct {
	a      *allocator.Allocator
	log    *slog.Logger
	device int
	every  int64
	growth float64
	peaks  bool
	level  slog.Level

	detach    func()
	removeOOM func()

	mu sync.Mutex // guards everything below; never held while calling the allocator or the logger

	closed bool
	phase  string // the allocator's current phase
	step   string // the name of the last step boundary
	steps  int64  // step boundaries seen

	allocated, reserved int64 // followed from the actions
	peak                [2]peak
	peakLoggedAt        int64 // steps when a peak was last logged; -1 before any

	lineDue     bool // a memory line is due
	lineStep    string
	lineSteps   int64
	linePhase   string
	lineSkipped int64 // lines due that a later one replaced before a Flush
}

// The two peaks followed.
const (
	allocatedPeak = iota
	reservedPeak
)

// peak is a high of allocated or reserved bytes: its value, where it was
// reached, and the value last logged.
type peak struct {
	value  int64
	phase  string
	step   string
	logged int64
}

// New attaches a Reporter to a that logs through logger (slog.Default()
// when nil). Call Close to detach it.
func New(a *allocator.Allocator, logger *slog.Logger, opt Options) (*Reporter, error) {
	if a == nil {
		return nil, errors.New("memlog: New needs an allocator")
	}
	if math.IsNaN(opt.PeakGrowth) || math.IsInf(opt.PeakGrowth, 0) {
		return nil, fmt.Errorf("memlog: PeakGrowth %v is not a finite fraction", opt.PeakGrowth)
	}
	if logger == nil {
		logger = slog.Default()
	}
	r := &Reporter{
		a:            a,
		log:          logger,
		device:       a.Device().Ordinal(),
		every:        int64(opt.Every),
		growth:       opt.PeakGrowth,
		peaks:        !opt.NoPeaks,
		level:        opt.Level,
		peakLoggedAt: -1,
	}
	if r.every == 0 {
		r.every = DefaultEvery
	}
	if r.growth == 0 {
		r.growth = DefaultPeakGrowth
	}
	// The starting point. Actions of other goroutines between this read
	// and Attach are missed (see Exactness in the package doc).
	st := a.Stats()
	r.phase = a.Phase()
	r.allocated, r.reserved = st.Allocated(), st.Reserved()
	r.peak[allocatedPeak] = peak{value: st.MaxAllocated(), logged: st.MaxAllocated()}
	r.peak[reservedPeak] = peak{value: st.MaxReserved(), logged: st.MaxReserved()}
	r.detach = a.Attach(r)
	r.removeOOM = a.OnOutOfMemory(r.outOfMemory)
	return r, nil
}

// Observe implements allocator.Observer; the allocator calls it with its
// lock held. It counts and notes what is due, and logs nothing.
func (r *Reporter) Observe(e allocator.Action) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return
	}
	switch e.Kind {
	case allocator.ActionAlloc:
		r.allocated += int64(e.Size)
		r.raiseLocked(allocatedPeak, r.allocated, e.Phase)
	case allocator.ActionFreeRequested:
		r.allocated -= int64(e.Size)
	case allocator.ActionSegmentAlloc, allocator.ActionSegmentMap:
		r.reserved += int64(e.Size)
		r.raiseLocked(reservedPeak, r.reserved, r.phase)
	case allocator.ActionSegmentFree, allocator.ActionSegmentUnmap:
		r.reserved -= int64(e.Size)
	case allocator.ActionPhase:
		r.phase = e.Phase
	case allocator.ActionStep:
		r.steps++
		r.step, r.phase = e.Step, e.Phase
		if r.every > 0 && r.steps%r.every == 0 {
			if r.lineDue {
				r.lineSkipped++
			}
			r.lineDue, r.lineStep, r.lineSteps, r.linePhase = true, e.Step, r.steps, e.Phase
		}
	}
}

// raiseLocked records value as peak i if it is a new high.
func (r *Reporter) raiseLocked(i int, value int64, phase string) {
	if p := &r.peak[i]; value > p.value {
		p.value, p.phase, p.step = value, phase, r.step
	}
}

// Step marks a step boundary named name in the allocator (MarkStep) and
// logs what is due: the memory line if this is an Every-th boundary, a
// new peak reached since the last one logged.
func (r *Reporter) Step(name string) {
	r.a.MarkStep(name)
	r.Flush()
}

// Flush logs what is due, without marking a step boundary: a memory line
// due since the last Flush, and a new peak unless one was already logged
// in the current step. Call it after marking steps with the allocator's
// MarkStep; Step calls it itself.
func (r *Reporter) Flush() { r.flush(false) }

// Close detaches the reporter from the allocator and logs what is still
// due, a peak reached in the last step included. Later calls do nothing.
func (r *Reporter) Close() {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return
	}
	r.closed = true
	r.mu.Unlock()
	r.detach()
	r.removeOOM()
	r.flush(true)
}

// record is one log record to write, decided under r.mu and written after.
type record struct {
	msg   string
	attrs []slog.Attr
}

// flush decides under r.mu what is due and logs it after releasing it.
// force lifts the once-per-step limit on peaks.
func (r *Reporter) flush(force bool) {
	var out []record
	r.mu.Lock()
	if r.lineDue {
		attrs := []slog.Attr{
			slog.Int("device", r.device),
			slog.String("step", r.lineStep),
			slog.Int64("steps", r.lineSteps),
			slog.String("phase", r.linePhase),
		}
		if r.lineSkipped > 0 {
			attrs = append(attrs, slog.Int64("skipped", r.lineSkipped))
		}
		out = append(out, record{msg: "gpu memory", attrs: attrs})
		r.lineDue, r.lineSkipped = false, 0
	}
	if r.peaks && (force || r.steps != r.peakLoggedAt) {
		logged := false
		for i, key := range [...]string{AllocatedPeakKey, ReservedPeakKey} {
			p := &r.peak[i]
			if !r.grownLocked(p) {
				continue
			}
			out = append(out, record{msg: "gpu memory peak", attrs: []slog.Attr{
				slog.Int("device", r.device),
				slog.String("stat", key),
				slog.Int64("peak", p.value),
				slog.String("phase", p.phase),
				slog.String("step", p.step),
			}})
			p.logged = p.value
			logged = true
		}
		if logged {
			r.peakLoggedAt = r.steps
		}
	}
	r.mu.Unlock()
	if len(out) == 0 || !r.log.Enabled(context.Background(), r.level) {
		return
	}
	r.write(r.level, out, r.a.Stats())
}

// grownLocked reports whether p has grown enough since it was last logged.
func (r *Reporter) grownLocked(p *peak) bool {
	if p.value <= p.logged {
		return false
	}
	if r.growth < 0 || p.logged <= 0 {
		return true
	}
	return float64(p.value) >= float64(p.logged)*(1+r.growth)
}

// write logs the records with the stats st appended to each.
func (r *Reporter) write(level slog.Level, out []record, st stats.DeviceStats) {
	ctx := context.Background()
	line := stats.Line(&st)
	for _, rec := range out {
		attrs := append(rec.attrs, slog.String("line", line), slog.Any("memory", st))
		r.log.LogAttrs(ctx, level, rec.msg, attrs...)
	}
}

// outOfMemory runs from the allocator's OnOutOfMemory hook, outside its
// lock: it logs what is due (the peak that led here, first, even if a peak
// was already logged in this step), then the error.
func (r *Reporter) outOfMemory(e *allocator.OutOfMemoryError) {
	r.flush(true)
	if !r.log.Enabled(context.Background(), slog.LevelError) {
		return
	}
	r.write(slog.LevelError, []record{{msg: "gpu out of memory", attrs: []slog.Attr{
		slog.Int("device", r.device),
		slog.String("phase", e.Phase),
		slog.Uint64("requested", e.Requested),
		slog.Uint64("alloc_size", e.AllocSize),
		slog.Uint64("held_elsewhere", e.HeldElsewhere),
	}}}, r.a.Stats())
}
