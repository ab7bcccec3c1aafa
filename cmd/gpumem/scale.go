// This file holds `gpumem scale`: probe traces at small batches, and the
// trace, peaks and largest batch predicted from them.

package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/gpumem/gpumem/stats"
	"github.com/gpumem/gpumem/trace"
	"github.com/gpumem/gpumem/trace/plan"
)

// scaleJSON is what scale --json prints.
type scaleJSON struct {
	Batch                  uint64      `json:"batch"`
	Conf                   string      `json:"conf"`
	CapacityBytes          uint64      `json:"capacity_bytes"`
	OverheadBytes          uint64      `json:"overhead_bytes,omitempty"` // with --card: the card is capacity_bytes + overhead_bytes
	Probes                 []probeJSON `json:"probes"`
	Ops                    int         `json:"ops"`
	VaryingAllocations     int         `json:"varying_allocations"`
	PredictedPeakRequested uint64      `json:"predicted_peak_requested_bytes"`
	PredictedPeakAllocated int64       `json:"predicted_peak_allocated_bytes"`
	PredictedPeakReserved  int64       `json:"predicted_peak_reserved_bytes"`
	OOMs                   int64       `json:"ooms"`
	FirstOOM               string      `json:"first_oom,omitempty"`
	MaxBatch               *uint64     `json:"max_batch,omitempty"`
	MaxBatchUnbounded      *bool       `json:"max_batch_unbounded,omitempty"`
	MaxBatchReplays        *int        `json:"max_batch_replays,omitempty"`
}

type probeJSON struct {
	Trace string `json:"trace"`
	Batch uint64 `json:"batch"`
}

// parseProbe reads FILE@BATCH.
func parseProbe(s string) (string, uint64, error) {
	i := strings.LastIndexByte(s, '@')
	if i <= 0 {
		return "", 0, usageError{fmt.Sprintf("--probe %s: want FILE@BATCH", quote(s))}
	}
	b, err := strconv.ParseUint(s[i+1:], 10, 64)
	if err != nil || b < 1 || b > plan.MaxBatch {
		return "", 0, usageError{fmt.Sprintf("--probe %s: the batch must be a whole number from 1 to %d", quote(s), uint64(plan.MaxBatch))}
	}
	return s[:i], b, nil
}

func runScale(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("scale", "--probe FILE@BATCH --probe FILE@BATCH [--probe FILE@BATCH]... --batch N [--capacity SIZE | --card NAME [--overhead SIZE]] [--conf CONF] [--json] [--write OUT]", stderr)
	var probeArgs listFlag
	fs.Var(&probeArgs, "probe", "a trace of the program at a small batch, as `FILE@BATCH` (twice or more; the same ops at each batch)")
	batch := fs.Uint64("batch", 0, "predict the trace at batch `N`")
	dev := addDeviceFlags(fs, "; with --capacity or --card, also find the largest batch that fits")
	conf := fs.String("conf", "", confFlagHelp)
	asJSON := fs.Bool("json", false, "print one JSON object")
	write := fs.String("write", "", "write the trace synthesized at --batch to `OUT` (memtrace; gzip if it ends in .gz)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usageError{fmt.Sprintf("unexpected argument %s (probes are given with --probe FILE@BATCH)", quote(fs.Arg(0)))}
	}
	if len(probeArgs) < 2 {
		return usageError{"give at least two --probe FILE@BATCH"}
	}
	if *batch < 1 || *batch > plan.MaxBatch {
		return usageError{fmt.Sprintf("--batch: give the batch to predict, from 1 to %d", uint64(plan.MaxBatch))}
	}
	if *write == "-" {
		return usageError{"--write -: the report goes to standard output; write the trace to a file"}
	}
	cfg, _, err := resolveConf(fs, *conf)
	if err != nil {
		return err
	}
	capacity, capLabel, capGiven, err := dev.resolve()
	if err != nil {
		return err
	}
	var paths []string
	for _, a := range probeArgs {
		path, _, err := parseProbe(a)
		if err != nil {
			return err
		}
		paths = append(paths, path)
	}
	if err := sameFile("--write", *write, paths...); err != nil {
		return err
	}
	fs.begin()
	var probes []plan.Probe
	for _, a := range probeArgs {
		path, b, err := parseProbe(a)
		if err != nil {
			return err
		}
		ops, err := loadOps(path)
		if err != nil {
			return err
		}
		probes = append(probes, plan.Probe{Name: clip(path), Batch: b, Ops: ops})
	}
	m, err := plan.NewModel(probes...)
	if err != nil {
		var ae *plan.AlignError
		if errors.As(err, &ae) {
			return fmt.Errorf("the probes do not fit one program: %w", err)
		}
		return err
	}
	ops, err := m.Ops(*batch)
	if err != nil {
		return fmt.Errorf("batch %d: %w", *batch, err)
	}
	req := plan.PeakRequested(ops)
	if req > math.MaxInt64 {
		// PeakRequested saturates at 2^64 - 1: the sizes are each in
		// range, but together they overflow.
		return fmt.Errorf("batch %d: the predicted peak requested is more than 8 EiB (the extrapolation overflows 64 bits); give a smaller --batch", *batch)
	}
	if *write != "" {
		header := []string{
			fmt.Sprintf("%s source=gpumem-scale batch=%d", trace.Version, *batch),
			"synthesized from " + probeList(probes) + ": each allocation's size is p + q x batch",
		}
		err := writeOutput(*write, stdout, func(w io.Writer) error {
			var tw *trace.Writer
			if strings.HasSuffix(*write, ".gz") {
				tw = trace.NewGzipWriter(w, header...)
			} else {
				tw = trace.NewWriter(w, header...)
			}
			for _, op := range ops {
				if err := tw.Write(op); err != nil {
					tw.Close()
					return err
				}
			}
			return tw.Close()
		})
		if err != nil {
			return err
		}
	}
	var stage atomic.Value
	stage.Store(fmt.Sprintf("replaying the trace synthesized at batch %d", *batch))
	stop := startProgress(lineOutput(stderr), "gpumem scale", func() string { return stage.Load().(string) })
	defer stop()
	pred, err := plan.ReplayContext(ctx, ops, cfg, capacity)
	if err != nil {
		return fmt.Errorf("replay at batch %d: %w", *batch, err)
	}
	var mb *plan.MaxBatchResult
	if capGiven {
		stage.Store("searching the largest batch that fits")
		if mb, err = m.MaxBatchContext(ctx, cfg, capacity); err != nil {
			return fmt.Errorf("largest batch: %w", err)
		}
	}
	stop()
	if *asJSON {
		out := scaleJSON{
			Batch: *batch, Conf: cfg.String(), CapacityBytes: capacity, OverheadBytes: dev.overheadBytes, Ops: m.Len(), VaryingAllocations: m.Varying(),
			PredictedPeakRequested: req, PredictedPeakAllocated: pred.PeakAllocated, PredictedPeakReserved: pred.PeakReserved,
			OOMs: pred.OOMs,
		}
		if pred.FirstOOM != nil {
			out.FirstOOM = pred.FirstOOM.Error()
		}
		for _, p := range probes {
			out.Probes = append(out.Probes, probeJSON{p.Name, p.Batch})
		}
		if mb != nil {
			n := len(mb.Trials)
			out.MaxBatch, out.MaxBatchUnbounded, out.MaxBatchReplays = &mb.MaxBatch, &mb.Unbounded, &n
		}
		b, err := json.Marshal(out)
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(stdout, "%s\n", b)
		return err
	}
	fmt.Fprintf(stdout, "model: %d ops aligned from %s; %d allocation sizes depend on the batch (p + q x batch, %s)\n",
		m.Len(), probeList(probes), m.Varying(), checkedOn(len(probes)))
	fmt.Fprintf(stdout, "batch %d on a simulated %s device, %s configuration:\n", *batch, capLabel, confLabel(cfg.String()))
	fmt.Fprintf(stdout, "  predicted peak requested  %s\n", human(int64(req)))
	fmt.Fprintf(stdout, "  predicted peak allocated  %s\n", human(pred.PeakAllocated))
	fmt.Fprintf(stdout, "  predicted peak reserved   %s\n", human(pred.PeakReserved))
	fmt.Fprintf(stdout, "  out of memory             %d\n", pred.OOMs)
	if pred.FirstOOM != nil {
		fmt.Fprintf(stdout, "  first out of memory, at allocation %d: %s\n", pred.FirstOOMAlloc, oneLine(pred.FirstOOM.Error()))
	}
	if mb != nil {
		switch {
		case mb.MaxBatch == 0:
			if lo, hi := m.Range(); lo <= hi {
				fmt.Fprintf(stdout, "largest batch that fits: none (batch %d runs out of memory)\n", lo)
			} else {
				fmt.Fprintln(stdout, "largest batch that fits: none (at no batch are all the modelled sizes in range)")
			}
		case mb.Unbounded:
			fmt.Fprintf(stdout, "largest batch that fits: any (the peak does not grow with the batch; tried up to %d)\n", mb.MaxBatch)
		default:
			fmt.Fprintf(stdout, "largest batch that fits: %d (batch %d runs out of memory; %d replays)\n", mb.MaxBatch, mb.MaxBatch+1, len(mb.Trials))
		}
	}
	if *write != "" && *write != "-" {
		fmt.Fprintf(stdout, "wrote the trace at batch %d to %s (%s requested at the peak)\n", *batch, clip(*write), stats.FormatSize(req))
	}
	return nil
}

// probeList names the probes as FILE@BATCH.
func probeList(probes []plan.Probe) string {
	parts := make([]string, len(probes))
	for i, p := range probes {
		parts[i] = fmt.Sprintf("%s@%d", p.Name, p.Batch)
	}
	return strings.Join(parts, ", ")
}

func checkedOn(n int) string {
	if n < 3 {
		return "exact at both probes; a third probe would check it"
	}
	return fmt.Sprintf("checked exactly on all %d probes", n)
}
