// This file holds Run, which drives an allocator from a trace.

package replay

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/gpumem/gpumem/allocator"
	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/stats"
	"github.com/gpumem/gpumem/trace"
)

// Target is what Run drives. *allocator.Allocator, *allocator.Passthrough
// and *allocator.Async (backend:cudaMallocAsync) implement it.
type Target interface {
	Alloc(size uint64, s device.Stream) (device.Ptr, error)
	Free(p device.Ptr) error
	RecordStream(p device.Ptr, s device.Stream) error
	EmptyCache() error
	Stats() stats.DeviceStats
}

// StreamHolder is what a device must offer for memtrace's stream rule
// (trace/FORMAT.md): work queued on a stream other than 0 counts as still
// running until an s line for that stream or an S line, so that an event
// recorded on it (for a block freed after an r line) completes only then.
// *sim.Device implements it. Run holds every stream it creates busy on a
// device that is a StreamHolder; on any other device (a real GPU) streams
// run as they do, and the rule cannot be enforced.
type StreamHolder interface {
	// SetStreamBusy(s, true) holds the work queued on s, so that events
	// recorded on s do not complete; SynchronizeStream(s) and Synchronize
	// finish it.
	SetStreamBusy(s device.Stream, busy bool) error
}

// Phaser is a Target that counts memory by phase, as *allocator.Allocator
// does: Run calls SetPhase at each t line (an empty tag for a bare t), so
// that the allocations that follow carry the phase.
type Phaser interface {
	SetPhase(name string) (previous string)
	PhaseStats() []stats.PhaseStats
}

// Stepper is a Target that watches step boundaries for leaks, as
// *allocator.Allocator does: Run calls MarkStep at each step mark (an m
// line, or a "# mark NAME" comment).
type Stepper interface {
	MarkStep(name string)
	Leaks() []stats.Leak
}

// Planner is a Target that plans repeated steps, as *allocator.Allocator
// does under gpumem_policy:planned: Run reports its figures in
// Result.Plan when PlanStats reports them (true).
type Planner interface {
	PlanStats() (allocator.PlanStats, bool)
}

// Options configures Run.
type Options struct {
	// Phases fills Result.Phases, and Leaks fills Result.Leaks, for a
	// Target that is a Phaser or a Stepper.
	Phases, Leaks bool

	// Name is reported as Result.Trace.
	Name string
	// Progress, if set, is called after each batch of ops (never for an
	// empty one) with the number of ops replayed so far.
	Progress func(ops int64)
	// Batch is the number of ops parsed ahead and replayed under one timing
	// (default 1024); smaller batches call Progress more often.
	Batch int
	// Mark, if set, is called at each step mark of the trace (an m line,
	// or a "# mark NAME" comment) with the mark's name, once every op
	// before the mark has been applied and before any op after it, so
	// that it can read the target's state at the step boundary. A batch
	// ends at a mark; the call is not timed. Without Mark, marks are
	// skipped.
	Mark func(name string)

	// Peak fills Result.PeakOp and Result.PeakLine: where allocated bytes
	// (allocated_bytes.all.current, what torch.cuda.max_memory_allocated
	// reports the peak of) first reached their highest value. It reads the
	// Target's stats after every allocation, which the timing includes.
	Peak bool
	// StopAfter, if positive, ends the replay after that many ops: the
	// Target is left in the state the trace describes at that point, and
	// the Result covers the ops replayed. With Result.PeakOp from an
	// earlier replay of the same trace (on an equal Target on a
	// deterministic device, such as a new allocator with the same
	// configuration on the simulated device), it stops at the peak.
	StopAfter int64
	// OOM, if set, is called at each allocation that fails for lack of
	// memory (and is counted in Result.OOMs) with its error and its number
	// among the trace's allocations (a lines), from 1.
	OOM func(err error, alloc int64)
}

// Result is what a replay measured. Its JSON form is what `gpumem replay
// --json` prints.
type Result struct {
	Trace string `json:"trace"`
	Ops   int64  `json:"ops"`    // op lines replayed, tags, marks and syncs included
	Alloc int64  `json:"allocs"` // a lines
	Frees int64  `json:"frees"`  // f lines that freed a block (those of failed allocations are skipped)
	OOMs  int64  `json:"ooms"`   // a lines that failed for lack of memory

	NsPerOp       float64 `json:"ns_per_op"`      // replay time per op, parsing excluded
	ReplaySeconds float64 `json:"replay_seconds"` // time spent in the allocator and the replay's bookkeeping
	// DeviceSeconds is the device time the replay took, for a device that
	// keeps a cost clock (the simulated device). Run leaves it zero: the
	// device's clock is its own, so the caller that made the device reads
	// it before and after Run and fills this in (gpumem replay does).
	DeviceSeconds float64 `json:"device_seconds"`

	PeakRequested int64 `json:"peak_requested_bytes"` // requested_bytes.all.peak
	PeakAllocated int64 `json:"peak_allocated_bytes"` // allocated_bytes.all.peak
	PeakReserved  int64 `json:"peak_reserved_bytes"`  // reserved_bytes.all.peak
	DeviceAllocs  int64 `json:"device_allocs"`        // num_device_alloc
	DeviceFrees   int64 `json:"device_frees"`         // num_device_free
	// Fragmentation is peak reserved / peak requested: 1 is perfect, 0 if
	// nothing was requested.
	Fragmentation float64 `json:"fragmentation"`

	Stats map[string]int64 `json:"stats"` // the final stats, PyTorch's memory_stats keys

	// PeakOp is, with Options.Peak, the number of ops replayed when
	// allocated bytes first reached their highest value in the replay:
	// the op at that position is the a line that reached PeakAllocated
	// (for a Target that starts empty). Replaying the trace again with
	// Options.StopAfter = PeakOp stops at the peak. PeakLine is that a
	// line's line number. Both are 0 when no allocation was made.
	PeakOp   int64 `json:"peak_op,omitempty"`
	PeakLine int   `json:"peak_line,omitempty"`

	// Phases holds, with Options.Phases, each phase's peak allocated bytes
	// and number of allocations, by phase name (allocations before any t
	// line belong to the phase named "").
	Phases map[string]PhaseResult `json:"phases,omitempty"`
	// PhaseOrder lists the names in Phases in the order the trace first
	// named them (the allocator's order), for a report in that order.
	PhaseOrder []string `json:"phase_order,omitempty"`
	// Leaks lists, with Options.Leaks, the groups of allocations (by phase
	// and requested size) whose number alive grew at each of the last two
	// step boundaries or more; Count is the number alive at the last one.
	Leaks []LeakResult `json:"leaks,omitempty"`

	// Plan holds, for an allocator under the planned policy
	// (gpumem_policy:planned), its figures at the end of the replay: the
	// steps planned and the requests served from their arenas; absent
	// under any other policy.
	Plan *allocator.PlanStats `json:"plan,omitempty"`

	// Pools holds the figures of the pools the trace made and did not
	// drop (P lines without a later d), by name, at the end of the
	// replay; absent when the trace made none.
	Pools map[string]PoolResult `json:"pools,omitempty"`

	// Warnings are what the trace's reader accepted but reported (a
	// trace.Reader: garbage after the gzip data, see Reader.Warnings), for
	// the caller to show.
	Warnings []string `json:"warnings,omitempty"`
}

// PoolResult is one pool's figures in a Result.
type PoolResult struct {
	Allocated    uint64 `json:"allocated_bytes"`
	Reserved     uint64 `json:"reserved_bytes"`
	PeakReserved uint64 `json:"peak_reserved_bytes"`
	Paused       bool   `json:"paused"`
}

// PhaseResult is one phase's figures in a Result.
type PhaseResult struct {
	PeakAllocated int64 `json:"peak_allocated_bytes"`
	Allocs        int64 `json:"allocs"`
}

// LeakResult is one group of possibly leaked allocations in a Result.
type LeakResult struct {
	Phase string `json:"phase"`
	Size  uint64 `json:"size_bytes"`
	Count int64  `json:"count"`
	Grew  int    `json:"steps_grew"`
}

// replayBatch is the number of ops parsed ahead and then replayed under one
// timing, so that neither parsing nor reading the clock is timed per op.
const replayBatch = 1024

// denseIDs is the bound below which block IDs index a slice instead of a
// map.
const denseIDs = 1 << 22

// nextBatch reads ops from r as (*trace.Reader).NextBatch does, one Next
// at a time.
func nextBatch(r trace.OpReader, ops []trace.Op, lines []int) (int, error) {
	for n := range ops {
		op, err := r.Next()
		if err != nil {
			return n, err
		}
		ops[n], lines[n] = op, r.Line()
		if op.Kind == trace.Mark {
			return n + 1, nil
		}
	}
	return len(ops), nil
}

// Run reads every op of r and applies it to t, whose memory comes from
// dev. It follows memtrace's rules (trace/FORMAT.md): an allocation that
// fails for lack of memory is counted and replay goes on, skipping the
// later f or r of its ID; any other error stops the replay and names the
// line.
//
// Streams: trace stream 0 is the device's default stream; the first time
// another stream number appears, Run creates a device stream for it, and,
// on a device that can hold work (a StreamHolder, such as the simulated
// device), holds it busy, so that events recorded on it complete only at
// an s line for that stream or an S line, as the format says.
func Run(r trace.OpReader, t Target, dev device.Device, opt Options) (*Result, error) {
	return RunContext(context.Background(), r, t, dev, opt)
}

// RunContext is Run, stopped when ctx is done: it checks ctx before each
// batch of ops (a thousand or so), and then returns an error that wraps
// ctx.Err() and says how many ops were replayed.
func RunContext(ctx context.Context, r trace.OpReader, t Target, dev device.Device, opt Options) (*Result, error) {
	res := &Result{Trace: opt.Name}
	rp := replayer{t: t, dev: dev, res: res, streams: map[uint64]device.Stream{}, peak: opt.Peak, oom: opt.OOM}
	rp.small[0].s, rp.small[0].ok = device.DefaultStream, true // trace stream 0 is the default stream
	if opt.Peak {
		rp.peakBytes = t.Stats().AllocatedBytes[stats.All].Current
	}
	rp.phaser, _ = t.(Phaser)
	rp.pooler, _ = t.(Pooler)
	rp.stepper, _ = t.(Stepper)
	v := trace.NewValidator()
	size := opt.Batch
	if size <= 0 {
		size = replayBatch
	}
	ops := make([]trace.Op, size)
	lines := make([]int, size)
	rd, _ := r.(*trace.Reader) // read and checked a batch at a time
	var elapsed time.Duration
	for {
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("replay stopped after %d ops: %w", res.Ops, err)
		}
		want := size
		if opt.StopAfter > 0 {
			want = int(min(int64(size), max(opt.StopAfter-res.Ops, 0)))
		}
		// Fill the batch: up to want ops, ended early by a read error, a
		// broken rule (the ops before it are replayed, then it is
		// returned) or, with opt.Mark, a step mark.
		n := 0
		var readErr error
		if want == 0 {
			readErr = io.EOF // stop here, as at the end of the trace
		}
		for n < want && readErr == nil {
			if rd != nil {
				var k int
				k, readErr = v.ReadBatch(rd, ops[n:want], lines[n:want])
				n += k
			} else {
				k, err := nextBatch(r, ops[n:want], lines[n:want])
				c, cerr := v.CheckBatch(ops[n:n+k], lines[n:n+k])
				n += c
				readErr = cmp.Or(cerr, err)
			}
			if n > 0 && ops[n-1].Kind == trace.Mark && opt.Mark != nil {
				break
			}
		}
		if readErr == nil && opt.StopAfter > 0 && res.Ops+int64(n) >= opt.StopAfter {
			readErr = io.EOF
		}
		batch := ops[:n]
		start := time.Now()
		err := rp.run(batch, lines[:n])
		elapsed += time.Since(start)
		if err != nil {
			return nil, err
		}
		res.Ops += int64(n)
		if n > 0 && batch[n-1].Kind == trace.Mark && opt.Mark != nil {
			opt.Mark(batch[n-1].Name)
		}
		if opt.Progress != nil && n > 0 {
			opt.Progress(res.Ops)
		}
		if readErr == io.EOF {
			break
		}
		if readErr != nil {
			return nil, readErr
		}
	}
	if w, ok := r.(interface{ Warnings() []string }); ok {
		res.Warnings = w.Warnings()
	}
	res.Alloc, res.Frees = rp.allocs, rp.frees
	res.ReplaySeconds = elapsed.Seconds()
	if res.Ops > 0 {
		res.NsPerOp = float64(elapsed.Nanoseconds()) / float64(res.Ops)
	}
	st := t.Stats()
	res.Stats = st.Map()
	res.PeakRequested = st.RequestedBytes[stats.All].Peak
	res.PeakAllocated = st.AllocatedBytes[stats.All].Peak
	res.PeakReserved = st.ReservedBytes[stats.All].Peak
	res.DeviceAllocs = st.NumDeviceAlloc
	res.DeviceFrees = st.NumDeviceFree
	if res.PeakRequested > 0 {
		res.Fragmentation = float64(res.PeakReserved) / float64(res.PeakRequested)
	}
	if opt.Phases && rp.phaser != nil {
		res.Phases = make(map[string]PhaseResult)
		for _, ph := range rp.phaser.PhaseStats() {
			res.Phases[ph.Name] = PhaseResult{PeakAllocated: ph.AllocatedBytes.Peak, Allocs: ph.Allocations.Allocated}
			res.PhaseOrder = append(res.PhaseOrder, ph.Name)
		}
	}
	if len(rp.pools) > 0 {
		res.Pools = make(map[string]PoolResult, len(rp.pools))
		for name, p := range rp.pools {
			ps, err := rp.pooler.PoolStats(p)
			if err != nil {
				return nil, fmt.Errorf("pool %s: %w", trace.Quote(name), err)
			}
			res.Pools[name] = PoolResult{Allocated: ps.AllocatedBytes, Reserved: ps.ReservedBytes, PeakReserved: ps.PeakReservedBytes, Paused: ps.Paused}
		}
	}
	if p, ok := t.(Planner); ok {
		if st, ok := p.PlanStats(); ok {
			res.Plan = &st
		}
	}
	if opt.Leaks && rp.stepper != nil {
		res.Leaks = []LeakResult{}
		for _, l := range rp.stepper.Leaks() {
			res.Leaks = append(res.Leaks, LeakResult{Phase: l.Phase, Size: l.Size, Count: l.Count(), Grew: l.Grew})
		}
	}
	return res, nil
}

// replayer holds a replay's state: live blocks by ID, the stream map and
// the peak search.
type replayer struct {
	t         Target
	peak      bool                       // look for the peak of allocated bytes
	peakBytes int64                      // the highest allocated bytes seen
	phaser    Phaser                     // t, if it is one
	stepper   Stepper                    // t, if it is one
	pooler    Pooler                     // t, if it is one
	pools     map[string]*allocator.Pool // the pools made and not dropped, by trace name
	paused    map[string]bool            // the pools paused (z) and not resumed (w)
	dev       device.Device
	res       *Result
	oom       func(err error, alloc int64) // Options.OOM
	dense     []device.Ptr                 // ptr by ID for small IDs; 0: not live or failed
	sparse    map[uint64]device.Ptr
	streams   map[uint64]device.Stream // trace streams from len(small) up
	small     [64]struct {             // trace streams below 64, the ones of nearly every trace (a power of two: run masks)
		s  device.Stream
		ok bool // s was made
	}

	allocs, frees int64 // Result.Alloc and Result.Frees, filled in at the end
}

// run applies ops, read from lines, in order. The a, f and r lines of
// IDs in the dense table (the a and r lines on streams below 64 already
// made), nearly every line of most traces, are applied here; every other
// op by apply.
func (rp *replayer) run(ops []trace.Op, lines []int) error {
	lines = lines[:len(ops)]
	for i := range ops {
		op := &ops[i]
		var err error
		switch {
		case op.Kind == trace.Free && op.ID < uint64(len(rp.dense)):
			// apply's Free, for the blocks of the dense table.
			if p := rp.dense[op.ID]; p != 0 {
				rp.dense[op.ID] = 0
				rp.frees++
				err = rp.t.Free(p)
			}
		case op.Kind == trace.Alloc:
			if s, ok := rp.made(op.Stream); ok && op.ID < uint64(len(rp.dense)) {
				// alloc's work, for the blocks of the dense table on
				// streams already made.
				rp.allocs++
				if p, aerr := rp.t.Alloc(op.Size, s); aerr == nil {
					rp.dense[op.ID] = p
				} else if err = rp.allocFailed(aerr); err == nil {
					rp.dense[op.ID] = 0
				}
			} else {
				err = rp.apply(op)
			}
			if rp.peak && err == nil {
				// Allocated bytes grow only when a block is handed out.
				rp.notePeak(i, lines[i])
			}
		case op.Kind == trace.RecordStream && op.ID < uint64(len(rp.dense)):
			// apply's RecordStream, as alloc's work above.
			if s, ok := rp.made(op.Stream); ok {
				if p := rp.dense[op.ID]; p != 0 {
					err = rp.t.RecordStream(p, s)
				}
			} else {
				err = rp.apply(op)
			}
		default:
			err = rp.apply(op)
		}
		if err != nil {
			return fmt.Errorf("memtrace line %d: %s: %w", lines[i], trace.Quote(op.String()), err)
		}
	}
	return nil
}

// notePeak notes the allocation ops[i] of the batch run applies, read from
// line, as the peak when allocated bytes are past the highest seen.
func (rp *replayer) notePeak(i, line int) {
	if cur := rp.t.Stats().AllocatedBytes[stats.All].Current; cur > rp.peakBytes {
		rp.peakBytes = cur
		rp.res.PeakOp = rp.res.Ops + int64(i) + 1
		rp.res.PeakLine = line
	}
}

func (rp *replayer) apply(op *trace.Op) error {
	switch op.Kind {
	case trace.Alloc:
		s, err := rp.stream(op.Stream)
		if err != nil {
			return err
		}
		return rp.alloc(op, s)
	case trace.Free:
		p := rp.get(op.ID)
		rp.set(op.ID, 0)
		if p == 0 {
			return nil // failed allocation, or a 0-byte one
		}
		rp.frees++
		return rp.t.Free(p)
	case trace.RecordStream:
		p := rp.get(op.ID)
		if p == 0 {
			return nil
		}
		s, err := rp.stream(op.Stream)
		if err != nil {
			return err
		}
		return rp.t.RecordStream(p, s)
	case trace.SyncStream:
		s, err := rp.stream(op.Stream)
		if err != nil {
			return err
		}
		return rp.dev.SynchronizeStream(s)
	case trace.SyncDevice:
		return rp.dev.Synchronize()
	case trace.EmptyCache:
		return rp.t.EmptyCache()
	case trace.Tag:
		if rp.phaser != nil {
			rp.phaser.SetPhase(op.Tag)
		}
	case trace.Mark:
		if rp.stepper != nil {
			rp.stepper.MarkStep(op.Name)
		}
	case trace.MakePool, trace.UsePool, trace.BeginCapture, trace.EndCapture, trace.PausePool, trace.ResumePool, trace.DropPool:
		return rp.applyPool(op)
	}
	return nil
}

// alloc applies the a line op on the device stream s.
func (rp *replayer) alloc(op *trace.Op, s device.Stream) error {
	rp.allocs++
	p, err := rp.t.Alloc(op.Size, s)
	if err != nil {
		if err := rp.allocFailed(err); err != nil {
			return err
		}
		p = 0 // a failed block: its f and r are skipped
	}
	if op.ID < uint64(len(rp.dense)) {
		rp.dense[op.ID] = p
		return nil
	}
	rp.set(op.ID, p)
	return nil
}

// allocFailed counts the allocation that failed with err, the last
// counted in rp.allocs, when it ran out of memory (the replay goes on:
// nil), and returns err otherwise.
func (rp *replayer) allocFailed(err error) error {
	if !errors.Is(err, device.ErrOutOfMemory) {
		return err
	}
	rp.res.OOMs++
	if rp.oom != nil {
		rp.oom(err, rp.allocs)
	}
	return nil
}

func (rp *replayer) get(id uint64) device.Ptr {
	if id < denseIDs {
		if id < uint64(len(rp.dense)) {
			return rp.dense[id]
		}
		return 0
	}
	return rp.sparse[id]
}

func (rp *replayer) set(id uint64, p device.Ptr) {
	if id < denseIDs {
		if id >= uint64(len(rp.dense)) {
			if p == 0 {
				return
			}
			n := max(2*len(rp.dense), int(id)+1, 1024)
			rp.dense = append(rp.dense, make([]device.Ptr, min(n, denseIDs)-len(rp.dense))...)
		}
		rp.dense[id] = p
		return
	}
	if rp.sparse == nil {
		rp.sparse = make(map[uint64]device.Ptr)
	}
	if p == 0 {
		delete(rp.sparse, id)
	} else {
		rp.sparse[id] = p
	}
}

// made returns the device stream of trace stream n, if n is below 64 and
// its stream is made (stream 0's is made with the replayer). It is
// inlined in run's loop. The entry is read before n's bound is tested (the
// mask keeps the index in the table): 2 instructions an op fewer on
// random_mixed than testing first.
func (rp *replayer) made(n uint64) (device.Stream, bool) {
	sm := &rp.small[n&(uint64(len(rp.small))-1)]
	return sm.s, sm.ok && n < uint64(len(rp.small))
}

// stream maps a trace stream number to a device stream, creating (and
// holding busy) one the first time a number appears.
func (rp *replayer) stream(n uint64) (device.Stream, error) {
	if s, ok := rp.made(n); ok {
		return s, nil
	}
	if s, ok := rp.streams[n]; ok {
		return s, nil
	}
	s, err := rp.dev.NewStream()
	if err != nil {
		return 0, fmt.Errorf("creating a device stream for trace stream %d: %w", n, err)
	}
	if h, ok := rp.dev.(StreamHolder); ok {
		if err := h.SetStreamBusy(s, true); err != nil {
			return 0, err
		}
	}
	if n < uint64(len(rp.small)) {
		rp.small[n].s, rp.small[n].ok = s, true
	} else {
		rp.streams[n] = s
	}
	return s, nil
}
