// This file holds the plan (a model, a workload, a card) and its
// estimate: the count, the simulation and the verdict.

package estimate

import (
	"errors"
	"fmt"
	"strings"

	"github.com/gpumem/gpumem/allocator"
)

// DefaultContext is the per-process memory outside the caching allocator:
// the CUDA context with its loaded kernels (cuDNN, cuBLAS, NCCL add to it),
// as nvidia-smi shows it for a PyTorch process with CUDA 12's lazy module
// loading, measured at 300 to 600 MiB; 512 MiB is the middle. The cuBLAS
// workspaces are taken from the allocator and simulated.
const DefaultContext = 512 << 20

// Plan is one question: this model, doing this, on this card.
type Plan struct {
	// Model is the architecture; nil means only Params is known, which
	// gives the parameter state (weights, gradients, optimizer) but no
	// activations.
	Model  *Model
	Params int64 // the bare parameter count when Model is nil

	Workload Workload
	Capacity uint64 // one GPU's memory in bytes
	// Context is the per-process memory outside the allocator; 0 means
	// DefaultContext and a negative value none.
	Context int64
	Alloc   allocator.Config // the caching allocator's configuration
}

// Breakdown is the counted memory of one GPU, in bytes. Each row is its
// category's own high-water mark over the steps; Total is the high-water
// mark of their sum plus the overhead, which is below the sum of the rows
// because gradients and activations, or the optimizer's temporaries and
// activations, are not at their largest together.
type Breakdown struct {
	Weights     int64 // parameters as stored on the GPU: master and compute copies, quantization scales
	Gradients   int64
	Optimizer   int64 // optimizer state
	Activations int64 // activations kept for backward, transients, their gradients, logits and loss
	KVCache     int64 // keys and values held by the cache
	Temporaries int64 // optimizer-step lists, gathered shards, dequantized weights
	Overhead    int64 // CUDA context and cuBLAS workspaces
	Total       int64 // the counted peak of everything plus the context
	PeakPhase   string
	Host        int64 // bytes kept in host memory by offloading (per GPU process)
}

// Phase is one phase of the run (setup, forward, backward, optimizer,
// prefill, decode) and its peaks: counted, and simulated allocated and
// reserved.
type Phase struct {
	Name      string
	Counted   int64
	Allocated int64
	Reserved  int64
}

// Result is an estimate.
type Result struct {
	Plan       Plan // normalized
	Parameters int64
	Trainable  int64
	Breakdown  Breakdown
	Phases     []Phase
	Sim        *Simulation
	// MinCapacity is what the plan needs: the smallest capacity, the
	// context included, on which the simulated run has no out-of-memory
	// error, searched in Steps of the device (the capacity less the
	// context) as trace/plan's Fit searches a trace's: the run at it has
	// no out-of-memory error, the run one Step below has one. It is not
	// the peak reserved on a roomy device: under pressure the allocator
	// frees its cache and retries, so a run often fits below that peak.
	// 0 means that not even the largest simulated device (MaxDevice plus
	// the context) runs it.
	MinCapacity uint64
	// Fits reports whether the plan fits its card: MinCapacity is at
	// most the capacity, and the simulation on the card itself has no
	// out-of-memory error (a caching allocator is not monotone in the
	// capacity; a card above MinCapacity on which the run fails is said
	// in Notes).
	Fits bool
	// Notes are caveats worth printing.
	Notes []string
}

// Normalize fills defaults and validates the plan. It is called by
// Estimate; the error is one line.
func (pl *Plan) Normalize() error {
	w := &pl.Workload
	if pl.Model != nil {
		m := *pl.Model // the caller's model is not changed
		m.Normalize()
		if err := m.Validate(); err != nil {
			return err
		}
		pl.Model = &m
		if w.Seq == 0 {
			w.Seq = min(512, max(m.MaxPositions, 1))
		}
	} else if pl.Params < 1 || pl.Params > MaxParameters {
		return fmt.Errorf("parameters must be 1..%g, got %d", float64(MaxParameters), pl.Params)
	}
	w.Normalize()
	if err := w.Validate(); err != nil {
		return err
	}
	var errs []string
	if m := pl.Model; m != nil {
		if m.Family != Llama && w.Seq+w.Generate > m.MaxPositions {
			errs = append(errs, fmt.Sprintf("seq %d is longer than the model's %d learned positions", w.Seq+w.Generate, m.MaxPositions))
		}
		if m.Family == BERT && w.Generate > 0 {
			errs = append(errs, "an encoder does not generate")
		}
		if m.Head == ClassifierHead && w.Mode == Infer && w.Generate > 0 {
			errs = append(errs, "a classifier does not generate")
		}
	} else if w.Mode == LoRA || w.Mode == QLoRA {
		errs = append(errs, "LoRA and QLoRA adapters need the model's dimensions (--model, --config or --layers and --hidden), not a bare --params")
	}
	if pl.Capacity == 0 || pl.Capacity > MaxDevice {
		errs = append(errs, fmt.Sprintf("capacity must be 1 byte..8 TiB, got %d", pl.Capacity))
	}
	if pl.Context == 0 {
		pl.Context = DefaultContext
	}
	if len(errs) > 0 {
		return errors.New(strings.Join(errs, "; "))
	}
	return nil
}

// context returns the per-process memory outside the allocator.
func (pl *Plan) context() uint64 { return uint64(max(pl.Context, 0)) }

// Estimate counts the plan's memory and simulates it through the caching
// allocator on one GPU of the card.
func (pl Plan) Estimate() (*Result, error) {
	if err := pl.Normalize(); err != nil {
		return nil, err
	}
	c, prog, st := record(&pl)
	r := &Result{Plan: pl, Parameters: pl.Params, Trainable: prog.trainable()}
	if pl.Model != nil {
		r.Parameters = pl.Model.Params()
	}
	ctx := pl.context()
	ws := c.high[catWorkspace]
	b := &r.Breakdown
	b.Weights = i64(c.high[catWeights])
	b.Gradients = i64(c.high[catGrads])
	b.Optimizer = i64(c.high[catOptimizer])
	b.Activations = i64(c.high[catActivations])
	b.KVCache = i64(c.high[catKVCache])
	b.Temporaries = i64(c.high[catTemporary])
	b.Overhead = i64(add(ctx, ws))
	b.Total = i64(add(c.peak, ctx))
	b.PeakPhase = c.at
	b.Host = i64(prog.host)
	r.Phases = c.phases

	var dev uint64
	if ctx < pl.Capacity {
		dev = pl.Capacity - ctx
	}
	s, phases, err := simulate(&pl, dev)
	if err != nil {
		return nil, err
	}
	r.Sim = s
	for i := range r.Phases {
		if i < len(phases) {
			r.Phases[i].Allocated, r.Phases[i].Reserved = phases[i].Allocated, phases[i].Reserved
		}
	}
	if r.MinCapacity, err = pl.minCapacity(st); err != nil {
		return nil, err
	}
	r.Fits = r.MinCapacity != 0 && r.MinCapacity <= pl.Capacity && !s.OOM
	if r.MinCapacity != 0 && r.MinCapacity <= pl.Capacity && s.OOM {
		r.Notes = append(r.Notes, fmt.Sprintf("the run fits on %s but runs out of memory on the card's %s: the caching allocator is not monotone in the capacity",
			FormatBytes(i64(r.MinCapacity)), FormatBytes(i64(pl.Capacity))))
	}
	if pl.Model == nil {
		r.Notes = append(r.Notes, "parameter state only: activations need the model's dimensions (--model, --config or --layers and --hidden)")
	}
	return r, nil
}

func i64(n uint64) int64 { return int64(min(n, capBytes)) }

// trainable returns the parameters that train.
func (p *program) trainable() int64 {
	var n uint64
	for _, u := range p.units {
		for _, x := range u.params {
			if x.train {
				n = add(n, x.elems())
			}
		}
	}
	return i64(n)
}
