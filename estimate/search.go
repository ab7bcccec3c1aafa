// This file holds the searches: the largest batch and sequence that fit,
// and the ladder of remedies when the plan does not.

package estimate

import (
	"context"
	"fmt"
	"strings"
)

// Fits simulates the plan on its card and reports whether every
// allocation succeeded.
func (pl Plan) Fits() (bool, error) {
	if err := pl.Normalize(); err != nil {
		return false, err
	}
	return pl.fits(), nil
}

// fits simulates a normalized plan; a plan that cannot be simulated does
// not fit.
func (pl *Plan) fits() bool {
	ctx := pl.context()
	if ctx >= pl.Capacity {
		return false
	}
	s, _, err := simulate(pl, pl.Capacity-ctx)
	return err == nil && !s.OOM
}

// Need returns the memory one GPU would need for the plan: the simulated
// peak reserved on an unbounded device plus the context, or, when even
// the largest simulated device is too small, the counted total.
func (pl Plan) Need() (int64, error) {
	if err := pl.Normalize(); err != nil {
		return 0, err
	}
	return pl.need(), nil
}

func (pl *Plan) need() int64 {
	c, _ := count(pl)
	total := add(c.peak, pl.context())
	if total < MaxDevice/2 {
		if s, _, err := simulate(pl, MaxDevice); err == nil && !s.OOM {
			return i64(add(uint64(s.PeakReserved), pl.context()))
		}
	}
	return i64(total)
}

// MaxBatch returns the largest batch, up to limit, with which the plan
// fits its card (0 if not even one sequence fits). A batch too large to
// represent simply does not fit.
func (pl Plan) MaxBatch(limit int) (int, error) {
	return pl.MaxBatchContext(context.Background(), limit)
}

// MaxBatchContext is MaxBatch, stopped when ctx is done: it checks ctx
// before each simulation, and then returns an error that wraps ctx.Err().
func (pl Plan) MaxBatchContext(ctx context.Context, limit int) (int, error) {
	if err := pl.Normalize(); err != nil {
		return 0, err
	}
	if pl.Model == nil {
		return 0, errNeedsDims
	}
	return largest(ctx, min(limit, MaxBatch), func(n int) bool {
		q := pl
		q.Workload.Batch = n
		return q.Normalize() == nil && q.fits()
	})
}

// MaxSeq returns the longest sequence (the context, in inference), up to
// limit and the model's learned positions, with which the plan fits.
func (pl Plan) MaxSeq(limit int) (int, error) {
	return pl.MaxSeqContext(context.Background(), limit)
}

// MaxSeqContext is MaxSeq, stopped when ctx is done: it checks ctx before
// each simulation, and then returns an error that wraps ctx.Err().
func (pl Plan) MaxSeqContext(ctx context.Context, limit int) (int, error) {
	if err := pl.Normalize(); err != nil {
		return 0, err
	}
	if pl.Model == nil {
		return 0, errNeedsDims
	}
	limit = min(limit, MaxSequence)
	if pl.Model.Family != Llama {
		limit = min(limit, pl.Model.MaxPositions-pl.Workload.Generate)
	}
	return largest(ctx, limit, func(n int) bool {
		q := pl
		q.Workload.Seq = n
		return q.Normalize() == nil && q.fits()
	})
}

var errNeedsDims = fmt.Errorf("the search needs the model's dimensions, not a bare parameter count")

// largest returns the largest n in 1..limit for which fits holds, assuming
// that it holds up to some n and not beyond (0 if not even for 1): it
// doubles, then bisects. It checks ctx before each call of fits.
func largest(ctx context.Context, limit int, fits func(int) bool) (int, error) {
	var stopped error
	try := func(n int) bool {
		if stopped = ctx.Err(); stopped != nil {
			return false
		}
		return fits(n)
	}
	done := func(n int) (int, error) {
		if stopped != nil {
			return 0, fmt.Errorf("search stopped: %w", stopped)
		}
		return n, nil
	}
	if limit < 1 || !try(1) {
		return done(0)
	}
	lo, hi := 1, 0 // fits(lo); !fits(hi) once hi > 0
	for hi == 0 {
		n := min(lo*2, limit)
		if n == lo {
			return done(lo)
		}
		if try(n) {
			lo = n
		} else {
			hi = n
		}
		if stopped != nil {
			return done(0)
		}
	}
	for hi-lo > 1 && stopped == nil {
		mid := lo + (hi-lo)/2
		if try(mid) {
			lo = mid
		} else {
			hi = mid
		}
	}
	return done(lo)
}

// Remedy is one rung of the ladder: a change to the plan and what the
// plan would then need.
type Remedy struct {
	Name   string // what to do
	Change string // the same as command-line flags
	Need   int64  // bytes per GPU: simulated peak reserved plus the context
	Fits   bool
}

// Remedies returns the ladder of changes that lower the memory, cheapest
// first, each applied alone to the plan: halve the batch, flash attention,
// activation checkpointing, quantization (8-bit Adam; int8 and int4
// weights for inference), LoRA and QLoRA, offload to host memory, and
// sharding over more GPUs (the fewest, up to 1024, that fit).
func (pl Plan) Remedies() ([]Remedy, error) {
	if err := pl.Normalize(); err != nil {
		return nil, err
	}
	w := pl.Workload
	var out []Remedy
	try := func(name, change string, f func(*Workload)) {
		q := pl
		f(&q.Workload)
		if q.Normalize() != nil {
			return
		}
		out = append(out, Remedy{Name: name, Change: change, Need: q.need(), Fits: q.fits()})
	}
	dims := pl.Model != nil
	if dims && w.Batch > 1 {
		try(fmt.Sprintf("halve the batch to %d", w.Batch/2), fmt.Sprintf("--batch %d", w.Batch/2),
			func(w *Workload) { w.Batch /= 2 })
	}
	if dims && w.Attention == Eager {
		try("use flash attention", "--attention flash", func(w *Workload) { w.Attention = Flash })
	}
	training := w.Mode.training()
	if dims && training && w.Checkpointing != 1 {
		try("checkpoint every layer's activations", "--checkpointing", func(w *Workload) { w.Checkpointing = 1 })
	}
	if training && w.Mode != QLoRA && (w.Optimizer == Adam || w.Optimizer == AdamW) && !w.Offload.optimizer() {
		try("8-bit Adam", "--optimizer adam8bit", func(w *Workload) { w.Optimizer = Adam8bit })
	}
	if w.Mode == Infer {
		if w.Precision != Int8 && w.Precision != Int4 {
			try("int8 weights", "--precision int8", func(w *Workload) { w.Precision = Int8 })
		}
		if w.Precision != Int4 {
			try("int4 weights", "--precision int4", func(w *Workload) { w.Precision = Int4 })
		}
	}
	if dims && w.Mode == Full {
		try("LoRA adapters (rank 8 on q and v)", "--mode lora", func(w *Workload) { w.Mode = LoRA })
	}
	if dims && (w.Mode == Full || w.Mode == LoRA) {
		change := "--mode qlora"
		if w.Precision == FP32 { // QLoRA computes in half precision
			change += " --precision amp-bf16"
		}
		try("QLoRA (4-bit base, LoRA adapters)", change, func(w *Workload) {
			w.Mode = QLoRA
			if w.Precision == FP32 {
				w.Precision = AMPBF16
			}
		})
	}
	if training && !w.Offload.optimizer() && w.Optimizer != NoOptimizer && w.Optimizer != SGD {
		try("offload the optimizer state to host memory", "--offload optimizer",
			func(w *Workload) { w.Offload = OffloadOptimizer })
	}
	if !w.Offload.params() {
		to, change := OffloadAll, "--offload all"
		if !training {
			to, change = OffloadParams, "--offload params"
		}
		try("offload the weights to host memory too", change, func(w *Workload) { w.Offload = to })
	}
	out = append(out, pl.moreGPUs()...)
	return out, nil
}

// moreGPUs finds the fewest GPUs (doubling up to 1024) over which fully
// sharded data parallel fits, each GPU keeping its batch.
func (pl Plan) moreGPUs() []Remedy {
	var last Remedy
	for n := max(2, pl.Workload.GPUs*2); n <= 1024; n *= 2 {
		q := pl
		q.Workload.GPUs, q.Workload.Shard = n, FSDP
		if q.Normalize() != nil {
			return nil
		}
		last = Remedy{Name: fmt.Sprintf("shard over %d GPUs (FSDP)", n), Change: fmt.Sprintf("--gpus %d --shard fsdp", n)}
		if q.fits() {
			last.Need, last.Fits = q.need(), true
			return []Remedy{last}
		}
		if n == 1024 {
			last.Need = q.need()
		}
	}
	if last.Name == "" {
		return nil
	}
	return []Remedy{last}
}

// String writes a remedy as one line.
func (r Remedy) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s (%s): needs %s", r.Name, r.Change, FormatBytes(r.Need))
	if r.Fits {
		b.WriteString(", fits")
	}
	return b.String()
}
