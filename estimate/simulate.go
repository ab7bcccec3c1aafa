// This file holds the simulation: the workload replayed through the
// caching allocator on a simulated device.

package estimate

import (
	"fmt"

	"github.com/gpumem/gpumem/allocator"
	"github.com/gpumem/gpumem/device/sim"
	"github.com/gpumem/gpumem/trace"
	"github.com/gpumem/gpumem/trace/replay"
)

// Result is an estimate: the count, and what the allocator did.
type Result struct {
	Model    Model
	Count    Breakdown
	Capacity uint64
	Steps    int
	Replay   *replay.Result // peaks, device calls, out-of-memory errors, every stat
	// Fits reports whether every allocation succeeded.
	Fits bool
	// Headroom is capacity minus peak reserved (negative when it did not
	// fit; then it is only the shortfall of what was reserved).
	Headroom int64
}

// Simulate replays the setup and steps training steps of m (at least 2, so
// that the optimizer state and a steady step are both seen) through the
// caching allocator with configuration cfg on a simulated device of the
// given capacity.
func Simulate(m Model, capacity uint64, cfg allocator.Config, steps int) (*Result, error) {
	if steps < 1 {
		return nil, fmt.Errorf("estimate: steps must be at least 1, got %d", steps)
	}
	w, err := NewWorkload(m)
	if err != nil {
		return nil, err
	}
	ops := w.Setup()
	for range steps {
		ops = append(ops, w.Step()...)
	}
	dev, err := sim.New(sim.Config{Capacity: capacity})
	if err != nil {
		return nil, fmt.Errorf("estimate: %w", err)
	}
	a, err := allocator.New(dev, cfg)
	if err != nil {
		return nil, err
	}
	res, err := replay.Run(trace.SliceReader(ops), a, dev, replay.Options{Name: "training"})
	if err != nil {
		return nil, err
	}
	return &Result{
		Model:    m,
		Count:    m.Breakdown(),
		Capacity: capacity,
		Steps:    steps,
		Replay:   res,
		Fits:     res.OOMs == 0,
		Headroom: int64(capacity) - res.PeakReserved,
	}, nil
}

// MaxBatch returns the largest batch size (up to limit) with which m
// trains on the card without running out of memory, by simulation; 0 if
// not even a batch of 1 fits.
func MaxBatch(m Model, capacity uint64, cfg allocator.Config, limit int) (int, error) {
	fits := func(batch int) (bool, error) {
		mm := m
		mm.Batch = batch
		r, err := Simulate(mm, capacity, cfg, 2)
		if err != nil {
			return false, err
		}
		return r.Fits, nil
	}
	lo, hi := 0, limit // lo fits (0 trivially), hi+1 is the first untried
	if ok, err := fits(1); err != nil || !ok {
		return 0, err
	}
	lo = 1
	for lo < hi {
		mid := lo + (hi-lo+1)/2
		ok, err := fits(mid)
		if err != nil {
			return 0, err
		}
		if ok {
			lo = mid
		} else {
			hi = mid - 1
		}
	}
	return lo, nil
}
