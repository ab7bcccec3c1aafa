// This file holds Machine and Replay: one replay of a trace on a fresh
// simulated device, with the first out-of-memory error kept.

package plan

import (
	"context"
	"errors"
	"math"

	"github.com/gpumem/gpumem/allocator"
	"github.com/gpumem/gpumem/device/sim"
	"github.com/gpumem/gpumem/trace"
	"github.com/gpumem/gpumem/trace/replay"
)

// DefaultCapacity is the device capacity used where none is given: 80 GiB,
// the simulated device's default.
const DefaultCapacity = sim.DefaultCapacity

// Step is the granularity of the capacities Fit tries: 2 MiB, the
// simulated device's page.
const Step = 2 << 20

// Outcome is what one replay measured, with the first out-of-memory error.
type Outcome struct {
	replay.Result
	// FirstOOM is the error of the first allocation that ran out of
	// memory (an *allocator.OutOfMemoryError for the caching allocator);
	// nil if none did.
	FirstOOM error
	// FirstOOMAlloc is the number of that allocation among the trace's
	// allocations (a lines), from 1; 0 if none ran out of memory.
	FirstOOMAlloc int64
}

// Machine is a fresh simulated device and the allocator under study, ready
// for one replay.
type Machine struct {
	// Device is the simulated device.
	Device *sim.Device
	// Allocator is the caching allocator; nil for the pass-through
	// baseline and for backend:cudaMallocAsync (Async).
	Allocator *allocator.Allocator
	// Async is the allocator of backend:cudaMallocAsync, when the
	// configuration names that backend; nil otherwise.
	Async *allocator.Async

	target  replay.Target // Allocator, Async or the baseline
	first   error         // Outcome.FirstOOM
	firstAt int64         // Outcome.FirstOOMAlloc
	ran     bool
}

// NewMachine makes a simulated device of capacity bytes (DefaultCapacity if
// 0) and, on it, the caching allocator with cfg, the device's
// stream-ordered pool when cfg.Backend is backend:cudaMallocAsync
// (allocator.NewAsync), or the pass-through baseline (no cache) if
// baseline is set.
func NewMachine(cfg allocator.Config, capacity uint64, baseline bool) (*Machine, error) {
	if capacity == 0 {
		capacity = DefaultCapacity
	}
	dev, err := sim.New(sim.Config{Capacity: capacity})
	if err != nil {
		return nil, err
	}
	m := &Machine{Device: dev}
	if baseline {
		p, err := allocator.NewPassthrough(dev)
		if err != nil {
			return nil, err
		}
		m.target = p
		return m, nil
	}
	if cfg.Backend == allocator.BackendCudaMallocAsync {
		a, err := allocator.NewAsync(dev, cfg)
		if err != nil {
			return nil, err
		}
		m.Async = a
		m.target = a
		return m, nil
	}
	a, err := allocator.New(dev, cfg)
	if err != nil {
		return nil, err
	}
	m.Allocator = a
	m.target = a
	return m, nil
}

// Run replays r on the machine (see replay.Run) and fills in the device
// time from the simulated device's clock. A Machine runs one replay.
func (m *Machine) Run(r trace.OpReader, opt replay.Options) (*Outcome, error) {
	return m.RunContext(context.Background(), r, opt)
}

// RunContext is Run, stopped when ctx is done (replay.RunContext).
func (m *Machine) RunContext(ctx context.Context, r trace.OpReader, opt replay.Options) (*Outcome, error) {
	if m.ran {
		return nil, errors.New("plan: a Machine runs one replay")
	}
	m.ran = true
	clock := m.Device.Clock()
	// The target itself, so that the replay calls it without a wrapper
	// between (and sees its phases, steps and pools); the first
	// out-of-memory error comes through Options.OOM.
	next := opt.OOM
	opt.OOM = func(err error, alloc int64) {
		if m.first == nil {
			m.first, m.firstAt = err, alloc
		}
		if next != nil {
			next(err, alloc)
		}
	}
	res, err := replay.RunContext(ctx, r, m.target, m.Device, opt)
	if err != nil {
		return nil, err
	}
	res.DeviceSeconds = (m.Device.Clock() - clock).Seconds()
	return &Outcome{Result: *res, FirstOOM: m.first, FirstOOMAlloc: m.firstAt}, nil
}

// Replay replays ops with the caching allocator configured by cfg on a
// fresh simulated device of capacity bytes (DefaultCapacity if 0).
func Replay(ops []trace.Op, cfg allocator.Config, capacity uint64) (*Outcome, error) {
	return ReplayContext(context.Background(), ops, cfg, capacity)
}

// ReplayContext is Replay, stopped when ctx is done (replay.RunContext).
func ReplayContext(ctx context.Context, ops []trace.Op, cfg allocator.Config, capacity uint64) (*Outcome, error) {
	m, err := NewMachine(cfg, capacity, false)
	if err != nil {
		return nil, err
	}
	return m.RunContext(ctx, trace.SliceReader(ops), replay.Options{})
}

// PeakRequested returns the most bytes the ops ask to hold at once: the
// peak of the sum of the sizes of live blocks, which is the peak
// requested_bytes of any replay without out-of-memory errors. No device
// smaller than it can run the trace without one. It follows the format's
// rules loosely: an f of an unknown ID is ignored. A sum past 2^64 - 1
// bytes gives math.MaxUint64.
func PeakRequested(ops []trace.Op) uint64 {
	live := make(map[uint64]uint64)
	var cur, peak uint64
	for i := range ops {
		op := &ops[i]
		switch op.Kind {
		case trace.Alloc:
			live[op.ID] = op.Size
			if cur+op.Size < cur {
				return math.MaxUint64
			}
			cur += op.Size
			peak = max(peak, cur)
		case trace.Free:
			cur -= live[op.ID]
			delete(live, op.ID)
		}
	}
	return peak
}
