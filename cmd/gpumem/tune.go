// This file holds `gpumem tune`: a sweep of allocator configurations over
// a trace, ranked, with the line to paste.

package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"runtime"
	"strings"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/gpumem/gpumem/allocator"
	"github.com/gpumem/gpumem/stats"
	"github.com/gpumem/gpumem/trace/plan"
)

// tuneJSON is what tune --json prints.
type tuneJSON struct {
	Trace          string  `json:"trace"`
	CapacityBytes  uint64  `json:"capacity_bytes"`
	OverheadBytes  uint64  `json:"overhead_bytes,omitempty"` // with --card: the card is capacity_bytes + overhead_bytes
	BestConf       string  `json:"best_conf"`
	PyTorchConf    string  `json:"pytorch_conf"`
	MemoryFraction float64 `json:"pytorch_memory_fraction,omitempty"`
	// The offline best: see fitJSON.
	BoundBytes   *uint64         `json:"bound_bytes,omitempty"`
	PlannedBytes *uint64         `json:"planned_bytes,omitempty"`
	Results      []tuneJSONEntry `json:"results"`
}

type tuneJSONEntry struct {
	Conf              string   `json:"conf"`
	MinCapacityBytes  uint64   `json:"min_capacity_bytes"`
	PeakReservedBytes int64    `json:"peak_reserved_bytes"`
	DeviceAllocs      int64    `json:"device_allocs"`
	DeviceFrees       int64    `json:"device_frees"`
	OOMs              int64    `json:"ooms"`
	SafeCapacityBytes uint64   `json:"safe_capacity_bytes"`
	NonMonotone       []uint64 `json:"non_monotone_oom_capacities"`
}

// tuneShown is how many of the best configurations tune prints without
// --all.
const tuneShown = 10

func runTune(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("tune", "[--capacity SIZE | --card NAME [--overhead SIZE]] [--conf CONF]... [--jobs N] [--all] [--json] TRACE", stderr)
	dev := addDeviceFlags(fs, " on which peak reserved bytes and device calls are measured")
	var confs listFlag
	fs.Var(&confs, "conf", "also try the configuration `CONF` (repeatable; default: "+envOrder+", if set)")
	jobs := fs.Int("jobs", runtime.GOMAXPROCS(0), "evaluate `N` configurations at once")
	all := fs.Bool("all", false, fmt.Sprintf("print every configuration, not the best %d and the baselines", tuneShown))
	asJSON := fs.Bool("json", false, "print one JSON object")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return usageError{"tune takes exactly one trace"}
	}
	if *jobs < 1 {
		return usageError{fmt.Sprintf("--jobs %d: want at least 1", *jobs)}
	}
	capacity, capLabel, _, err := dev.resolve()
	if err != nil {
		return err
	}
	extra, err := resolveConfs(fs, confs, "the sweep alone")
	if err != nil {
		return err
	}
	if len(extra) > 0 {
		// The line names what tune tries besides its sweep.
		fs.confLine = strings.Replace(fs.confLine, ": configuration", ": the sweep and configuration", 1)
	}
	cands := plan.Sweep()
	for _, c := range extra {
		cand, err := plan.NewCandidate(c)
		if err != nil {
			return usageError{"--conf: " + err.Error()}
		}
		if !hasConfig(cands, cand.Config) {
			cands = append(cands, cand)
		}
	}
	path := fs.Arg(0)
	fs.begin()
	ops, err := loadOps(path)
	if err != nil {
		return err
	}
	opt := plan.TuneOptions{Capacity: capacity, Candidates: cands, Jobs: *jobs}
	prog := progressTo(stderr, false)
	bar := newProgressBar(io.Discard, "tune "+path, int64(len(cands)), new(atomic.Int64))
	if prog.bar != nil {
		bar = newProgressBar(prog.bar, "tune "+path, int64(len(cands)), bar.done)
		defer bar.finish()
	}
	opt.Progress = func(done, total int) {
		bar.done.Store(int64(done))
		if prog.bar != nil {
			bar.draw(done == total)
		}
	}
	stop := startProgress(prog.lines, "gpumem tune", func() string {
		return fmt.Sprintf("%s: %d of %d configurations done", clip(path), bar.done.Load(), len(cands))
	})
	start := time.Now()
	// The offline best is packed while the sweep runs.
	var best0 *offlineResult
	packed := make(chan struct{})
	go func() {
		defer close(packed)
		best0 = offlineBest(ctx, ops)
	}()
	res, err := plan.TuneContext(ctx, ops, opt)
	stop()
	<-packed
	if err != nil {
		return err
	}
	elapsed := time.Since(start)
	best := res[0]
	// PyTorch's line names the best configuration PyTorch can take: the
	// best overall may be one of gpumem's own policies.
	ptBest := best
	for _, r := range res {
		if _, _, ok := plan.PyTorchSetting(r.Config); ok {
			ptBest = r
			break
		}
	}
	ptConf, fraction, _ := plan.PyTorchSetting(ptBest.Config)
	if *asJSON {
		out := tuneJSON{Trace: path, CapacityBytes: capacity, OverheadBytes: dev.overheadBytes, BestConf: best.Conf, PyTorchConf: ptConf, MemoryFraction: fraction}
		out.BoundBytes, out.PlannedBytes = best0.bytes()
		for _, r := range res {
			out.Results = append(out.Results, tuneJSONEntry{
				Conf: r.Conf, MinCapacityBytes: r.Fit.MinCapacity, PeakReservedBytes: r.AtCapacity.PeakReserved,
				DeviceAllocs: r.AtCapacity.DeviceAllocs, DeviceFrees: r.AtCapacity.DeviceFrees, OOMs: r.AtCapacity.OOMs,
				SafeCapacityBytes: r.Fit.SafeCapacity, NonMonotone: append([]uint64{}, r.Fit.NonMonotone...),
			})
		}
		b, err := json.Marshal(out)
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(stdout, "%s\n", b)
		return err
	}
	fmt.Fprintf(stdout, "%s: %d configurations, each fitted and replayed on a simulated %s device; %d at a time, %v\n\n",
		clip(path), len(res), capLabel, min(*jobs, len(res)), elapsed.Round(time.Millisecond))
	fmt.Fprintf(stdout, "%s\n\n", best0.line())
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "rank\tmin capacity\tvs offline\tpeak reserved\tdevice calls\tOOMs\tconfiguration")
	for i, r := range res {
		mark := baselineMark(r.Conf)
		if !*all && i >= tuneShown && mark == "" && !inList(extra, r.Conf) {
			continue
		}
		nm := ""
		if len(r.Fit.NonMonotone) > 0 {
			nm = fmt.Sprintf(" (non-monotone: fails on %d MiB, runs from %d MiB)", r.Fit.NonMonotone[0]>>20, r.Fit.SafeCapacity>>20)
		}
		fmt.Fprintf(tw, "%d\t%d MiB\t%s\t%s\t%d\t%d\t%s%s%s\n", i+1, r.Fit.MinCapacity>>20, best0.times(int64(r.Fit.MinCapacity)),
			stats.FormatSize(uint64(max(r.AtCapacity.PeakReserved, 0))), r.DeviceCalls(), r.AtCapacity.OOMs, confLabel(r.Conf), mark, nm)
	}
	tw.Flush()
	fmt.Fprintln(stdout)
	def := res[indexOfConfig(res, allocator.Config{})]
	switch {
	case best.Fit.MinCapacity > capacity:
		fmt.Fprintf(stdout, "no configuration runs on %s: the best needs %s\n", capLabel, stats.FormatSize(best.Fit.MinCapacity))
	case best.Conf == "":
		fmt.Fprintln(stdout, "best: PyTorch's default")
	case best.Fit.MinCapacity < def.Fit.MinCapacity:
		fmt.Fprintf(stdout, "best: runs on %d MiB, against %d MiB for PyTorch's default (%.1f%% less)\n", best.Fit.MinCapacity>>20,
			def.Fit.MinCapacity>>20, 100*(1-float64(best.Fit.MinCapacity)/float64(def.Fit.MinCapacity)))
	default:
		fmt.Fprintf(stdout, "best: runs on %d MiB, as PyTorch's default does; peak reserved %s against %s, %d device calls against %d\n",
			best.Fit.MinCapacity>>20, stats.FormatSize(uint64(max(best.AtCapacity.PeakReserved, 0))),
			stats.FormatSize(uint64(max(def.AtCapacity.PeakReserved, 0))), best.DeviceCalls(), def.DeviceCalls())
	}
	fmt.Fprintln(stdout, "recommended:")
	if ptBest.Conf != best.Conf {
		fmt.Fprintf(stdout, "  (PyTorch cannot take the best, %s; its best is rank %d, on %d MiB)\n",
			confLabel(best.Conf), indexOfConfig(res, ptBest.Config)+1, ptBest.Fit.MinCapacity>>20)
	}
	fmt.Fprintf(stdout, "  PYTORCH_CUDA_ALLOC_CONF=%s\n", ptConf)
	if fraction != 0 {
		fmt.Fprintf(stdout, "  and in PyTorch: torch.cuda.set_per_process_memory_fraction(%g)\n", fraction)
	}
	fmt.Fprintf(stdout, "  GPUMEM_ALLOC_CONF=%s\n", best.Conf)
	return nil
}

// baselineMark marks the configurations the best is measured against.
func baselineMark(conf string) string {
	switch conf {
	case "":
		return " (PyTorch's default)"
	case "expandable_segments:True":
		return " (expandable segments alone)"
	}
	return ""
}

func hasConfig(cands []plan.Candidate, c allocator.Config) bool {
	for _, x := range cands {
		if x.Config == c {
			return true
		}
	}
	return false
}

func indexOfConfig(res []plan.TuneResult, c allocator.Config) int {
	for i, r := range res {
		if r.Config == c {
			return i
		}
	}
	return 0
}

func inList(list []string, s string) bool {
	for _, x := range list {
		if strings.TrimSpace(x) == strings.TrimSpace(s) {
			return true
		}
	}
	return false
}
