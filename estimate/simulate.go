// This file holds the simulation: the allocation stream served by the
// caching allocator on a simulated device, as PyTorch's allocator would
// serve it.

package estimate

import (
	"errors"
	"fmt"

	"github.com/gpumem/gpumem/allocator"
	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/device/sim"
	"github.com/gpumem/gpumem/stats"
)

// MaxDevice is the largest device the simulation models (the simulated
// device's limit).
const MaxDevice = 8 << 40

// Simulation is what the caching allocator did with the workload on one
// GPU's memory (the card less the per-process context).
type Simulation struct {
	Device        uint64  // bytes the allocator could use
	PeakAllocated int64   // allocated_bytes.all.peak: what torch.cuda.max_memory_allocated reports
	PeakReserved  int64   // reserved_bytes.all.peak: what torch.cuda.max_memory_reserved reports
	PeakRequested int64   // requested_bytes.all.peak
	Fragmentation float64 // peak reserved / peak requested (1 is none)
	OOM           bool    // an allocation failed; the run stopped there
	OOMPhase      string  // the phase of the failed allocation
	OOMBytes      uint64  // its size
	Stats         stats.DeviceStats
}

// simSink serves the stream with the allocator. Handles are addresses.
type simSink struct {
	a      *allocator.Allocator
	dev    uint64
	r      *Simulation
	phases []Phase
	err    error
}

func (s *simSink) alloc(n uint64, _ category) (uint64, bool) {
	if s.r.OOM || s.err != nil {
		return 0, false
	}
	if n > s.dev { // cannot fit: no need to ask
		s.oom(n)
		return 0, false
	}
	p, err := s.a.Alloc(n, device.DefaultStream)
	if err != nil {
		if errors.Is(err, device.ErrOutOfMemory) {
			s.oom(n)
		} else {
			s.err = err
		}
		return 0, false
	}
	return uint64(p), true
}

func (s *simSink) oom(n uint64) {
	s.r.OOM, s.r.OOMBytes = true, n
	if k := len(s.phases); k > 0 {
		s.r.OOMPhase = s.phases[k-1].Name
	}
}

func (s *simSink) free(h, _ uint64, _ category) {
	if err := s.a.Free(device.Ptr(h)); err != nil && s.err == nil {
		s.err = err
	}
}

func (s *simSink) recategorize(uint64, category, category) {}

// phase closes the previous phase's peaks and starts new ones.
func (s *simSink) phase(name string) {
	s.close()
	s.a.ResetPeakStats()
	s.phases = append(s.phases, Phase{Name: name})
}

func (s *simSink) close() {
	st := s.a.Stats()
	alloc, res, req := st.AllocatedBytes[stats.All].Peak, st.ReservedBytes[stats.All].Peak, st.RequestedBytes[stats.All].Peak
	if k := len(s.phases); k > 0 {
		s.phases[k-1].Allocated, s.phases[k-1].Reserved = alloc, res
	}
	s.r.PeakAllocated = max(s.r.PeakAllocated, alloc)
	s.r.PeakReserved = max(s.r.PeakReserved, res)
	s.r.PeakRequested = max(s.r.PeakRequested, req)
}

// simulate runs the program of pl through the allocator with a device of
// dev bytes.
func simulate(pl *Plan, dev uint64) (*Simulation, []Phase, error) {
	r := &Simulation{Device: dev}
	if dev == 0 {
		r.OOM, r.OOMPhase = true, "setup"
		return r, nil, nil
	}
	d, err := sim.New(sim.Config{Capacity: dev, Costs: sim.NoCosts()})
	if err != nil {
		return nil, nil, fmt.Errorf("simulated device: %w", err)
	}
	a, err := allocator.New(d, pl.Alloc)
	if err != nil {
		return nil, nil, err
	}
	s := &simSink{a: a, dev: dev, r: r}
	p := newProgram(pl, s)
	p.run()
	s.close()
	if s.err != nil {
		return nil, nil, fmt.Errorf("simulation: %w", s.err)
	}
	r.Stats = a.Stats()
	if r.PeakRequested > 0 {
		r.Fragmentation = float64(r.PeakReserved) / float64(r.PeakRequested)
	}
	return r, s.phases, nil
}

// Drive plays the plan's allocation stream on a: the parameters, then
// steps training steps (inference: the prefill and the decoding as one
// step), calling after with the step number (0 after the parameters) so
// that the caller can read a's statistics between steps. It returns the
// first error: an allocation or free that failed (an out-of-memory error
// matches device.ErrOutOfMemory), or what after returned. It names the
// phases on a as it goes (SetPhase: "forward", "backward", "optimizer";
// "prefill" and "decode" for inference). The plan's Capacity is not used:
// a's device decides.
func (pl Plan) Drive(a *allocator.Allocator, steps int, after func(step int) error) error {
	if pl.Capacity == 0 {
		pl.Capacity = MaxDevice
	}
	if err := pl.Normalize(); err != nil {
		return err
	}
	if steps < 1 || steps > 1<<20 {
		return fmt.Errorf("steps must be 1..%d, got %d", 1<<20, steps)
	}
	d := &driveSink{a: a}
	p := newProgram(&pl, d)
	p.steps, p.after = steps, after
	p.run()
	if d.err != nil {
		return d.err
	}
	return p.stop
}

// driveSink serves the stream with a caller's allocator, stopping at the
// first error.
type driveSink struct {
	a   *allocator.Allocator
	err error
}

func (d *driveSink) alloc(n uint64, _ category) (uint64, bool) {
	if d.err != nil {
		return 0, false
	}
	p, err := d.a.Alloc(n, device.DefaultStream)
	if err != nil {
		d.err = err
		return 0, false
	}
	return uint64(p), true
}

func (d *driveSink) free(h, _ uint64, _ category) {
	if err := d.a.Free(device.Ptr(h)); err != nil && d.err == nil {
		d.err = err
	}
}

func (d *driveSink) recategorize(uint64, category, category) {}

// phase names the phase the stream is in on the allocator (SetPhase), so
// that the allocator counts memory by phase.
func (d *driveSink) phase(name string) { d.a.SetPhase(name) }
