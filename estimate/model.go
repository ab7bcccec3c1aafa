// Package estimate answers "will this model fit on this card": it
// estimates the memory a transformer's training takes, both by counting
// (parameters, gradients, optimizer state, activations) and by
// simulation, replaying the training loop's allocations through the
// caching allocator on a simulated device of the card's capacity, so that
// rounding, caching and fragmentation are counted as PyTorch's allocator
// would count them.
//
// # The model
//
// A decoder-only transformer of Layers blocks, each with a fused QKV
// projection, an output projection, a 4x MLP and two layer norms, plus a
// token embedding; weights, gradients, optimizer states and activations
// all use the same element size (Bytes). A training step allocates, in the
// order a framework does: on the first step the optimizer state (Adam:
// two tensors per parameter, momentum SGD: one); then per layer the
// activations kept for backward and a temporary; the logits and the loss;
// backward, layer by layer from the last, producing the gradients and
// freeing the activations; the optimizer update's temporaries; and
// zero_grad, which frees the gradients. The count is deliberately simple
// (no activation checkpointing, no fused kernels, no mixed-precision
// master weights); the simulation answers for allocation patterns exactly,
// the model only approximately.
package estimate

import (
	"errors"
	"fmt"
	"strings"

	"github.com/gpumem/gpumem/trace"
)

// Optimizer says how many state tensors the optimizer keeps per parameter.
type Optimizer int

// Optimizers.
const (
	Adam        Optimizer = iota // two states per parameter (exp_avg, exp_avg_sq)
	SGDMomentum                  // one state per parameter
	SGD                          // no state
)

// ParseOptimizer reads "adam", "momentum" or "sgd".
func ParseOptimizer(s string) (Optimizer, error) {
	switch strings.ToLower(s) {
	case "adam", "adamw":
		return Adam, nil
	case "momentum", "sgd-momentum":
		return SGDMomentum, nil
	case "sgd":
		return SGD, nil
	}
	return 0, fmt.Errorf("estimate: unknown optimizer %q (want adam, momentum or sgd)", s)
}

func (o Optimizer) states() int {
	switch o {
	case Adam:
		return 2
	case SGDMomentum:
		return 1
	}
	return 0
}

// String names the optimizer.
func (o Optimizer) String() string {
	switch o {
	case Adam:
		return "adam"
	case SGDMomentum:
		return "momentum"
	case SGD:
		return "sgd"
	}
	return fmt.Sprintf("Optimizer(%d)", int(o))
}

// Model describes a transformer and its training batch.
type Model struct {
	Layers, Hidden, Heads, Vocab int
	Seq, Batch                   int       // tokens per sequence, sequences per step
	Bytes                        int       // bytes per element: 4 (fp32) or 2 (bf16, fp16)
	Optimizer                    Optimizer // default Adam
}

// Validate checks that the model is one the estimate can handle.
func (m Model) Validate() error {
	var errs []error
	for _, f := range []struct {
		name string
		v    int
	}{{"layers", m.Layers}, {"hidden", m.Hidden}, {"heads", m.Heads}, {"vocab", m.Vocab}, {"seq", m.Seq}, {"batch", m.Batch}} {
		if f.v <= 0 || f.v > 1<<24 {
			errs = append(errs, fmt.Errorf("%s must be in 1..%d, got %d", f.name, 1<<24, f.v))
		}
	}
	if m.Bytes != 2 && m.Bytes != 4 {
		errs = append(errs, fmt.Errorf("bytes per element must be 2 or 4, got %d", m.Bytes))
	}
	if m.Heads > 0 && m.Hidden%m.Heads != 0 {
		errs = append(errs, fmt.Errorf("hidden %d is not a multiple of heads %d", m.Hidden, m.Heads))
	}
	if m.Optimizer < Adam || m.Optimizer > SGD {
		errs = append(errs, fmt.Errorf("unknown optimizer %d", m.Optimizer))
	}
	if len(errs) == 0 && m.activationBytes() > 1<<50 {
		errs = append(errs, errors.New("the activations of one step exceed 1 PiB"))
	}
	if len(errs) > 0 {
		return fmt.Errorf("estimate: invalid model: %w", errors.Join(errs...))
	}
	return nil
}

// paramSizes returns the byte size of every parameter tensor: the
// embedding, then each layer's tensors.
func (m Model) paramSizes() []uint64 {
	h, e := uint64(m.Hidden), uint64(m.Bytes)
	ps := []uint64{uint64(m.Vocab) * h * e}
	for range m.Layers {
		ps = append(ps,
			3*h*h*e, 3*h*e, // fused QKV weight, bias
			h*h*e, h*e, // attention output
			4*h*h*e, 4*h*e, // MLP up
			4*h*h*e, h*e, // MLP down
			h*e, h*e, h*e, h*e) // two layer norms
	}
	return ps
}

const tensorsPerLayer = 12

// Params returns the number of parameters.
func (m Model) Params() int64 {
	var n uint64
	for _, s := range m.paramSizes() {
		n += s
	}
	return int64(n / uint64(m.Bytes))
}

func (m Model) tokens() uint64 { return uint64(m.Batch) * uint64(m.Seq) }

// layerActivations are the tensors one layer keeps for backward: its
// input, the QKV projection, the attention scores and probabilities, the
// attention output, the MLP's two hidden tensors and its output.
func (m Model) layerActivations() []uint64 {
	t, h, e := m.tokens(), uint64(m.Hidden), uint64(m.Bytes)
	scores := uint64(m.Batch) * uint64(m.Heads) * uint64(m.Seq) * uint64(m.Seq) * e
	return []uint64{t * h * e, 3 * t * h * e, scores, scores, t * h * e, 4 * t * h * e, 4 * t * h * e, t * h * e}
}

func (m Model) activationBytes() uint64 {
	var n uint64
	for _, s := range m.layerActivations() {
		n += s
	}
	return n*uint64(m.Layers) + m.logitBytes()
}

func (m Model) logitBytes() uint64 { return m.tokens() * uint64(m.Vocab) * uint64(m.Bytes) }

// Breakdown is the counted memory of training, in bytes.
type Breakdown struct {
	Parameters     int64
	Gradients      int64
	OptimizerState int64
	Activations    int64 // kept for backward at the end of the forward pass, logits included
	Total          int64 // the sum: a lower bound of the peak
}

// Breakdown counts the model's memory.
func (m Model) Breakdown() Breakdown {
	p := m.Params() * int64(m.Bytes)
	b := Breakdown{
		Parameters:     p,
		Gradients:      p,
		OptimizerState: p * int64(m.Optimizer.states()),
		Activations:    int64(m.activationBytes()),
	}
	b.Total = b.Parameters + b.Gradients + b.OptimizerState + b.Activations
	return b
}

// Workload generates the allocations of training m as memtrace ops, each
// allocation with a fresh ID. It is not safe for concurrent use.
type Workload struct {
	m      Model
	next   uint64
	params []uint64 // IDs of the parameter tensors
	state  []uint64 // IDs of the optimizer state
	ops    []trace.Op
}

// NewWorkload returns the workload of m.
func NewWorkload(m Model) (*Workload, error) {
	if err := m.Validate(); err != nil {
		return nil, err
	}
	return &Workload{m: m}, nil
}

func (w *Workload) alloc(n uint64) uint64 {
	id := w.next
	w.next++
	w.ops = append(w.ops, trace.Op{Kind: trace.Alloc, ID: id, Size: n})
	return id
}

func (w *Workload) free(id uint64) { w.ops = append(w.ops, trace.Op{Kind: trace.Free, ID: id}) }

func (w *Workload) temporary(n uint64) { w.free(w.alloc(n)) }

func (w *Workload) take() []trace.Op {
	ops := w.ops
	w.ops = nil
	return ops
}

// Setup returns the allocation of the parameters.
func (w *Workload) Setup() []trace.Op {
	w.ops = append(w.ops, trace.Op{Kind: trace.Tag, Tag: "parameters"})
	for _, n := range w.m.paramSizes() {
		w.params = append(w.params, w.alloc(n))
	}
	return w.take()
}

// Step returns the ops of one training step; the first step also
// allocates the optimizer state, which lives on.
func (w *Workload) Step() []trace.Op {
	m := w.m
	sizes := m.paramSizes()
	if w.state == nil && m.Optimizer.states() > 0 {
		w.ops = append(w.ops, trace.Op{Kind: trace.Tag, Tag: "optimizer-state"})
		for _, n := range sizes {
			for range m.Optimizer.states() {
				w.state = append(w.state, w.alloc(n))
			}
		}
	}
	w.ops = append(w.ops, trace.Op{Kind: trace.Tag, Tag: "forward"})
	h, e := uint64(m.Hidden), uint64(m.Bytes)
	acts := make([][]uint64, m.Layers)
	for l := range acts {
		for _, n := range m.layerActivations() {
			acts[l] = append(acts[l], w.alloc(n))
		}
		w.temporary(m.tokens() * h * e)
	}
	logits := w.alloc(m.logitBytes())
	w.temporary(uint64(m.Bytes)) // the loss
	w.ops = append(w.ops, trace.Op{Kind: trace.Tag, Tag: "backward"})
	w.free(logits)
	grads := []uint64{w.alloc(sizes[0])} // the embedding's gradient
	for l := m.Layers - 1; l >= 0; l-- {
		for _, n := range sizes[1+l*tensorsPerLayer : 1+(l+1)*tensorsPerLayer] {
			grads = append(grads, w.alloc(n))
		}
		w.temporary(4 * m.tokens() * h * e)
		for _, id := range acts[l] {
			w.free(id)
		}
	}
	w.ops = append(w.ops, trace.Op{Kind: trace.Tag, Tag: "optimizer"})
	for _, n := range sizes {
		w.temporary(n)
	}
	for _, id := range grads { // zero_grad(set_to_none=True)
		w.free(id)
	}
	w.ops = append(w.ops, trace.Op{Kind: trace.Tag})
	return w.take()
}
