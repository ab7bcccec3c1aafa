// This file holds `gpumem fit`: the smallest device each trace runs on.

package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"runtime"
	"strings"
	"sync/atomic"

	"golang.org/x/sync/errgroup"

	"github.com/gpumem/gpumem/stats"
	"github.com/gpumem/gpumem/trace"
	"github.com/gpumem/gpumem/trace/plan"
)

// fitJSON is one line of fit --json: one trace under one configuration.
type fitJSON struct {
	Trace              string   `json:"trace"`
	Conf               string   `json:"conf"`
	MinCapacityBytes   uint64   `json:"min_capacity_bytes"`
	PeakRequestedBytes uint64   `json:"peak_requested_bytes"`
	FitRatio           float64  `json:"fit_ratio"`
	SafeCapacityBytes  uint64   `json:"safe_capacity_bytes"`
	NonMonotone        []uint64 `json:"non_monotone_oom_capacities"`
	BelowOOMs          int64    `json:"ooms_2mib_below"`
	// The peak reserved at the answer, and on a roomy device: 80 GiB, or
	// twice the safe capacity if that is more.
	PeakReservedBytes      int64  `json:"peak_reserved_bytes"`
	RoomyCapacityBytes     uint64 `json:"roomy_capacity_bytes"`
	RoomyPeakReservedBytes int64  `json:"roomy_peak_reserved_bytes"`
	Replays                int    `json:"replays"`
	// The card it runs on: min_capacity_bytes plus the memory a process
	// holds outside the allocator (--overhead), as estimate counts it.
	OverheadBytes uint64 `json:"overhead_bytes"`
	MinCardBytes  uint64 `json:"min_card_bytes"`
	// The offline best: the peak of live bytes rounded to 512, below
	// which no allocator runs the trace, and the footprint of a packing
	// that knows every lifetime.
	// Left out when the trace has no offline best.
	BoundBytes   *uint64 `json:"bound_bytes,omitempty"`
	PlannedBytes *uint64 `json:"planned_bytes,omitempty"`
}

// fitted is one trace fitted under one configuration, with a replay on a
// roomy device for comparison.
type fitted struct {
	*plan.FitResult
	roomyCapacity uint64
	roomy         *plan.Outcome
	best          *offlineResult
}

func runFit(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("fit", "[--conf CONF]... [--checks N] [--overhead SIZE] [--json] TRACE...", stderr)
	var confs listFlag
	fs.Var(&confs, "conf", "a configuration `CONF` to fit (repeatable; PYTORCH_CUDA_ALLOC_CONF syntax; \"\" is PyTorch's default; default: "+envOrder+", then both \"\" and expandable_segments:True)")
	checks := fs.Int("checks", plan.DefaultChecks, "replay `N` capacities on each side of the answer to look for a trace that a bigger device does not suit (0: none)")
	asJSON := fs.Bool("json", false, "print one JSON object per trace and configuration")
	var overFlag overheadFlag
	addOverheadFlag(fs, &overFlag)
	fs.Lookup("overhead").Usage = "per-process memory `SIZE` outside the allocator, added to the answer for the card it runs on: the CUDA context, as estimate counts it (default 512MiB)"
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	overhead, err := overheadBytes(&overFlag)
	if err != nil {
		return err
	}
	if fs.NArg() == 0 {
		return usageError{"no trace given"}
	}
	if *checks < 0 || *checks > 40 {
		return usageError{fmt.Sprintf("--checks %d: want 0 to 40", *checks)}
	}
	if *checks == 0 {
		*checks = -1 // plan: none
	}
	list, err := resolveConfs(fs, confs, "fit's default", "", "expandable_segments:True")
	if err != nil {
		return err
	}
	var cands []plan.Candidate
	for _, c := range list {
		cand, err := plan.NewCandidate(c)
		if err != nil {
			return usageError{"--conf: " + err.Error()}
		}
		cands = append(cands, cand)
	}
	fs.begin()
	// Fit every trace under every configuration, in parallel.
	traces := make([][]trace.Op, fs.NArg())
	results := make([]fitted, fs.NArg()*len(cands))
	for i, path := range fs.Args() {
		if traces[i], err = loadOps(path); err != nil {
			return err
		}
	}
	// Every failure is kept and reported, in the order of the traces and
	// configurations, not only the first to end.
	errs := make([]error, len(results))
	var done atomic.Int64
	stop := startProgress(lineOutput(stderr), "gpumem fit", func() string {
		return fmt.Sprintf("%d of %d traces and configurations fitted", done.Load(), len(results))
	})
	plans := make([]*offlineResult, len(traces))
	var g errgroup.Group
	g.SetLimit(runtime.GOMAXPROCS(0))
	for i := range traces {
		g.Go(func() error {
			plans[i] = offlineBest(ctx, traces[i])
			return nil
		})
		for j, c := range cands {
			g.Go(func() error {
				k := i*len(cands) + j
				defer done.Add(1)
				r, err := plan.FitContext(ctx, traces[i], plan.FitOptions{Config: c.Config, Checks: *checks})
				if err != nil {
					errs[k] = err
					return nil
				}
				roomy := min(max(plan.DefaultCapacity, 2*r.SafeCapacity), plan.MaxCapacity)
				o, err := plan.ReplayContext(ctx, traces[i], c.Config, roomy)
				if err != nil {
					errs[k] = err
					return nil
				}
				results[k] = fitted{FitResult: r, roomyCapacity: roomy, roomy: o}
				return nil
			})
		}
	}
	g.Wait() // the goroutines return no error; each keeps its own in errs
	stop()
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := fitErrors(fs.Args(), cands, errs); err != nil {
		return err
	}
	for i, path := range fs.Args() {
		if !*asJSON {
			fmt.Fprintf(stdout, "%s: %d ops, peak requested %s\n", clip(path), len(traces[i]), human(int64(plan.PeakRequested(traces[i]))))
			fmt.Fprintf(stdout, "  %s\n", plans[i].line())
		}
		for j, c := range cands {
			r := results[i*len(cands)+j]
			r.best = plans[i]
			if *asJSON {
				bound, planned := plans[i].bytes()
				b, err := json.Marshal(fitJSON{
					Trace: path, Conf: c.Conf, MinCapacityBytes: r.MinCapacity, PeakRequestedBytes: r.PeakRequested,
					FitRatio: r.FitRatio, SafeCapacityBytes: r.SafeCapacity, NonMonotone: append([]uint64{}, r.NonMonotone...),
					BelowOOMs: r.BelowOOMs, PeakReservedBytes: r.AtMin.PeakReserved, Replays: len(r.Trials),
					RoomyCapacityBytes: r.roomyCapacity, RoomyPeakReservedBytes: r.roomy.PeakReserved,
					OverheadBytes: overhead, MinCardBytes: r.MinCapacity + overhead,
					BoundBytes: bound, PlannedBytes: planned,
				})
				if err != nil {
					return err
				}
				fmt.Fprintf(stdout, "%s\n", b)
				continue
			}
			printFit(stdout, confLabel(c.Conf), r, overhead)
		}
	}
	return nil
}

// fitErrors joins the failures of every trace and configuration (errs[i
// * len(cands) + j]) in one error, naming once the configurations of a
// trace that failed for the same reason: "T, default and
// expandable_segments:True: REASON; ...". It returns nil when none
// failed.
func fitErrors(paths []string, cands []plan.Candidate, errs []error) error {
	var out []error
	for i, path := range paths {
		var reasons []string
		confs := map[string][]string{}
		for j, c := range cands {
			err := errs[i*len(cands)+j]
			if err == nil {
				continue
			}
			r := err.Error()
			if confs[r] == nil {
				reasons = append(reasons, r)
			}
			confs[r] = append(confs[r], clip(confLabel(c.Conf)))
		}
		for _, r := range reasons {
			names := confs[r]
			list := strings.Join(names, ", ")
			if n := len(names); n > 1 {
				list = strings.Join(names[:n-1], ", ") + " and " + names[n-1]
			}
			out = append(out, fmt.Errorf("%s, %s: %s", clip(path), list, r))
		}
	}
	return errors.Join(out...)
}

// printFit prints one configuration's answer.
func printFit(w io.Writer, label string, r fitted, overhead uint64) {
	fmt.Fprintf(w, "  %s\n", clip(label))
	if r.PeakRequested == 0 {
		fmt.Fprintf(w, "    runs on  %s, the smallest device: the trace requests no memory\n", human(int64(r.MinCapacity)))
	} else {
		fmt.Fprintf(w, "    runs on  %s: %.3f x the peak requested, %s the offline best\n", human(int64(r.MinCapacity)), r.FitRatio,
			r.best.times(int64(r.MinCapacity)))
	}
	fmt.Fprintf(w, "    a card of %s: the answer plus %s outside the allocator (--overhead)\n", stats.FormatSize(r.MinCapacity+overhead), stats.FormatSize(overhead))
	if r.MinCapacity > plan.Step {
		fmt.Fprintf(w, "    not on   %s: %s out of memory\n", human(int64(r.MinCapacity-plan.Step)), plural(r.BelowOOMs, "allocation runs", "allocations run"))
	}
	if len(r.NonMonotone) > 0 {
		fmt.Fprintf(w, "    NON-MONOTONE: out of memory on %d larger capacities tried (the first %s); every capacity tried from %s up runs\n",
			len(r.NonMonotone), human(int64(r.NonMonotone[0])), human(int64(r.SafeCapacity)))
	}
	if r.roomy.OOMs == 0 && r.PeakRequested > 0 {
		fmt.Fprintf(w, "    on %s it reserves %s at its peak: %.3f x the peak requested, %s the offline best\n", stats.FormatSize(r.roomyCapacity),
			stats.FormatSize(uint64(max(r.roomy.PeakReserved, 0))), float64(r.roomy.PeakReserved)/float64(r.PeakRequested),
			r.best.times(r.roomy.PeakReserved))
	}
	fmt.Fprintf(w, "    %d replays\n", len(r.Trials))
}

// plural returns "1 one" or "n many".
func plural(n int64, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return fmt.Sprintf("%d %s", n, many)
}
