// This file holds Tune: a sweep of allocator configurations over one
// trace, run in parallel, and their ranking.

package plan

import (
	"cmp"
	"context"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"

	"golang.org/x/sync/errgroup"

	"github.com/gpumem/gpumem/allocator"
	"github.com/gpumem/gpumem/trace"
)

// Candidate is one configuration to try.
type Candidate struct {
	// Conf is the configuration in PYTORCH_CUDA_ALLOC_CONF syntax
	// (gpumem's own keys included); "" is PyTorch's default.
	Conf string
	// Config is Conf parsed.
	Config allocator.Config
}

// NewCandidate parses conf (see allocator.ParseConf).
func NewCandidate(conf string) (Candidate, error) {
	c, err := allocator.ParseConf(conf)
	if err != nil {
		return Candidate{}, err
	}
	return Candidate{Conf: conf, Config: c}, nil
}

// The values Sweep combines.
var (
	sweepMaxSplitMB = []int{0, 64, 128, 256, 512}
	sweepRoundup    = []int{0, 2, 8}
	sweepGC         = []string{"", "0.8"}
	// sweepFraction is the memory fraction that lets the garbage
	// collection threshold act: the whole device, as PyTorch's
	// set_per_process_memory_fraction(1.0).
	sweepFraction = "1"
)

// Sweep returns the configurations Tune tries by default: PyTorch's default
// first, expandable_segments alone second, then every combination of
// expandable_segments (off, on), max_split_size_mb (unset, 64, 128, 256,
// 512), roundup_power2_divisions (unset, 2, 8) and
// garbage_collection_threshold (unset, 0.8; it acts only under a memory
// fraction, so it comes with per_process_memory_fraction:1). Each
// configuration appears once.
func Sweep() []Candidate {
	var out []Candidate
	seen := map[string]bool{}
	add := func(parts []string) {
		conf := strings.Join(parts, ",")
		if seen[conf] {
			return
		}
		seen[conf] = true
		c, err := NewCandidate(conf)
		if err != nil {
			panic("plan: a sweep configuration does not parse: " + err.Error())
		}
		out = append(out, c)
	}
	add(nil)
	add([]string{"expandable_segments:True"})
	add([]string{"gpumem_policy:low_fragmentation"})
	for _, exp := range []bool{false, true} {
		for _, ms := range sweepMaxSplitMB {
			for _, rd := range sweepRoundup {
				for _, gc := range sweepGC {
					var parts []string
					if exp {
						parts = append(parts, "expandable_segments:True")
					}
					if ms != 0 {
						parts = append(parts, fmt.Sprintf("max_split_size_mb:%d", ms))
					}
					if rd != 0 {
						parts = append(parts, fmt.Sprintf("roundup_power2_divisions:%d", rd))
					}
					if gc != "" {
						parts = append(parts, "garbage_collection_threshold:"+gc, "per_process_memory_fraction:"+sweepFraction)
					}
					add(parts)
				}
			}
		}
	}
	return out
}

// TuneOptions configures Tune. The zero TuneOptions runs Sweep on every
// core and measures on DefaultCapacity.
type TuneOptions struct {
	// Capacity is the device on which each configuration's peak reserved
	// bytes and device calls are measured (DefaultCapacity if 0).
	Capacity uint64
	// Candidates are the configurations to try; Sweep() if empty.
	Candidates []Candidate
	// Jobs is how many configurations are evaluated at once; 0 means
	// runtime.GOMAXPROCS(0).
	Jobs int
	// Checks is passed to Fit (FitOptions.Checks).
	Checks int
	// Progress, if set, is called after each configuration is done with
	// the number done and the total; calls do not overlap.
	Progress func(done, total int)
}

// TuneResult is one configuration's figures.
type TuneResult struct {
	Candidate
	// Fit is the smallest capacity it runs on.
	Fit *FitResult
	// AtCapacity is the replay on TuneOptions.Capacity.
	AtCapacity *Outcome
}

// DeviceCalls returns the device calls of the replay on the capacity:
// device allocations and frees (num_device_alloc + num_device_free).
func (r *TuneResult) DeviceCalls() int64 {
	return r.AtCapacity.DeviceAllocs + r.AtCapacity.DeviceFrees
}

// Tune evaluates every candidate on ops: Fit for the smallest capacity it
// runs on, and a replay on opt.Capacity for its peak reserved bytes and
// device calls. Configurations are evaluated in parallel, opt.Jobs at a
// time, each on its own simulated device; ops are shared and only read.
//
// The results are ranked, best first: by the smallest capacity that runs
// without out-of-memory errors, then by peak reserved bytes on
// opt.Capacity, then by device calls there, and on a tie by the order of
// the candidates, so that a simpler configuration early in the sweep wins.
// With the default sweep the best is therefore never worse than PyTorch's
// default or expandable_segments alone. One exception comes first: a
// configuration that runs out of memory on opt.Capacity ranks below those
// that do not, whatever its smallest capacity (which only a non-monotone
// trace allows), so that the best runs on the device of interest if any
// configuration does.
func Tune(ops []trace.Op, opt TuneOptions) ([]TuneResult, error) {
	return TuneContext(context.Background(), ops, opt)
}

// TuneContext is Tune, stopped when ctx is done: every configuration
// being evaluated stops within a thousand ops or so (FitContext), and
// TuneContext returns an error that wraps ctx.Err().
func TuneContext(ctx context.Context, ops []trace.Op, opt TuneOptions) ([]TuneResult, error) {
	cands := opt.Candidates
	if len(cands) == 0 {
		cands = Sweep()
	}
	jobs := opt.Jobs
	if jobs <= 0 {
		jobs = runtime.GOMAXPROCS(0)
	}
	results := make([]TuneResult, len(cands))
	var mu sync.Mutex // serializes Progress
	done := 0
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(jobs)
	for i, c := range cands {
		g.Go(func() error {
			if gctx.Err() != nil {
				return nil // another configuration failed, or ctx is done: skip the rest
			}
			fit, err := FitContext(gctx, ops, FitOptions{Config: c.Config, Checks: opt.Checks})
			if err != nil {
				return fmt.Errorf("%s: %w", label(c.Conf), err)
			}
			at, err := ReplayContext(gctx, ops, c.Config, opt.Capacity)
			if err != nil {
				return fmt.Errorf("%s: %w", label(c.Conf), err)
			}
			results[i] = TuneResult{Candidate: c, Fit: fit, AtCapacity: at}
			if opt.Progress != nil {
				mu.Lock()
				done++
				opt.Progress(done, len(cands))
				mu.Unlock()
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		// Configurations skipped after the caller's ctx was done.
		return nil, fmt.Errorf("tune stopped: %w", err)
	}
	order := make([]int, len(results))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int {
		ra, rb := &results[a], &results[b]
		return cmp.Or(
			cmp.Compare(min(ra.AtCapacity.OOMs, 1), min(rb.AtCapacity.OOMs, 1)),
			cmp.Compare(ra.Fit.MinCapacity, rb.Fit.MinCapacity),
			cmp.Compare(ra.AtCapacity.PeakReserved, rb.AtCapacity.PeakReserved),
			cmp.Compare(ra.DeviceCalls(), rb.DeviceCalls()),
		)
	})
	ranked := make([]TuneResult, len(results))
	for k, i := range order {
		ranked[k] = results[i]
	}
	return ranked, nil
}

// label names a configuration in messages: "default" for "".
func label(conf string) string {
	if conf == "" {
		return "default"
	}
	return conf
}

// PyTorchSetting says how to give PyTorch the configuration c: conf for
// PYTORCH_CUDA_ALLOC_CONF, and the fraction to pass to
// torch.cuda.set_per_process_memory_fraction (0: none), which PyTorch
// takes as a call, not a key. ok is false if c uses gpumem's own
// MemoryLimit or policy, which PyTorch lacks.
func PyTorchSetting(c allocator.Config) (conf string, fraction float64, ok bool) {
	fraction, c.MemoryFraction = c.MemoryFraction, 0
	ok = c.MemoryLimit == 0 && c.Policy == allocator.PolicyFaithful
	c.MemoryLimit = 0
	return CompactConf(c), fraction, ok
}

// CompactConf renders c as Config.String does, but writes a
// roundup_power2_divisions list that is the same for every interval as
// the single value.
func CompactConf(c allocator.Config) string {
	d := c.RoundupPower2Divisions
	uniform := d[0] != 0
	for _, v := range d {
		uniform = uniform && v == d[0]
	}
	if !uniform {
		return c.String()
	}
	var list allocator.Config
	list.RoundupPower2Divisions = d
	long := list.String() // "roundup_power2_divisions:[...]"
	return strings.Replace(c.String(), long, fmt.Sprintf("roundup_power2_divisions:%d", d[0]), 1)
}
