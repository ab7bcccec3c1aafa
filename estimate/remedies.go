// This file holds the ladder of remedies: the changes that make a plan
// that does not fit its card fit, cheapest first, each with what it then
// needs, ending with the cheapest combination of changes that fits.

package estimate

import (
	"context"
	"fmt"
	"strings"
)

// Remedy is one rung of the ladder: a change to the plan with which it
// fits its card, and what the plan then needs.
type Remedy struct {
	Name   string // what to do
	Change string // the same as command-line flags
	// Need is the smallest capacity, the context included, on which the
	// changed plan runs (Result.MinCapacity of the changed plan): at most
	// the card's capacity.
	Need int64
	// Combined marks a combination of changes: the ladder's last rung,
	// there when no cheaper single change fits.
	Combined bool
}

// change is one change the ladder may make to a workload.
type change struct {
	name, flags string
	apply       func(*Workload)
}

// changes returns the changes that apply to the plan, cheapest first,
// besides a smaller batch (cheapest of all) and more GPUs (dearest):
// flash attention, activation checkpointing, quantization (8-bit Adam;
// int8 and int4 weights for inference), LoRA and QLoRA, offload to host
// memory.
func (pl *Plan) changes() []change {
	w := pl.Workload
	dims := pl.Model != nil
	training := w.Mode.training()
	var out []change
	add := func(name, flags string, f func(*Workload)) { out = append(out, change{name, flags, f}) }
	if dims && w.Attention == Eager {
		add("use flash attention", "--attention flash", func(w *Workload) { w.Attention = Flash })
	}
	if dims && training && w.Checkpointing != 1 {
		add("checkpoint every layer's activations", "--checkpointing", func(w *Workload) { w.Checkpointing = 1 })
	}
	if training && w.Mode != QLoRA && (w.Optimizer == Adam || w.Optimizer == AdamW) && !w.Offload.optimizer() {
		add("8-bit Adam", "--optimizer adam8bit", func(w *Workload) {
			if w.Optimizer == Adam || w.Optimizer == AdamW {
				w.Optimizer = Adam8bit
			}
		})
	}
	if w.Mode == Infer {
		if w.Precision != Int8 && w.Precision != Int4 {
			add("int8 weights", "--precision int8", func(w *Workload) {
				if w.Precision != Int4 {
					w.Precision = Int8
				}
			})
		}
		if w.Precision != Int4 {
			add("int4 weights", "--precision int4", func(w *Workload) { w.Precision = Int4 })
		}
	}
	if dims && w.Mode == Full {
		add("LoRA adapters (rank 8 on q and v)", "--mode lora", func(w *Workload) {
			if w.Mode == Full {
				w.Mode = LoRA
			}
		})
	}
	if dims && (w.Mode == Full || w.Mode == LoRA) {
		flags := "--mode qlora"
		if w.Precision == FP32 { // QLoRA computes in half precision
			flags += " --precision amp-bf16"
		}
		add("QLoRA (4-bit base, LoRA adapters)", flags, func(w *Workload) {
			w.Mode = QLoRA
			if w.Precision == FP32 {
				w.Precision = AMPBF16
			}
		})
	}
	if training && !w.Offload.optimizer() && w.Optimizer != NoOptimizer && w.Optimizer != SGD {
		add("offload the optimizer state to host memory", "--offload optimizer", func(w *Workload) {
			if !w.Offload.params() {
				w.Offload = OffloadOptimizer
			}
		})
	}
	if !w.Offload.params() {
		to, flags := OffloadAll, "--offload all"
		if !training {
			to, flags = OffloadParams, "--offload params"
		}
		add("offload the weights to host memory too", flags, func(w *Workload) { w.Offload = to })
	}
	return out
}

// maxGPUs is the most GPUs the ladder shards over.
const maxGPUs = 1024

// Remedies returns the ladder for a plan that does not fit its card:
// each change that alone makes it fit, cheapest first (the largest
// smaller batch that fits, flash attention, activation checkpointing,
// quantization, LoRA and QLoRA, offload to host memory, and the fewest
// GPUs, up to 1024, over which fully sharded data parallel fits), each
// with what the plan then needs. A change that does not make the plan
// fit is not listed: it does not change the answer. When no single change
// among the cheaper ones fits, the ladder ends with the cheapest
// combination that does (Remedy.Combined): the changes are added in the
// order above, with the largest batch that fits, then GPUs, until the
// plan fits; then each change that the fit does not need is taken out,
// the dearest first. A plan that fits has an empty ladder, and so has a
// plan that nothing here makes fit.
func (pl Plan) Remedies() ([]Remedy, error) {
	if err := pl.Normalize(); err != nil {
		return nil, err
	}
	if pl.fits() {
		return nil, nil
	}
	var out []Remedy
	rung := func(name, flags string, q Plan) error {
		need, err := q.Need()
		if err != nil {
			return err
		}
		out = append(out, Remedy{Name: name, Change: flags, Need: need})
		return nil
	}
	w := pl.Workload
	if b := pl.largestBatch(w.Batch - 1); b > 0 {
		q := pl
		q.Workload.Batch = b
		if err := rung(fmt.Sprintf("lower the batch to %d", b), fmt.Sprintf("--batch %d", b), q); err != nil {
			return nil, err
		}
	}
	batchFits := len(out) > 0
	cs := pl.changes()
	limit := -1 // the first change that fits alone: a combination uses cheaper ones
	for i, c := range cs {
		q := pl
		c.apply(&q.Workload)
		if q.Normalize() == nil && q.fits() {
			if limit < 0 {
				limit = i
			}
			if err := rung(c.name, c.flags, q); err != nil {
				return nil, err
			}
		}
	}
	if n := pl.fewestGPUs(); n > 0 {
		q := pl.withGPUs(n)
		if err := rung(fmt.Sprintf("shard over %d GPUs (FSDP)", n), fmt.Sprintf("--gpus %d --shard fsdp", n), q); err != nil {
			return nil, err
		}
	}
	if batchFits || limit == 0 {
		return out, nil // the cheapest change fits alone
	}
	if limit < 0 { // no change fits alone: combine them all, then GPUs
		limit = len(cs) + 1
	}
	if combo, ok, err := pl.combination(cs, limit); err != nil {
		return nil, err
	} else if ok {
		out = append(out, combo)
	}
	return out, nil
}

// combination returns the cheapest combination of two or more changes,
// of cs[:limit] (with a smaller batch and, when limit reaches past cs,
// more GPUs), with which pl fits, and whether there is one.
func (pl *Plan) combination(cs []change, limit int) (Remedy, bool, error) {
	w := pl.Workload
	apply := func(set []int, batch, gpus int) (Plan, bool) {
		q := *pl
		for _, i := range set {
			cs[i].apply(&q.Workload)
		}
		q.Workload.Batch = batch
		if gpus > 1 {
			q = q.withGPUs(gpus)
		}
		return q, q.Normalize() == nil
	}
	fitsWith := func(set []int, batch, gpus int) bool {
		q, ok := apply(set, batch, gpus)
		return ok && q.fits()
	}
	var set []int
	batch, gpus := w.Batch, 0
	found := false
	for i := 0; i < min(limit, len(cs)) && !found; i++ {
		if _, ok := apply(append(set, i), w.Batch, 0); !ok {
			continue // the change does not combine with those before it
		}
		set = append(set, i)
		switch {
		case fitsWith(set, w.Batch, 0):
			found = true
		case w.Batch > 1 && pl.Model != nil && fitsWith(set, 1, 0):
			q, _ := apply(set, 1, 0)
			batch, found = q.largestBatch(w.Batch-1), true
		}
	}
	if !found && limit > len(cs) {
		q, ok := apply(set, w.Batch, 0)
		if !ok {
			return Remedy{}, false, nil
		}
		if gpus = q.fewestGPUs(); gpus == 0 {
			return Remedy{}, false, nil
		}
		found = true
	}
	if !found {
		return Remedy{}, false, nil
	}
	// Take out what the fit does not need, the dearest change first, then
	// raise the batch again as far as the rest allows.
	for k := len(set) - 1; k >= 0 && len(set) > 1; k-- {
		rest := append(append([]int(nil), set[:k]...), set[k+1:]...)
		if fitsWith(rest, batch, gpus) {
			set = rest
		}
	}
	if batch < w.Batch {
		q, _ := apply(set, w.Batch, gpus)
		batch = max(batch, q.largestBatch(w.Batch))
	}
	parts := len(set)
	if batch < w.Batch {
		parts++
	}
	if gpus > 1 {
		parts++
	}
	if parts < 2 {
		return Remedy{}, false, nil // a single change, listed already
	}
	var names, flags []string
	if batch < w.Batch {
		names = append(names, fmt.Sprintf("lower the batch to %d", batch))
		flags = append(flags, fmt.Sprintf("--batch %d", batch))
	}
	for _, i := range set {
		names = append(names, cs[i].name)
		flags = append(flags, cs[i].flags)
	}
	if gpus > 1 {
		names = append(names, fmt.Sprintf("shard over %d GPUs (FSDP)", gpus))
		flags = append(flags, fmt.Sprintf("--gpus %d --shard fsdp", gpus))
	}
	q, _ := apply(set, batch, gpus)
	need, err := q.Need()
	if err != nil {
		return Remedy{}, false, err
	}
	return Remedy{Name: strings.Join(names, ", "), Change: strings.Join(flags, " "), Need: need, Combined: true}, true, nil
}

// largestBatch returns the largest batch up to limit with which a
// normalized plan with dimensions fits its card (0 if none).
func (pl *Plan) largestBatch(limit int) int {
	if pl.Model == nil || limit < 1 {
		return 0
	}
	n, _ := largest(context.Background(), min(limit, MaxBatch), func(n int) bool {
		q := *pl
		q.Workload.Batch = n
		return q.Normalize() == nil && q.fits()
	}) // no error: the background context is never done
	return n
}

// withGPUs returns the plan fully sharded over n GPUs, each keeping its
// batch.
func (pl Plan) withGPUs(n int) Plan {
	pl.Workload.GPUs, pl.Workload.Shard = n, FSDP
	return pl
}

// fewestGPUs returns the fewest GPUs, doubling from twice the plan's up to
// maxGPUs, over which the plan fully sharded fits (0 if none).
func (pl *Plan) fewestGPUs() int {
	for n := max(2, pl.Workload.GPUs*2); n <= maxGPUs; n *= 2 {
		q := pl.withGPUs(n)
		if q.Normalize() != nil {
			return 0
		}
		if q.fits() {
			return n
		}
	}
	return 0
}

// String writes a remedy as one line.
func (r Remedy) String() string {
	return fmt.Sprintf("%s (%s): needs %s", r.Name, r.Change, FormatBytes(r.Need))
}
