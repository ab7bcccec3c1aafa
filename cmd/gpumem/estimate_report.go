// This file holds the output of `gpumem estimate`: the text report and
// the JSON object.

package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/gpumem/gpumem/estimate"
)

// estimateReport is everything the command prints.
type estimateReport struct {
	r        *estimate.Result
	card     string
	need     int64 // bytes one GPU needs: Result.MinCapacity (0: more than the largest simulated device)
	remedies []estimate.Remedy
	maxBatch *int
	maxSeq   *int
	// quoteName: the model's name came from a file (a config's
	// _name_or_path) and is printed quoted and bounded, so that no escape
	// sequence or line break in it reaches the terminal.
	quoteName bool
}

// newReport estimates pl and, if asked, searches the largest batch and
// sequence, until stop is done.
func newReport(stop context.Context, pl estimate.Plan, card string, wantBatch, wantSeq bool) (*estimateReport, error) {
	r, err := pl.Estimate()
	if err != nil {
		return nil, err
	}
	rep := &estimateReport{r: r, card: card, need: int64(min(r.MinCapacity, 1<<62))}
	if !r.Fits {
		if rep.remedies, err = pl.Remedies(); err != nil {
			return nil, err
		}
	}
	if wantBatch {
		n, err := pl.MaxBatchContext(stop, estimate.MaxBatch)
		if err != nil {
			return nil, err
		}
		rep.maxBatch = &n
	}
	if wantSeq {
		n, err := pl.MaxSeqContext(stop, estimate.MaxSequence)
		if err != nil {
			return nil, err
		}
		rep.maxSeq = &n
	}
	return rep, nil
}

// describe says what is estimated, in two lines.
func (rep *estimateReport) describe() string {
	r := rep.r
	pl := r.Plan
	w := pl.Workload
	var b strings.Builder
	if m := pl.Model; m != nil {
		kv := ""
		if m.KVHeads != m.Heads {
			kv = fmt.Sprintf(" (%d kv)", m.KVHeads)
		}
		name := m.Name
		if rep.quoteName {
			name = quote(name)
		}
		fmt.Fprintf(&b, "%s: %d layers, hidden %d, %d heads%s, MLP %d, vocab %d; %s parameters\n",
			name, m.Layers, m.Hidden, m.Heads, kv, m.Intermediate, m.Vocab, estimate.FormatCount(r.Parameters))
	} else {
		fmt.Fprintf(&b, "%s parameters (no dimensions: parameter state only)\n", estimate.FormatCount(r.Parameters))
	}
	what := map[estimate.Mode]string{estimate.Full: "full training", estimate.LoRA: "LoRA", estimate.QLoRA: "QLoRA", estimate.Infer: "inference"}[w.Mode]
	fmt.Fprintf(&b, "%s, %s", what, w.Precision)
	if w.Mode != estimate.Infer {
		fmt.Fprintf(&b, ", %s (%s)", w.Optimizer, w.OptimizerImpl)
		if w.Mode != estimate.Full {
			fmt.Fprintf(&b, ", rank %d on %s (%s trainable)", w.LoRARank, strings.Join(w.LoRATargets, ","), estimate.FormatCount(r.Trainable))
		}
	}
	if pl.Model != nil {
		fmt.Fprintf(&b, ", batch %d × %d tokens", w.Batch, w.Seq)
		if w.Generate > 0 {
			fmt.Fprintf(&b, " + %d generated", w.Generate)
		}
		fmt.Fprintf(&b, ", %s attention", w.Attention)
		if w.Checkpointing == 1 {
			b.WriteString(", checkpointing every layer")
		} else if w.Checkpointing > 1 {
			fmt.Fprintf(&b, ", checkpointing every %d layers", w.Checkpointing)
		}
	}
	if w.GPUs > 1 || w.Shard != estimate.NoShard {
		fmt.Fprintf(&b, ", %d GPUs (shard %s)", w.GPUs, w.Shard)
	}
	if w.Offload != estimate.NoOffload {
		fmt.Fprintf(&b, ", offload %s", w.Offload)
	}
	fmt.Fprintf(&b, "; %s\n", rep.device())
	return b.String()
}

func (rep *estimateReport) device() string {
	c := size(int64(rep.r.Plan.Capacity))
	if rep.card != "" {
		return fmt.Sprintf("%s (%s)", rep.card, c)
	}
	return c + " device"
}

func (rep *estimateReport) writeText(w io.Writer) {
	r := rep.r
	b := r.Breakdown
	fmt.Fprint(w, rep.describe())
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "counted, per GPU\tweights\t%s\n", size(b.Weights))
	fmt.Fprintf(tw, "\tgradients\t%s\n", size(b.Gradients))
	fmt.Fprintf(tw, "\toptimizer state\t%s\n", size(b.Optimizer))
	fmt.Fprintf(tw, "\tactivations\t%s\n", activationsCell(r))
	fmt.Fprintf(tw, "\tkey/value cache\t%s\n", size(b.KVCache))
	fmt.Fprintf(tw, "\ttemporaries\t%s\n", size(b.Temporaries))
	fmt.Fprintf(tw, "\toverhead\t%s (CUDA context and cuBLAS workspaces)\n", size(b.Overhead))
	fmt.Fprintf(tw, "\ttotal\t%s (peak in %s)\n", size(b.Total), b.PeakPhase)
	if b.Host > 0 {
		fmt.Fprintf(tw, "\thost memory\t%s\n", size(b.Host))
	}
	s := r.Sim
	fmt.Fprintf(tw, "simulated, caching allocator\tpeak allocated\t%s\n", size(s.PeakAllocated))
	fmt.Fprintf(tw, "\tpeak reserved\t%s (fragmentation %.3f)\n", size(s.PeakReserved), s.Fragmentation)
	if s.OOM {
		fmt.Fprintf(tw, "\tout of memory\tyes: %s requested in %s\n", size(int64(min(s.OOMBytes, 1<<62))), s.OOMPhase)
	} else {
		fmt.Fprintf(tw, "\tout of memory\tno\n")
	}
	tw.Flush()
	fmt.Fprintln(w)
	needs := "needs " + size(rep.need)
	if rep.need == 0 {
		needs = "needs more than the largest simulated device (" + size(estimate.MaxDevice) + " plus the overhead)"
	}
	if r.Fits {
		fmt.Fprintf(w, "fits on %s: %s, %s to spare\n", rep.device(), needs, size(int64(r.Plan.Capacity)-rep.need))
	} else {
		fmt.Fprintf(w, "does not fit on %s: %s\n", rep.device(), needs)
		if len(rep.remedies) > 0 {
			fmt.Fprintln(w, "remedies that make it fit, cheapest first:")
			for _, m := range rep.remedies {
				if m.Combined {
					fmt.Fprintf(w, "  combined: %s\n", m)
				} else {
					fmt.Fprintf(w, "  %s\n", m)
				}
			}
		} else {
			fmt.Fprintln(w, "no remedy here makes it fit")
		}
	}
	if rep.maxBatch != nil {
		fmt.Fprintf(w, "largest batch that fits: %s\n", searchCell(*rep.maxBatch))
	}
	if rep.maxSeq != nil {
		fmt.Fprintf(w, "longest sequence that fits: %s\n", searchCell(*rep.maxSeq))
	}
	for _, n := range r.Notes {
		fmt.Fprintf(w, "note: %s\n", n)
	}
}

func activationsCell(r *estimate.Result) string {
	if r.Plan.Model == nil {
		return "not counted (needs dimensions)"
	}
	return size(r.Breakdown.Activations)
}

func searchCell(n int) string {
	if n == 0 {
		return "none (not even 1)"
	}
	return fmt.Sprint(n)
}

// estimateJSON is the --json object. Sizes are bytes per GPU.
// min_capacity_bytes is what the plan needs (Result.MinCapacity: the
// smallest capacity, overhead included, on which the simulated run has no
// out-of-memory error; 0 when not even the largest simulated device runs
// it); need_bytes is the same figure under its older name. fits is
// min_capacity_bytes <= capacity_bytes, with the run on the card itself
// free of out-of-memory errors. Each remedy makes the plan fit; its
// need_bytes is the changed plan's min_capacity_bytes.
type estimateJSON struct {
	Model               string       `json:"model"`
	Parameters          int64        `json:"parameters"`
	TrainableParameters int64        `json:"trainable_parameters"`
	Mode                string       `json:"mode"`
	Precision           string       `json:"precision"`
	Optimizer           string       `json:"optimizer,omitempty"`
	OptimizerImpl       string       `json:"optimizer_impl,omitempty"`
	Batch               int          `json:"batch"`
	Seq                 int          `json:"seq"`
	Generate            int          `json:"generate"`
	Attention           string       `json:"attention"`
	Checkpointing       int          `json:"checkpointing"`
	GPUs                int          `json:"gpus"`
	Shard               string       `json:"shard"`
	Offload             string       `json:"offload"`
	Card                string       `json:"card,omitempty"`
	CapacityBytes       uint64       `json:"capacity_bytes"`
	WeightsBytes        int64        `json:"weights_bytes"`
	GradientsBytes      int64        `json:"gradients_bytes"`
	OptimizerBytes      int64        `json:"optimizer_bytes"`
	ActivationsBytes    int64        `json:"activations_bytes"`
	ActivationsCounted  bool         `json:"activations_counted"`
	KVCacheBytes        int64        `json:"kv_cache_bytes"`
	TemporariesBytes    int64        `json:"temporaries_bytes"`
	OverheadBytes       int64        `json:"overhead_bytes"`
	TotalBytes          int64        `json:"total_bytes"`
	PeakPhase           string       `json:"peak_phase"`
	HostBytes           int64        `json:"host_bytes"`
	PeakAllocatedBytes  int64        `json:"peak_allocated_bytes"`
	PeakReservedBytes   int64        `json:"peak_reserved_bytes"`
	PeakRequestedBytes  int64        `json:"peak_requested_bytes"`
	Fragmentation       float64      `json:"fragmentation"`
	OOM                 bool         `json:"oom"`
	OOMPhase            string       `json:"oom_phase,omitempty"`
	MinCapacityBytes    int64        `json:"min_capacity_bytes"`
	NeedBytes           int64        `json:"need_bytes"`
	Fits                bool         `json:"fits"`
	Phases              []phaseJSON  `json:"phases"`
	Remedies            []remedyJSON `json:"remedies"`
	MaxBatch            *int         `json:"max_batch,omitempty"`
	MaxSeq              *int         `json:"max_seq,omitempty"`
	Notes               []string     `json:"notes,omitempty"`
}

type phaseJSON struct {
	Name           string `json:"name"`
	CountedBytes   int64  `json:"counted_bytes"`
	AllocatedBytes int64  `json:"allocated_bytes"`
	ReservedBytes  int64  `json:"reserved_bytes"`
}

type remedyJSON struct {
	Name      string `json:"name"`
	Change    string `json:"change"`
	NeedBytes int64  `json:"need_bytes"` // the changed plan's min_capacity_bytes
	Combined  bool   `json:"combined"`
}

func (rep *estimateReport) writeJSON(w io.Writer) error {
	r := rep.r
	pl, b, s := r.Plan, r.Breakdown, r.Sim
	wl := pl.Workload
	j := estimateJSON{
		Parameters: r.Parameters, TrainableParameters: r.Trainable,
		Mode: wl.Mode.String(), Precision: wl.Precision.String(),
		Batch: wl.Batch, Seq: wl.Seq, Generate: wl.Generate, Attention: wl.Attention.String(),
		Checkpointing: wl.Checkpointing, GPUs: wl.GPUs, Shard: wl.Shard.String(), Offload: wl.Offload.String(),
		Card: rep.card, CapacityBytes: pl.Capacity,
		WeightsBytes: b.Weights, GradientsBytes: b.Gradients, OptimizerBytes: b.Optimizer,
		ActivationsBytes: b.Activations, ActivationsCounted: pl.Model != nil, KVCacheBytes: b.KVCache,
		TemporariesBytes: b.Temporaries, OverheadBytes: b.Overhead, TotalBytes: b.Total, PeakPhase: b.PeakPhase,
		HostBytes: b.Host, PeakAllocatedBytes: s.PeakAllocated, PeakReservedBytes: s.PeakReserved,
		PeakRequestedBytes: s.PeakRequested, Fragmentation: s.Fragmentation, OOM: s.OOM, OOMPhase: s.OOMPhase,
		MinCapacityBytes: rep.need, NeedBytes: rep.need, Fits: r.Fits, MaxBatch: rep.maxBatch, MaxSeq: rep.maxSeq, Notes: r.Notes,
		Phases: []phaseJSON{}, Remedies: []remedyJSON{},
	}
	if pl.Model != nil {
		j.Model = pl.Model.Name
	}
	if wl.Mode != estimate.Infer {
		j.Optimizer, j.OptimizerImpl = wl.Optimizer.String(), wl.OptimizerImpl.String()
	}
	for _, p := range r.Phases {
		j.Phases = append(j.Phases, phaseJSON{p.Name, p.Counted, p.Allocated, p.Reserved})
	}
	for _, m := range rep.remedies {
		j.Remedies = append(j.Remedies, remedyJSON{m.Name, m.Change, m.Need, m.Combined})
	}
	out, err := json.Marshal(j)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "%s\n", out)
	return err
}
