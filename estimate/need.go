// This file holds what a plan needs: the smallest capacity on which its
// simulated run has no out-of-memory error, searched as trace/plan's Fit
// searches a trace's, over the plan's allocation stream recorded once.

package estimate

import (
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync"

	"github.com/gpumem/gpumem/allocator"
	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/device/sim"
	"github.com/gpumem/gpumem/stats"
)

// Step is the granularity of the capacities the search tries: 2 MiB, the
// simulated device's page, as trace/plan's Step.
const Step = 2 << 20

// fitChecks is how many capacities below its answer the search replays,
// and maxFitRounds how often it bisects again below it, as trace/plan's
// DefaultChecks and its rounds.
const (
	fitChecks    = 6
	maxFitRounds = 8
)

// stream is a plan's allocation stream, recorded from the count so that
// the search replays it on many capacities without running the program
// again. Each op is a size to allocate, or opFree with the slot of the
// allocation to free. Slots are numbered as the recorder hands them out:
// a freed slot is the next one taken (last freed, first taken), so that a
// replay needs as many addresses as the run ever holds at once, not one
// per allocation. The program's stream does not depend on what the sink
// answers until an allocation fails, and a replay stops at its first
// failure, so a replay makes the same requests as a simulation.
type stream struct {
	ops      []uint64
	recorded bool   // false: too long to record; the program runs again
	slots    int    // the most allocations live at once
	peak     uint64 // the most bytes live at once: no smaller device runs it
}

const opFree = 1 << 63

// maxRecorded bounds the recorded stream: 16 Mi ops, 128 MiB. The longest
// streams of the presets fit: Llama-70B decoding 4,000 tokens after a
// 4,096-token prompt makes 12 million ops (1,537 simulated passes of 80
// layers); its replay takes 1.1 s, a run of the program 1.4 s. A longer
// stream (a config with thousands of layers) is not recorded, and the
// search runs the program for each capacity instead, in bounded memory.
const maxRecorded = 1 << 24

// slotStack hands out slot numbers: the last freed first, else a new one.
type slotStack struct {
	free []uint64
	n    uint64
}

func (st *slotStack) take() uint64 {
	if k := len(st.free); k > 0 {
		x := st.free[k-1]
		st.free = st.free[:k-1]
		return x
	}
	st.n++
	return st.n - 1
}

func (st *slotStack) put(x uint64) { st.free = append(st.free, x) }

// recorder is the counter, recording the stream as it counts, up to
// maxRecorded ops. Its handles are slots plus one.
type recorder struct {
	counter
	slots slotStack
	ops   []uint64
	over  bool // the stream is longer than maxRecorded: ops is nil
}

func (r *recorder) alloc(n uint64, c category) (uint64, bool) {
	r.counter.alloc(n, c)
	// Any size beyond the largest device fails alike; the clamp keeps the
	// op's top bit for opFree.
	r.add(min(n, MaxDevice+1))
	return r.slots.take() + 1, true
}

func (r *recorder) free(h, n uint64, c category) {
	r.counter.free(h, n, c)
	r.slots.put(h - 1)
	r.add(opFree | (h - 1))
}

func (r *recorder) add(op uint64) {
	if r.over {
		return
	}
	if len(r.ops) == maxRecorded {
		r.ops, r.over = nil, true
		return
	}
	r.ops = append(r.ops, op)
}

// record runs the program of pl through a counter that records the
// stream (ops nil if it is longer than maxRecorded).
func record(pl *Plan) (*counter, *program, *stream) {
	r := &recorder{}
	p := newProgram(pl, r)
	p.run()
	return &r.counter, p, &stream{ops: r.ops, recorded: !r.over, slots: int(r.slots.n), peak: r.peak}
}

// runs plays the stream of pl on a fresh allocator (pl.Alloc) over a
// device of dev bytes and reports whether every allocation succeeded,
// with the peak reserved bytes: it replays the recording, or runs the
// program again if the stream was too long to record. Replays of one
// stream may run concurrently.
func (s *stream) runs(pl *Plan, dev uint64) (bool, uint64, error) {
	if dev == 0 || dev < s.peak {
		return false, 0, nil
	}
	if !s.recorded {
		r, _, err := simulate(pl, dev)
		if err != nil {
			return false, 0, err
		}
		return !r.OOM, uint64(r.PeakReserved), nil
	}
	d, err := sim.New(sim.Config{Capacity: dev, Costs: sim.NoCosts()})
	if err != nil {
		return false, 0, fmt.Errorf("simulated device: %w", err)
	}
	a, err := allocator.New(d, pl.Alloc)
	if err != nil {
		return false, 0, err
	}
	ptrs := make([]device.Ptr, s.slots)
	slots := slotStack{free: make([]uint64, 0, s.slots)}
	for _, op := range s.ops {
		if op&opFree != 0 {
			x := op &^ opFree
			if err := a.Free(ptrs[x]); err != nil {
				return false, 0, fmt.Errorf("simulation: %w", err)
			}
			slots.put(x)
			continue
		}
		if op > dev {
			return false, 0, nil
		}
		p, err := a.Alloc(op, device.DefaultStream)
		if err != nil {
			if errors.Is(err, device.ErrOutOfMemory) {
				return false, 0, nil
			}
			return false, 0, fmt.Errorf("simulation: %w", err)
		}
		ptrs[slots.take()] = p
	}
	return true, uint64(a.Stats().ReservedBytes[stats.All].Peak), nil
}

// search is one search for the smallest device: the replays made, by
// capacity. It replays up to workers capacities at once.
type search struct {
	pl       *Plan
	s        *stream
	workers  int
	runs     map[uint64]bool
	reserved uint64 // the peak reserved of the last single replay that ran
}

// maxWorkers bounds the replays a search runs at once.
const maxWorkers = 8

func (f *search) try(c uint64) (bool, error) {
	if ok, done := f.runs[c]; done {
		return ok, nil
	}
	ok, res, err := f.s.runs(f.pl, c)
	if err != nil {
		return false, err
	}
	f.runs[c] = ok
	if ok {
		f.reserved = res
	}
	return ok, nil
}

// tryAll replays the capacities not yet tried, up to f.workers at once.
func (f *search) tryAll(cs []uint64) error {
	var todo []uint64
	for _, c := range cs {
		if _, done := f.runs[c]; !done && !slices.Contains(todo, c) {
			todo = append(todo, c)
		}
	}
	ok := make([]bool, len(todo))
	errs := make([]error, len(todo))
	sem := make(chan struct{}, f.workers)
	var wg sync.WaitGroup
	for i, c := range todo {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			ok[i], _, errs[i] = f.s.runs(f.pl, c)
			<-sem
		}()
	}
	wg.Wait()
	for i, c := range todo {
		if errs[i] != nil {
			return errs[i]
		}
		f.runs[c] = ok[i]
	}
	return nil
}

// minDevice returns the smallest device, a multiple of Step, on which the
// stream runs, or 0 if none up to MaxDevice does. It searches as
// trace/plan's Fit: no device below the peak of live bytes runs, so it
// starts at 1.5 times that, doubling until a replay runs; it bisects to
// two capacities one Step apart, the lower failing and the upper running,
// and replays the lower if the bisection has not. A caching allocator is
// not monotone in the capacity, so it then replays 2, 4, 8, ... Steps
// below the answer (fitChecks of them, down to the peak), and a capacity
// there that runs moves the answer down: it bisects again beneath it.
//
// seed, if not 0, is a capacity (a multiple of Step) replayed first: the
// card's. If it runs, the search starts below it, so that the answer is
// never above a card on which the run fits, and from the peak reserved
// there if that runs too: the allocator never needed more, so the
// bisection starts from a bracket of a few hundred MiB rather than half
// the peak.
func minDevice(pl *Plan, s *stream, seed uint64) (uint64, error) {
	if s.peak > MaxDevice {
		return 0, nil
	}
	f := &search{pl: pl, s: s, workers: min(max(runtime.GOMAXPROCS(0), 1), maxWorkers), runs: map[uint64]bool{}}
	return minDeviceWith(f, seed)
}

// minDeviceWith is minDevice's search with f.
func minDeviceWith(f *search, seed uint64) (uint64, error) {
	s := f.s
	var floor uint64 // the largest capacity below the peak: it and all below fail
	if s.peak > 0 {
		floor = (s.peak - 1) / Step * Step
	}
	lo, hi := floor, min(max(roundStep(s.peak+s.peak/2), Step), MaxDevice)
	seedRuns := false
	if seed > floor {
		ok, err := f.try(seed)
		if err != nil {
			return 0, err
		}
		seedRuns = ok
	}
	if seedRuns {
		hi = min(hi, seed)
		if r := roundStep(f.reserved); r > floor && r < hi {
			if ok, err := f.try(r); err != nil {
				return 0, err
			} else if ok {
				hi = r
			}
		}
	}
	for {
		ok, err := f.try(hi)
		if err != nil {
			return 0, err
		}
		if ok {
			break
		}
		if hi == MaxDevice {
			return 0, nil
		}
		lo, hi = hi, min(2*hi, MaxDevice)
		if seedRuns {
			hi = min(hi, seed)
		}
	}
	ans, err := f.bisect(lo, hi)
	if err != nil {
		return 0, err
	}
	for range maxFitRounds {
		var below []uint64
		for k := 1; k <= fitChecks; k++ {
			c := ans - Step<<k
			if c > ans || c <= floor || c < Step {
				break
			}
			below = append(below, c)
		}
		if err := f.tryAll(below); err != nil {
			return 0, err
		}
		found := uint64(0)
		for _, c := range below {
			if f.runs[c] {
				found = c
			}
		}
		if found == 0 {
			break
		}
		lo := floor
		for c, ok := range f.runs {
			if !ok && c < found && c > lo {
				lo = c
			}
		}
		if ans, err = f.bisect(lo, found); err != nil {
			return 0, err
		}
	}
	return ans, nil
}

// bisect narrows (lo, hi], where hi runs and lo fails (or is at or below
// the peak's floor), to the smallest capacity that runs with one Step
// less failing. Each round replays up to f.workers capacities evenly
// spaced inside the bracket (one: the middle, a bisection), and keeps the
// smallest that runs and the largest below it that fails.
func (f *search) bisect(lo, hi uint64) (uint64, error) {
	for {
		for hi-lo > Step {
			n := (hi - lo) / Step // > 1
			k := min(uint64(f.workers), n-1)
			pts := make([]uint64, 0, k)
			for i := uint64(1); i <= k; i++ {
				pts = append(pts, lo+n*i/(k+1)*Step)
			}
			if err := f.tryAll(pts); err != nil {
				return 0, err
			}
			for _, c := range pts {
				if f.runs[c] {
					hi = c
					break
				}
			}
			for _, c := range pts {
				if c < hi && !f.runs[c] {
					lo = max(lo, c)
				}
			}
		}
		if lo == 0 {
			return hi, nil
		}
		ok, err := f.try(lo)
		if err != nil {
			return 0, err
		}
		if !ok {
			return hi, nil
		}
		hi, lo = lo, 0 // runs below: search on beneath it
	}
}

// roundStep rounds n up to a multiple of Step.
func roundStep(n uint64) uint64 { return add(n, Step-1) / Step * Step }

// Need returns the memory one GPU needs for the plan: the smallest
// capacity, the context included, on which the simulated run has no
// out-of-memory error (see Result.MinCapacity). It returns 0 when not
// even the largest simulated device (MaxDevice plus the context) runs it.
func (pl Plan) Need() (int64, error) {
	if err := pl.Normalize(); err != nil {
		return 0, err
	}
	_, _, s := record(&pl)
	n, err := pl.minCapacity(s)
	return i64(n), err
}

// minCapacity returns the smallest capacity, the context included, on
// which the stream of pl runs, or 0 if none does.
func (pl *Plan) minCapacity(s *stream) (uint64, error) {
	var seed uint64
	if ctx := pl.context(); ctx < pl.Capacity {
		seed = min(pl.Capacity-ctx, MaxDevice) / Step * Step
	}
	dev, err := minDevice(pl, s, seed)
	if err != nil || dev == 0 {
		return 0, err
	}
	return dev + pl.context(), nil
}
