// This file holds the tape: the small emulation of PyTorch's autograd
// that turns a model's forward code into the stream of allocations and
// frees a real run makes. See doc.go for the overview.
//
// A tensor is freed when nothing needs it any more: the program has
// dropped it (its Python variable went out of scope) and no recorded
// operation keeps it for backward. Backward walks the recorded operations
// in reverse, allocating the gradient of each input, accumulating
// gradients that meet in place, and releasing what each operation kept.

package estimate

// category is what a buffer holds, for the breakdown.
type category int

const (
	catWeights     category = iota // parameters, compute copies, quantization scales
	catGrads                       // parameter gradients and gradient buckets
	catOptimizer                   // optimizer state
	catActivations                 // activations, kept or transient, and their gradients
	catKVCache                     // keys and values held by the returned cache
	catTemporary                   // optimizer-step lists, gathered shards, dequantized weights
	catWorkspace                   // cuBLAS workspaces (part of the per-process overhead)
	numCategories
)

// sink receives the allocation stream. alloc returns a handle and false
// when the device is out of memory; the tape then stops allocating.
type sink interface {
	alloc(n uint64, c category) (h uint64, ok bool)
	free(h, n uint64, c category)
	recategorize(n uint64, from, to category)
	phase(name string)
}

// tensor is one allocation.
type tensor struct {
	n     uint64
	cat   category
	h     uint64
	live  bool
	held  int     // references the program holds
	saves int     // recorded operations that keep it for backward
	rg    bool    // requires grad
	grad  *tensor // its gradient, while backward builds it
}

// param is one parameter tensor, or a flat shard of a layer's parameters.
type param struct {
	spec
	train bool    // receives a gradient
	gradN uint64  // bytes of its gradient
	grad  *tensor // its gradient, while it exists
}

// op is a recorded operation: what its backward needs and produces.
type op struct {
	out    *tensor
	ins    []*tensor // inputs that receive a gradient
	saved  []*tensor // kept for backward
	params []*param  // trainable parameters that receive a gradient
	temp   uint64    // bytes backward allocates besides the gradients
}

// tape records operations and drives the sink.
type tape struct {
	s      sink
	failed bool  // an allocation failed: nothing more is allocated
	record bool  // autograd records (training, outside checkpointed layers)
	ops    []*op // operations recorded since the program last took them
}

// alloc allocates a tensor held once by the caller. A zero size or a
// failed tape gives a tensor that is not live.
func (t *tape) alloc(n uint64, c category) *tensor {
	x := &tensor{n: n, cat: c, held: 1}
	if n == 0 || t.failed {
		return x
	}
	h, ok := t.s.alloc(n, c)
	if !ok {
		t.failed = true
		return x
	}
	x.h, x.live = h, true
	return x
}

// release frees x now, whatever holds it.
func (t *tape) release(x *tensor) {
	if x != nil && x.live {
		t.s.free(x.h, x.n, x.cat)
		x.live = false
	}
}

// keep adds a reference to x.
func (t *tape) keep(x *tensor) *tensor {
	x.held++
	return x
}

// drop removes a reference to each tensor, freeing those nothing needs.
func (t *tape) drop(xs ...*tensor) {
	for _, x := range xs {
		if x == nil {
			continue
		}
		x.held--
		if x.held <= 0 && x.saves == 0 {
			t.release(x)
		}
	}
}

// unsave ends one recorded operation's hold on x.
func (t *tape) unsave(x *tensor) {
	x.saves--
	if x.saves <= 0 && x.held <= 0 {
		t.release(x)
	}
}

// moveTo re-files a live tensor under another category (a tensor the
// returned key/value cache takes over).
func (t *tape) moveTo(x *tensor, c category) {
	if x.cat != c {
		if x.live {
			t.s.recategorize(x.n, x.cat, c)
		}
		x.cat = c
	}
}

// rec records that out was computed from ins (the tensors gradients flow
// to) and params, keeping saved for backward; temp is what backward
// allocates besides gradients. out requires grad if an input does or a
// parameter trains; nothing is kept unless it does and the tape records.
func (t *tape) rec(out *tensor, ins, saved []*tensor, params []*param, temp uint64) {
	for _, in := range ins {
		out.rg = out.rg || (in != nil && in.rg)
	}
	for _, p := range params {
		out.rg = out.rg || (p != nil && p.train)
	}
	if !t.record || !out.rg {
		return
	}
	o := &op{out: out, temp: temp}
	for _, in := range ins {
		if in != nil && in.rg {
			o.ins = append(o.ins, in)
		}
	}
	for _, s := range saved {
		if s != nil {
			s.saves++
			o.saved = append(o.saved, s)
		}
	}
	for _, p := range params {
		if p != nil && p.train {
			o.params = append(o.params, p)
		}
	}
	t.ops = append(t.ops, o)
}

// take returns the operations recorded so far and starts a new list.
func (t *tape) take() []*op {
	ops := t.ops
	t.ops = nil
	return ops
}

// backward runs the backward of ops, last first. An operation whose
// output received no gradient only releases what it kept.
func (t *tape) backward(ops []*op) {
	for i := len(ops) - 1; i >= 0; i-- {
		o := ops[i]
		ops[i] = nil
		if g := o.out.grad; g != nil {
			tmp := t.alloc(o.temp, catActivations)
			for _, in := range o.ins {
				gi := t.alloc(in.n, catActivations)
				if in.grad == nil {
					in.grad = gi
				} else {
					t.release(gi) // accumulated in place
				}
			}
			for _, p := range o.params {
				t.paramGrad(p)
			}
			t.release(tmp)
			t.release(g)
			o.out.grad = nil
		}
		for _, s := range o.saved {
			t.unsave(s)
		}
	}
}

// paramGrad produces one gradient of p: the first is kept as p's
// gradient (autograd steals it), later ones are added in place.
func (t *tape) paramGrad(p *param) {
	g := t.alloc(p.gradN, catGrads)
	if p.grad == nil || !p.grad.live {
		p.grad = g
		return
	}
	t.release(g)
}
