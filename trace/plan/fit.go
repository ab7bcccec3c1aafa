// This file holds Fit: the smallest device a trace runs on, found by
// bisection over replays and verified.

package plan

import (
	"context"
	"fmt"
	"slices"

	"github.com/gpumem/gpumem/allocator"
	"github.com/gpumem/gpumem/device/sim"
	"github.com/gpumem/gpumem/stats"
	"github.com/gpumem/gpumem/trace"
)

// MaxCapacity is the largest capacity Fit tries: the simulated device's
// limit, 8 TiB.
const MaxCapacity = sim.MaxCapacity

// DefaultChecks is how many capacities above its answer Fit replays, by
// default, to look for a trace that runs out of memory on a bigger device.
const DefaultChecks = 6

// FitOptions configures Fit. The zero FitOptions fits PyTorch's default
// configuration.
type FitOptions struct {
	// Config is the allocator configuration.
	Config allocator.Config
	// Checks is how many capacities above the answer are replayed to
	// look for non-monotone behaviour: the answer plus 1, 2, 4, ...
	// steps. 0 means DefaultChecks; a negative value, none.
	Checks int
}

// Trial is one replay that Fit made: the capacity and the allocations
// that ran out of memory there.
type Trial struct {
	Capacity uint64 `json:"capacity_bytes"`
	OOMs     int64  `json:"ooms"`
}

// FitResult is the smallest capacity a trace runs on, and the evidence.
type FitResult struct {
	// MinCapacity is the answer: the smallest multiple of Step found on
	// which the trace replays with no out-of-memory error. MinCapacity -
	// Step runs out of memory (unless MinCapacity is Step, the smallest
	// device).
	MinCapacity uint64
	// SafeCapacity is the smallest capacity from which every capacity
	// tried runs; it is verified as MinCapacity is. It equals MinCapacity
	// unless the trace is non-monotone.
	SafeCapacity uint64
	// NonMonotone lists the capacities tried above MinCapacity that ran
	// out of memory: empty for a trace that is monotone as far as the
	// checks see.
	NonMonotone []uint64
	// PeakRequested is the most bytes the trace holds at once
	// (PeakRequested of its ops).
	PeakRequested uint64
	// FitRatio is MinCapacity / PeakRequested; 0 if nothing is requested.
	FitRatio float64
	// AtMin is the replay at MinCapacity.
	AtMin *Outcome
	// BelowOOMs is the number of allocations that ran out of memory at
	// MinCapacity - Step; 0 when MinCapacity is Step.
	BelowOOMs int64
	// Trials lists every replay made, in order.
	Trials []Trial
}

// Fit finds the smallest device capacity, a multiple of Step, on which ops
// replay with no out-of-memory error under opt.Config.
//
// No device smaller than the trace's peak requested bytes can run it, so
// the search starts there: it replays at 1.5 times that figure, doubling
// until a replay runs, then bisects between the largest capacity known to
// fail and the smallest known to run until they are one Step apart. The
// answer is verified: the replay at it ran, and the replay at one Step
// less, made if the bisection has not made it, ran out of memory.
//
// Bisection assumes that a bigger device never hurts, which a caching
// allocator does not promise: more memory changes what is cached, what
// an out-of-memory retry releases, and where later blocks land. So Fit
// also replays opt.Checks capacities on each side of the answer (2, 4,
// 8, ... steps below it, down to the peak requested; 1, 2, 4, ... steps
// above it). A capacity below that runs moves the answer down (bisecting
// again under it); a capacity above that fails is reported in
// NonMonotone, and SafeCapacity is then found by bisecting above the
// largest failure. Neither is hidden: both answers are verified.
//
// Errors other than out of memory (a trace that breaks the format's rules)
// stop the search. A trace that runs out of memory on every capacity up to
// MaxCapacity is an error.
func Fit(ops []trace.Op, opt FitOptions) (*FitResult, error) {
	return FitContext(context.Background(), ops, opt)
}

// FitContext is Fit, stopped when ctx is done: each replay checks ctx
// every thousand ops or so (replay.RunContext), and the search then
// returns an error that wraps ctx.Err().
func FitContext(ctx context.Context, ops []trace.Op, opt FitOptions) (*FitResult, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("fit stopped: %w", err)
	}
	run := func(capacity uint64) (*Outcome, error) {
		return ReplayContext(ctx, ops, opt.Config, capacity)
	}
	return fitSearch(PeakRequested(ops), MaxCapacity, opt.Checks, run)
}

// maxRounds bounds how often fitSearch bisects again after finding a
// non-monotone capacity.
const maxRounds = 8

// fitSearch is Fit's search over any replay function, with capacities up
// to limit (a multiple of Step).
func fitSearch(req, limit uint64, checks int, run func(uint64) (*Outcome, error)) (*FitResult, error) {
	if checks == 0 {
		checks = DefaultChecks
	}
	checks = min(checks, 40)
	if req > limit {
		return nil, fmt.Errorf("the trace holds %s at once, more than the largest simulated device (%s)",
			stats.FormatSize(req), stats.FormatSize(limit))
	}
	f := &fitter{res: &FitResult{PeakRequested: req}, run: run, outcomes: map[uint64]*Outcome{}, limit: limit}
	// floor: the largest capacity below the peak requested (0 if none);
	// it and everything under it fail without a replay.
	var floor uint64
	if req > 0 {
		floor = (req - 1) / Step * Step
	}
	lo, hi := floor, min(max(roundUp(req+req/2), Step), limit)
	for {
		o, err := f.try(hi)
		if err != nil {
			return nil, err
		}
		if o.OOMs == 0 {
			break
		}
		if hi == limit {
			return nil, fmt.Errorf("runs out of memory on every capacity tried, up to %s: %w", stats.FormatSize(limit), o.FirstOOM)
		}
		lo, hi = hi, min(2*hi, limit)
	}
	minCap, err := f.bisect(lo, hi)
	if err != nil {
		return nil, err
	}
	// Look below the answer for a capacity that runs.
	for round := 0; round < maxRounds; round++ {
		found := uint64(0)
		for k := 1; k <= checks; k++ {
			c := minCap - Step<<k
			if c > minCap || c <= floor || c < Step {
				break
			}
			o, err := f.try(c)
			if err != nil {
				return nil, err
			}
			if o.OOMs == 0 {
				found = c
			}
		}
		if found == 0 {
			break
		}
		if minCap, err = f.bisect(f.failBelow(found, floor), found); err != nil {
			return nil, err
		}
	}
	// Look above it for a capacity that fails.
	safe := minCap
	for round := 0; ; round++ {
		for k := 0; k < checks; k++ {
			c := safe + Step<<k
			if c > limit || c < safe {
				break
			}
			if _, err := f.try(c); err != nil {
				return nil, err
			}
		}
		worst := f.failBelow(limit+1, 0)
		if worst < safe {
			break
		}
		if round == maxRounds {
			return nil, fmt.Errorf("non-monotone: runs out of memory on %s above %s, which runs, after %d rounds of search",
				stats.FormatSize(worst), stats.FormatSize(minCap), maxRounds)
		}
		hi := f.runAbove(worst)
		if hi == 0 {
			return nil, fmt.Errorf("non-monotone: runs out of memory on %s, above %s, which runs, and on every larger capacity tried",
				stats.FormatSize(worst), stats.FormatSize(minCap))
		}
		if safe, err = f.bisect(worst, hi); err != nil {
			return nil, err
		}
	}
	res := f.res
	res.MinCapacity, res.SafeCapacity = minCap, safe
	res.AtMin = f.outcomes[minCap]
	if o, ok := f.outcomes[minCap-Step]; ok {
		res.BelowOOMs = o.OOMs
	}
	if req > 0 {
		res.FitRatio = float64(minCap) / float64(req)
	}
	for c, o := range f.outcomes {
		if o.OOMs > 0 && c > minCap {
			res.NonMonotone = append(res.NonMonotone, c)
		}
	}
	slices.Sort(res.NonMonotone)
	return res, nil
}

// fitter holds the replays fitSearch has made.
type fitter struct {
	res      *FitResult
	run      func(uint64) (*Outcome, error)
	outcomes map[uint64]*Outcome
	limit    uint64
}

// try replays at capacity c, once.
func (f *fitter) try(c uint64) (*Outcome, error) {
	if o, ok := f.outcomes[c]; ok {
		return o, nil
	}
	o, err := f.run(c)
	if err != nil {
		return nil, fmt.Errorf("replay on %s: %w", stats.FormatSize(c), err)
	}
	f.outcomes[c] = o
	f.res.Trials = append(f.res.Trials, Trial{c, o.OOMs})
	return o, nil
}

// failBelow returns the largest capacity below c that was tried and
// failed, or floor if there is none above floor.
func (f *fitter) failBelow(c, floor uint64) uint64 {
	best := floor
	for t, o := range f.outcomes {
		if o.OOMs > 0 && t < c && t > best {
			best = t
		}
	}
	return best
}

// runAbove returns the smallest capacity above c that was tried and ran,
// or 0.
func (f *fitter) runAbove(c uint64) uint64 {
	var best uint64
	for t, o := range f.outcomes {
		if o.OOMs == 0 && t > c && (best == 0 || t < best) {
			best = t
		}
	}
	return best
}

// bisect narrows (lo, hi], where hi runs and lo fails (or is 0, or is
// below the peak requested), and returns the smallest capacity in it that
// runs with one Step less failing: hi - lo is one Step and lo, if not 0,
// has been replayed and failed.
func (f *fitter) bisect(lo, hi uint64) (uint64, error) {
	for {
		for hi-lo > Step {
			mid := lo + (hi-lo)/Step/2*Step
			o, err := f.try(mid)
			if err != nil {
				return 0, err
			}
			if o.OOMs > 0 {
				lo = mid
			} else {
				hi = mid
			}
		}
		if lo == 0 {
			return hi, nil
		}
		o, err := f.try(lo) // verify the capacity just below the answer
		if err != nil {
			return 0, err
		}
		if o.OOMs > 0 {
			return hi, nil
		}
		hi, lo = lo, 0 // cannot happen below the peak requested; search on
	}
}

// roundUp rounds n up to a multiple of Step.
func roundUp(n uint64) uint64 {
	return (n + Step - 1) / Step * Step
}
