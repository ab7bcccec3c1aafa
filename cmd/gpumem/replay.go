// This file holds `gpumem replay` and `gpumem compare`.

package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"golang.org/x/term"

	"github.com/gpumem/gpumem/allocator"
	"github.com/gpumem/gpumem/device/sim"
	"github.com/gpumem/gpumem/stats"
	"github.com/gpumem/gpumem/trace"
	"github.com/gpumem/gpumem/trace/convert"
	"github.com/gpumem/gpumem/trace/pytorch"
	"github.com/gpumem/gpumem/trace/replay"
)

// replaySetup is one configuration to replay a trace under.
type replaySetup struct {
	label    string
	conf     allocator.Config
	baseline bool
	// with, if set, is called with the caching allocator before the
	// replay; the function it returns, after it.
	with func(a *allocator.Allocator) (after func() error)
}

// replayFile replays the trace at path under one setup on a fresh
// simulated device of the given capacity.
func replayFile(path string, setup replaySetup, capacity uint64, progress io.Writer) (*replay.Result, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var in io.Reader = f
	var bar *progressBar
	if progress != nil {
		if fi, err := f.Stat(); err == nil && fi.Size() > 0 {
			bar = newProgressBar(progress, path, fi.Size())
			in = &countingReader{r: f, n: &bar.done}
			defer bar.finish()
		}
	}
	r, err := trace.NewReader(in)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	dev, err := sim.New(sim.Config{Capacity: capacity})
	if err != nil {
		return nil, err
	}
	var target replay.Target
	after := func() error { return nil }
	if setup.baseline {
		target, err = allocator.NewPassthrough(dev)
	} else {
		var a *allocator.Allocator
		if a, err = allocator.New(dev, setup.conf); err == nil && setup.with != nil {
			after = setup.with(a)
		}
		target = a
	}
	if err != nil {
		return nil, err
	}
	opt := replay.Options{Name: path}
	if bar != nil {
		opt.Progress = func(int64) { bar.draw(false) }
	}
	// The simulated device's cost clock is the device's own: read it
	// around the replay.
	clock := dev.Clock()
	res, err := replay.Run(r, target, dev, opt)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	res.DeviceSeconds = (dev.Clock() - clock).Seconds()
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

func runReplay(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("replay", "[--conf CONF] [--capacity SIZE] [--baseline] [--json] [--summary] TRACE...", stderr)
	conf := fs.String("conf", "", "allocator configuration, PYTORCH_CUDA_ALLOC_CONF syntax")
	capacity := &sizeFlag{80 << 30}
	fs.Var(capacity, "capacity", "simulated device memory (80GiB, 512MiB, bytes)")
	baseline := fs.Bool("baseline", false, "replay with the pass-through baseline (no caching) instead")
	asJSON := fs.Bool("json", false, "print one JSON object per trace")
	summary := fs.Bool("summary", false, "print the memory summary after each replay")
	snapshot := fs.String("snapshot", "", "write a PyTorch-format memory snapshot (pickle) of the end of the replay here, for PyTorch's memory visualizer (one trace only)")
	history := fs.Int("history", 100000, "with --snapshot, how many of the last allocator events the snapshot keeps")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() == 0 {
		return usageError{"no trace given"}
	}
	cfg, err := allocator.ParseConf(*conf)
	if err != nil {
		return usageError{err.Error()}
	}
	setup := replaySetup{conf: cfg, baseline: *baseline}
	if *snapshot != "" {
		if fs.NArg() != 1 || *baseline {
			return usageError{"--snapshot takes one trace and the caching allocator"}
		}
		setup.with = func(a *allocator.Allocator) func() error {
			h := pytorch.NewHistory(*history)
			detach := a.Attach(h)
			return func() error {
				detach()
				f, err := os.Create(*snapshot)
				if err != nil {
					return err
				}
				if err := h.WriteSnapshot(f, a); err != nil {
					f.Close()
					return err
				}
				return f.Close()
			}
		}
	}
	for _, path := range fs.Args() {
		res, err := replayFile(path, setup, capacity.n, progressOutput(stderr, *asJSON))
		if err != nil {
			return err
		}
		if *asJSON {
			b, err := json.Marshal(res)
			if err != nil {
				return err
			}
			fmt.Fprintf(stdout, "%s\n", b)
		} else {
			printResult(stdout, res)
		}
		if *summary {
			st, err := stats.FromMap(res.Stats)
			if err != nil {
				return err
			}
			fmt.Fprint(stdout, stats.Summary(&st, stats.SummaryOptions{Name: "simulated, " + capacity.String()}))
		}
	}
	return nil
}

func printResult(w io.Writer, r *replay.Result) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "trace\t%s\n", r.Trace)
	for _, row := range resultRows {
		fmt.Fprintf(tw, "%s\t%s\n", row.name, row.value(r))
	}
	tw.Flush()
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

func runCompare(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("compare", "--conf A --conf B ... [--capacity SIZE] TRACE", stderr)
	var confs listFlag
	fs.Var(&confs, "conf", "a configuration to compare (repeatable; PYTORCH_CUDA_ALLOC_CONF syntax; \"\" is PyTorch's default)")
	capacity := &sizeFlag{80 << 30}
	fs.Var(capacity, "capacity", "simulated device memory (80GiB, 512MiB, bytes)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return usageError{"compare takes exactly one trace"}
	}
	if len(confs) == 0 {
		confs = listFlag{""}
	}
	setups := []replaySetup{{label: "baseline (no cache)", baseline: true}}
	for _, c := range confs {
		cfg, err := allocator.ParseConf(c)
		if err != nil {
			return usageError{err.Error()}
		}
		label := c
		if label == "" {
			label = "default"
		}
		setups = append(setups, replaySetup{label: label, conf: cfg})
	}
	path := fs.Arg(0)
	results := make([]*replay.Result, len(setups))
	for i, s := range setups {
		res, err := replayFile(path, s, capacity.n, progressOutput(stderr, false))
		if err != nil {
			return fmt.Errorf("%s: %w", s.label, err)
		}
		results[i] = res
	}
	fmt.Fprintf(stdout, "trace %s on a simulated %s device\n\n", path, capacity)
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	head := []string{""}
	for _, s := range setups {
		head = append(head, s.label)
	}
	fmt.Fprintln(tw, strings.Join(head, "\t")+"\t")
	for _, row := range resultRows {
		cells := []string{row.name}
		for _, r := range results {
			cells = append(cells, row.value(r))
		}
		fmt.Fprintln(tw, strings.Join(cells, "\t")+"\t")
	}
	return tw.Flush()
}

func runConvert(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("convert", "[-o OUT] FILE", stderr)
	out := fs.String("o", "", "write memtrace here (gzip if it ends in .gz) instead of standard output")
	dev := fs.Int("device", 0, "the device of a PyTorch snapshot to convert")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return usageError{"convert takes exactly one file"}
	}
	in, err := os.Open(fs.Arg(0))
	if err != nil {
		return err
	}
	defer in.Close()
	opt := convert.Options{Device: *dev}
	var w io.Writer = stdout
	var file *os.File
	if *out != "" {
		opt.Gzip = strings.HasSuffix(*out, ".gz")
		if file, err = os.Create(*out); err != nil {
			return err
		}
		w = file
	}
	if _, err := convert.Convert(w, in, fs.Arg(0), opt); err != nil {
		if file != nil {
			file.Close()
			os.Remove(*out)
		}
		return err
	}
	if file != nil {
		return file.Close()
	}
	return nil
}
