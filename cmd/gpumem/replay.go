// This file holds `gpumem replay`, `gpumem compare` and `gpumem convert`.

package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"golang.org/x/term"

	"github.com/gpumem/gpumem/allocator"
	"github.com/gpumem/gpumem/stats"
	"github.com/gpumem/gpumem/trace/convert"
	"github.com/gpumem/gpumem/trace/plan"
	"github.com/gpumem/gpumem/trace/pytorch"
	"github.com/gpumem/gpumem/trace/replay"
)

// replaySetup is one configuration to replay a trace under.
type replaySetup struct {
	label    string
	conf     string
	cfg      allocator.Config
	baseline bool
	// with, if set, is called with the caching allocator before the
	// replay; the function it returns, after it.
	with func(a *allocator.Allocator) (after func() error)
	// opt holds the replay options beyond the name and progress
	// (phases, leaks, the peak, where to stop).
	opt replay.Options
}

// replayFile replays the trace at path under one setup on a fresh
// simulated device of the given capacity, showing progress on prog, until
// ctx is done.
func replayFile(ctx context.Context, path string, setup replaySetup, capacity uint64, prog progress) (*plan.Outcome, error) {
	in, err := openInput(path)
	if err != nil {
		return nil, err
	}
	defer in.Close()
	m, err := plan.NewMachine(setup.cfg, capacity, setup.baseline)
	if err != nil {
		return nil, err
	}
	after := func() error { return nil }
	if setup.with != nil && m.Allocator != nil {
		after = setup.with(m.Allocator)
	}
	opt := setup.opt
	opt.Name = path
	var ops atomic.Int64
	var bar *progressBar
	if prog.bar != nil && in.size > 0 {
		bar = newProgressBar(prog.bar, path, in.size, in.read)
		defer bar.finish()
	}
	opt.Progress = func(n int64) {
		ops.Store(n)
		if bar != nil {
			bar.draw(false)
		}
	}
	stop := startProgress(prog.lines, "gpumem replay", func() string {
		s := fmt.Sprintf("%s: %d ops replayed", clip(path), ops.Load())
		if in.size > 0 {
			s += fmt.Sprintf(", %.0f%% of the file read", 100*float64(in.read.Load())/float64(in.size))
		}
		return s
	})
	res, err := m.RunContext(ctx, in.ops, opt)
	stop()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", in.name, err)
	}
	if err := after(); err != nil {
		return nil, err
	}
	return res, nil
}

// progressOutput returns where to draw progress: stderr when it is a
// terminal, else nowhere.
func progressOutput(stderr io.Writer, quiet bool) io.Writer {
	if quiet {
		return nil
	}
	if f, ok := stderr.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		return stderr
	}
	return nil
}

// replayJSON is the JSON form of one replay: replay.Result's fields and
// the first out-of-memory error.
type replayJSON struct {
	*replay.Result
	FirstOOM      string `json:"first_oom,omitempty"`
	FirstOOMAlloc int64  `json:"first_oom_alloc,omitempty"`
	// Leaks shadows Result.Leaks so that --leaks prints an empty list as
	// [] rather than leaving the key out.
	Leaks *[]replay.LeakResult `json:"leaks,omitempty"`
	// The configuration and the device, in replay --json (compare prints
	// them once for all).
	*confSource
	CapacityBytes uint64 `json:"capacity_bytes,omitempty"`
	// OverheadBytes is the card's memory held outside the allocator
	// (--card with --overhead); capacity_bytes is the rest.
	OverheadBytes uint64 `json:"overhead_bytes,omitempty"`
}

// simDevice is the simulated device a replay ran on, for its report.
type simDevice struct {
	capacity, overhead uint64
	label              string
}

func toJSON(o *plan.Outcome) replayJSON {
	j := replayJSON{Result: &o.Result, FirstOOMAlloc: o.FirstOOMAlloc}
	if o.Result.Leaks != nil {
		j.Leaks = &o.Result.Leaks
	}
	if o.FirstOOM != nil {
		j.FirstOOM = o.FirstOOM.Error()
	}
	return j
}

func runReplay(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("replay", "[--conf CONF] [--capacity SIZE | --card NAME [--overhead SIZE]] [--baseline] [--json] [--summary] [--phases] [--leaks] [--fail-on-oom] [--snapshot OUT.pickle [--snapshot-at end|peak] [--history N]] TRACE...", stderr)
	conf := fs.String("conf", "", confFlagHelp)
	dev := addDeviceFlags(fs, "")
	baseline := fs.Bool("baseline", false, "replay with the pass-through baseline (no cache) instead")
	asJSON := fs.Bool("json", false, "print one JSON object per trace")
	summary := fs.Bool("summary", false, "print the memory summary after each replay")
	failOnOOM := fs.Bool("fail-on-oom", false, "exit with status 3 if any allocation ran out of memory")
	snapshot := fs.String("snapshot", "", "write a PyTorch-format memory snapshot (pickle) of the end of the replay to `OUT.pickle`, for PyTorch's memory visualizer (one trace only)")
	history := fs.Int("history", 100000, "with --snapshot, keep the last `N` allocator events (at least 1)")
	snapshotAt := fs.String("snapshot-at", "end", "with --snapshot, the state to write: `end` of the replay, or peak (when allocated bytes first reached their peak; the trace is replayed twice)")
	phases := fs.Bool("phases", false, "report each phase's peak allocated bytes and allocations (phases are the trace's t lines)")
	leaks := fs.Bool("leaks", false, "report the groups of allocations (phase and size) whose number alive grew at each of the last two step boundaries or more (m lines, or # mark comments)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *snapshotAt != "end" && *snapshotAt != "peak" {
		return usageError{fmt.Sprintf("--snapshot-at %s: want end or peak", quote(*snapshotAt))}
	}
	if fs.NArg() == 0 {
		return usageError{"no trace given"}
	}
	if *history < 1 {
		return usageError{fmt.Sprintf("--history %d: keep at least 1 event", *history)}
	}
	if flagGiven(fs, "history") && *snapshot == "" {
		return usageError{"--history needs --snapshot OUT.pickle (it sets the events the snapshot keeps)"}
	}
	if err := sameFile("--snapshot", *snapshot, fs.Args()...); err != nil {
		return err
	}
	cfg, src, err := resolveConf(fs, *conf)
	if err != nil {
		return err
	}
	capacity, capLabel, _, err := dev.resolve()
	if err != nil {
		return err
	}
	setup := replaySetup{cfg: cfg, baseline: *baseline, opt: replay.Options{Phases: *phases, Leaks: *leaks}}
	if (*phases || *leaks) && *baseline {
		return usageError{"--phases and --leaks need the caching allocator, not --baseline"}
	}
	if cfg.Backend == allocator.BackendCudaMallocAsync && !*baseline && (*phases || *leaks || *snapshot != "") {
		// As PyTorch's backend, which has no snapshot: the driver's pool
		// keeps the blocks, and no phase or step is seen.
		return usageError{"--phases, --leaks and --snapshot need the caching allocator, not backend:cudaMallocAsync"}
	}
	var summaryText string
	if *summary && !*baseline {
		// The summary comes from the allocator itself, so that it has the
		// per-phase and leak sections when they apply.
		setup.with = func(a *allocator.Allocator) func() error {
			return func() error {
				st := a.Stats()
				summaryText = stats.Summary(&st, stats.SummaryOptions{Name: "simulated, " + capLabel, Phases: namedPhases(a.PhaseStats()), Leaks: a.Leaks()})
				return nil
			}
		}
	}
	if *snapshot != "" {
		if fs.NArg() != 1 || *baseline {
			return usageError{"--snapshot takes one trace and the caching allocator"}
		}
		if *snapshotAt == "peak" {
			fs.begin()
			return replayToPeak(ctx, fs.Arg(0), setup, simDevice{capacity, dev.overheadBytes, capLabel}, &src, *snapshot, *history, *asJSON, stdout, stderr)
		}
		setup.with = withSnapshot(setup.with, *snapshot, *history, stdout)
	} else if flagGiven(fs, "snapshot-at") {
		return usageError{"--snapshot-at needs --snapshot OUT.pickle"}
	}
	fs.begin()
	var ooms int64
	for _, path := range fs.Args() {
		res, err := replayFile(ctx, path, setup, capacity, progressTo(stderr, *asJSON))
		if err != nil {
			return err
		}
		ooms += res.OOMs
		for _, w := range res.Warnings {
			fmt.Fprintf(stderr, "gpumem replay: warning: %s\n", oneLine(w))
		}
		if err := printOutcome(stdout, res, *asJSON, &src, simDevice{capacity, dev.overheadBytes, capLabel}); err != nil {
			return err
		}
		if *summary {
			if summaryText == "" { // the baseline: no allocator to ask
				st, err := stats.FromMap(res.Stats)
				if err != nil {
					return err
				}
				summaryText = stats.Summary(&st, stats.SummaryOptions{Name: "simulated, " + capLabel})
			}
			fmt.Fprint(stdout, summaryText)
			summaryText = ""
		}
	}
	if *failOnOOM && ooms > 0 {
		return exitError{3, fmt.Sprintf("%d allocations ran out of memory (--fail-on-oom)", ooms)}
	}
	return nil
}

// printOutcome prints one replay, as JSON or as text.
func printOutcome(w io.Writer, o *plan.Outcome, asJSON bool, src *confSource, d simDevice) error {
	if asJSON {
		j := toJSON(o)
		j.confSource, j.CapacityBytes, j.OverheadBytes = src, d.capacity, d.overhead
		b, err := json.Marshal(j)
		if err != nil {
			return err
		}
		fmt.Fprintf(w, "%s\n", b)
		return nil
	}
	printResult(w, o, d.label)
	return nil
}

// withSnapshot chains onto a replay hook one that records the allocator's
// history and writes a PyTorch-format snapshot at the end.
func withSnapshot(prev func(*allocator.Allocator) func() error, out string, history int, stdout io.Writer) func(*allocator.Allocator) func() error {
	return func(a *allocator.Allocator) func() error {
		before := func() error { return nil }
		if prev != nil {
			before = prev(a)
		}
		h := pytorch.NewHistory(history)
		detach := a.Attach(h)
		return func() error {
			detach()
			if err := before(); err != nil {
				return err
			}
			return writeOutput(out, stdout, func(w io.Writer) error { return h.WriteSnapshot(w, a) })
		}
	}
}

// replayToPeak replays path twice: once to find where allocated bytes
// first reach their peak (the result printed), then again up to that op
// with the allocator's history recorded, and writes the snapshot of that
// state. The simulated device is deterministic, so the second replay
// reaches exactly the state of the first at its peak.
func replayToPeak(ctx context.Context, path string, setup replaySetup, d simDevice, src *confSource, out string, history int, asJSON bool, stdout, stderr io.Writer) error {
	first := setup
	first.opt.Peak = true
	res, err := replayFile(ctx, path, first, d.capacity, progressTo(stderr, asJSON))
	if err != nil {
		return err
	}
	if err := printOutcome(stdout, res, asJSON, src, d); err != nil {
		return err
	}
	second := setup
	second.opt = replay.Options{StopAfter: res.PeakOp} // 0 (nothing allocated): the whole trace
	second.with = withSnapshot(nil, out, history, stdout)
	_, err = replayFile(ctx, path, second, d.capacity, progress{lines: lineOutput(stderr)})
	return err
}

// namedPhases returns phases for the summary's section, or nil when the
// trace named none (only the phase "").
func namedPhases(phases []stats.PhaseStats) []stats.PhaseStats {
	if len(phases) == 1 && phases[0].Name == "" {
		return nil
	}
	return phases
}

// printResult prints a replay's figures, and its first out-of-memory
// error in full with a count of the others.
func printResult(w io.Writer, o *plan.Outcome, device string) {
	r := &o.Result
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "trace\t%s\n", clip(r.Trace))
	fmt.Fprintf(tw, "simulated device\t%s\n", device)
	for _, row := range resultRows {
		fmt.Fprintf(tw, "%s\t%s\n", row.name, row.value(r))
	}
	if p := r.Plan; p != nil {
		found := ""
		if p.FoundPeriod > 0 {
			found = fmt.Sprintf(" (steps found without marks: %d allocations each)", p.FoundPeriod)
		}
		timeOrdered := ""
		if p.TimeOrdered > 0 {
			timeOrdered = fmt.Sprintf(" (%d in time order: steps too large to pack by size at a boundary)", p.TimeOrdered)
		}
		fmt.Fprintf(tw, "planned steps\t%d planned, %d taken up again, %d packed again%s, %d requests served from an arena, %d skips, %d departures, %d spared%s\n", p.Plans, p.Reused, p.Repacks, timeOrdered, p.Served, p.Skips, p.Departures, p.Spared, found)
	}
	tw.Flush()
	if len(r.Phases) > 0 {
		fmt.Fprintln(w, "phases, in order of first use (peak allocated, allocations):")
		for _, n := range r.PhaseOrder {
			label := n
			if label == "" {
				label = "(before any phase)"
			}
			fmt.Fprintf(w, "  %-24s %s  %d\n", clip(label), human(r.Phases[n].PeakAllocated), r.Phases[n].Allocs)
		}
	}
	if r.Leaks != nil {
		if len(r.Leaks) == 0 {
			fmt.Fprintln(w, "leaks: no group of allocations grew at every step boundary")
		} else {
			fmt.Fprintln(w, "leaks (groups that grew at every one of the last step boundaries; counts at the last boundary, not at the end of the trace):")
			for _, l := range r.Leaks {
				fmt.Fprintf(w, "  phase %s: %d blocks of %d bytes alive at the last step boundary (grew at %d boundaries)\n", quote(l.Phase), l.Count, l.Size, l.Grew)
			}
		}
	}
	if o.FirstOOM != nil {
		fmt.Fprintf(w, "first out of memory, at allocation %d: %s\n", o.FirstOOMAlloc, oneLine(o.FirstOOM.Error()))
		if n := r.OOMs - 1; n > 0 {
			fmt.Fprintf(w, "and %d more allocations ran out of memory\n", n)
		}
	}
}

var resultRows = []struct {
	name  string
	value func(*replay.Result) string
}{
	{"ops", func(r *replay.Result) string { return fmt.Sprint(r.Ops) }},
	{"allocs / frees", func(r *replay.Result) string { return fmt.Sprintf("%d / %d", r.Alloc, r.Frees) }},
	{"out of memory", func(r *replay.Result) string { return fmt.Sprint(r.OOMs) }},
	{"replay time", func(r *replay.Result) string {
		return fmt.Sprintf("%v (%.1f ns/op)", time.Duration(r.ReplaySeconds*1e9).Round(time.Microsecond), r.NsPerOp)
	}},
	{"simulated device time", func(r *replay.Result) string {
		return time.Duration(r.DeviceSeconds * 1e9).Round(time.Microsecond).String()
	}},
	{"peak requested", func(r *replay.Result) string { return human(r.PeakRequested) }},
	{"peak allocated", func(r *replay.Result) string { return human(r.PeakAllocated) }},
	{"peak reserved", func(r *replay.Result) string { return human(r.PeakReserved) }},
	{"fragmentation", func(r *replay.Result) string {
		return fmt.Sprintf("%.3f (peak reserved / peak requested)", r.Fragmentation)
	}},
	{"device mallocs / frees", func(r *replay.Result) string { return fmt.Sprintf("%d / %d", r.DeviceAllocs, r.DeviceFrees) }},
	{"alloc retries", func(r *replay.Result) string { return fmt.Sprint(r.Stats["num_alloc_retries"]) }},
}

// human formats bytes with the exact count.
func human(n int64) string {
	if n < 0 {
		return fmt.Sprint(n)
	}
	return fmt.Sprintf("%s (%d bytes)", stats.FormatSize(uint64(n)), n)
}

// compareJSON is what compare --json prints.
type compareJSON struct {
	Trace         string `json:"trace"`
	CapacityBytes uint64 `json:"capacity_bytes"`
	// The offline best: see fitJSON.
	BoundBytes   *uint64       `json:"bound_bytes,omitempty"`
	PlannedBytes *uint64       `json:"planned_bytes,omitempty"`
	Results      []compareItem `json:"results"`
}

type compareItem struct {
	Label    string `json:"label"`
	Conf     string `json:"conf"`
	Baseline bool   `json:"baseline"`
	replayJSON
}

func runCompare(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("compare", "[--conf CONF]... [--capacity SIZE | --card NAME [--overhead SIZE]] [--json] TRACE", stderr)
	var confs listFlag
	fs.Var(&confs, "conf", "a configuration `CONF` to compare (repeatable; PYTORCH_CUDA_ALLOC_CONF syntax; \"\" is PyTorch's default; default: "+envOrder+", then \"\")")
	dev := addDeviceFlags(fs, "")
	asJSON := fs.Bool("json", false, "print one JSON object")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return usageError{"compare takes exactly one trace"}
	}
	list, err := resolveConfs(fs, confs, "compare's default", "")
	if err != nil {
		return err
	}
	capacity, capLabel, _, err := dev.resolve()
	if err != nil {
		return err
	}
	setups := []replaySetup{{label: "baseline (no cache)", baseline: true}}
	for _, c := range list {
		cfg, err := parseConf(c)
		if err != nil {
			return err
		}
		setups = append(setups, replaySetup{label: confLabel(c), conf: c, cfg: cfg})
	}
	path := fs.Arg(0)
	fs.begin()
	// The offline best is packed while the configurations replay.
	ops, err := loadOps(path)
	if err != nil {
		return err
	}
	var best *offlineResult
	packed := make(chan struct{})
	go func() {
		defer close(packed)
		best = offlineBest(ctx, ops)
	}()
	defer func() { <-packed }() // on every return, so that it never outlives the command
	results := make([]*plan.Outcome, len(setups))
	for i, s := range setups {
		res, err := replayFile(ctx, path, s, capacity, progressTo(stderr, *asJSON))
		if err != nil {
			return fmt.Errorf("%s: %w", clip(s.label), err)
		}
		results[i] = res
	}
	<-packed
	if *asJSON {
		out := compareJSON{Trace: path, CapacityBytes: capacity}
		out.BoundBytes, out.PlannedBytes = best.bytes()
		for i, s := range setups {
			out.Results = append(out.Results, compareItem{Label: s.label, Conf: s.conf, Baseline: s.baseline, replayJSON: toJSON(results[i])})
		}
		b, err := json.Marshal(out)
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(stdout, "%s\n", b)
		return err
	}
	printComparison(stdout, path, capLabel, setups, results, best)
	return nil
}

// printComparison prints compare's table, one row per configuration,
// within 100 columns: the configurations are numbered, and listed above
// the table.
func printComparison(w io.Writer, path, capLabel string, setups []replaySetup, results []*plan.Outcome, best *offlineResult) {
	fmt.Fprintf(w, "%s on a simulated %s device; peak requested %s\n", clip(path), capLabel, stats.FormatSize(uint64(max(results[0].PeakRequested, 0))))
	fmt.Fprintf(w, "%s\n\n", best.line())
	for i, s := range setups {
		for j, line := range wrapConf(s.label, 92) {
			if j == 0 {
				fmt.Fprintf(w, "%3d  %s\n", i+1, line)
			} else {
				fmt.Fprintf(w, "     %s\n", line)
			}
		}
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "#\tOOMs\tpeak alloc\tpeak reserved\tvs offline\tfrag\tmallocs\tfrees\tretries\tdevice time\tns/op\t")
	for i, o := range results {
		r := &o.Result
		fmt.Fprintf(tw, "%d\t%d\t%s\t%s\t%s\t%.3f\t%d\t%d\t%d\t%s\t%s\t\n", i+1, r.OOMs,
			stats.FormatSize(uint64(max(r.PeakAllocated, 0))), stats.FormatSize(uint64(max(r.PeakReserved, 0))), best.times(r.PeakReserved), r.Fragmentation,
			r.DeviceAllocs, r.DeviceFrees, r.Stats["num_alloc_retries"], shortDuration(r.DeviceSeconds), shortNs(r.NsPerOp))
	}
	tw.Flush()
	for i, o := range results {
		if o.FirstOOM != nil {
			text := fmt.Sprintf("%d: first out of memory, at allocation %d: %s", i+1, o.FirstOOMAlloc, oneLine(o.FirstOOM.Error()))
			fmt.Fprintf(w, "\n%s\n", strings.Join(wrapWords(text, 100), "\n   "))
		}
	}
}

// shortNs formats a time per op in nanoseconds in at most 5 characters,
// the width of its column's heading, so that a slow run (a loaded
// machine, a tiny trace whose fixed costs dominate) cannot widen the
// table: whole nanoseconds below 100,000, thousands of them ("1234k")
// below 10 million, millions ("1234M") above.
func shortNs(ns float64) string {
	switch {
	case ns < 99999.5:
		return fmt.Sprintf("%.0f", ns)
	case ns < 9999.5e3:
		return fmt.Sprintf("%.0fk", ns/1e3)
	}
	return fmt.Sprintf("%.0fM", min(ns/1e6, 9999))
}

// wrapWords breaks text into lines of at most width bytes, the lines
// after the first indented by 3, at spaces where it can.
func wrapWords(text string, width int) []string {
	var lines []string
	for w := width; len(text) > w; w = width - 3 {
		cut := strings.LastIndexByte(text[:w+1], ' ')
		if cut <= 0 {
			cut = w
		}
		lines = append(lines, text[:cut])
		text = strings.TrimLeft(text[cut:], " ")
	}
	return append(lines, text)
}

// shortDuration formats seconds in at most about 8 characters.
func shortDuration(s float64) string {
	d := time.Duration(s * 1e9)
	switch {
	case d >= time.Second:
		return d.Round(time.Millisecond).String()
	case d >= time.Millisecond:
		return d.Round(time.Microsecond).String()
	}
	return d.String()
}

// wrapConf breaks a configuration into lines of at most width bytes,
// after commas where it can.
func wrapConf(s string, width int) []string {
	var lines []string
	for len(s) > width {
		cut := strings.LastIndexByte(s[:width], ',')
		if cut <= 0 {
			cut = width - 1
		}
		lines = append(lines, s[:cut+1])
		s = s[cut+1:]
	}
	return append(lines, s)
}

func runConvert(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("convert", "[-o OUT] [--device N] FILE", stderr)
	out := fs.String("o", "-", "write memtrace to `OUT` (gzip if it ends in .gz; - is standard output); a file is replaced only once the whole conversion succeeded")
	dev := fs.Int("device", 0, "the device `N` of a PyTorch snapshot to convert")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return usageError{"convert takes exactly one file"}
	}
	if err := sameFile("-o", *out, fs.Arg(0)); err != nil {
		return err
	}
	in, err := os.Open(fs.Arg(0))
	if err != nil {
		return fileError(err)
	}
	defer in.Close()
	opt := convert.Options{Device: *dev, Gzip: strings.HasSuffix(*out, ".gz")}
	opt.Warn = func(msg string) { fmt.Fprintf(stderr, "gpumem convert: warning: %s\n", oneLine(msg)) }
	return writeOutput(*out, stdout, func(w io.Writer) error {
		_, err := convert.Convert(w, in, clip(fs.Arg(0)), opt)
		return err
	})
}
