// This file holds the steps: a training step (forward, loss, backward,
// optimizer step, zero_grad), inference (prefill, then decoding one token
// at a time), and the optimizer's state and temporaries.

package estimate

// trainingSteps is how many steps are simulated: the first allocates the
// optimizer state, the second runs with it, as every later step does.
const trainingSteps = 2

// run plays the whole workload into the sink.
func (p *program) run() {
	p.setup()
	p.done(0)
	steps := p.steps
	if steps == 0 {
		steps = trainingSteps
	}
	switch {
	case !p.w.Mode.training():
		if p.m != nil {
			p.infer()
			p.done(1)
		}
	case p.m == nil:
		for i := range steps {
			if p.t.failed {
				break
			}
			p.bareStep(i == 0)
			p.done(i + 1)
		}
	default:
		for i := range steps {
			if p.t.failed {
				break
			}
			p.trainStep(i == 0)
			p.done(i + 1)
		}
		p.dropHeld()
	}
}

// done reports the end of a step to the caller of Drive, which may stop
// the run.
func (p *program) done(step int) {
	if p.after != nil && !p.t.failed {
		if err := p.after(step); err != nil {
			p.stop = err
			p.t.failed = true
		}
	}
}

// newFwd returns the model code's context for a pass.
func (p *program) newFwd(batch, seq, ctx uint64, train bool) *fwd {
	return &fwd{tape: p.t, m: p.m, w: p.w, a: p.w.actBytes(), batch: batch, seq: seq, ctx: ctx, train: train}
}

// begin allocates what a pass needs before the first block: the input
// ids and, for rotary models, cos and sin.
func (p *program) begin(f *fwd) (ids *tensor) {
	ids = f.alloc(mul(f.batch, f.seq, 8), catActivations)
	if p.m.Family == Llama {
		n := mul(f.batch, f.seq, uint64(p.m.HeadWidth()), f.a)
		f.rot = [2]*tensor{f.alloc(n, catActivations), f.alloc(n, catActivations)}
	}
	return ids
}

func (p *program) trainStep(first bool) {
	t, w, m := p.t, p.w, p.m
	t.s.phase("forward")
	t.record = true
	f := p.newFwd(uint64(w.Batch), uint64(w.Seq), uint64(w.Seq), true)
	if first {
		t.alloc(cuBLASWorkspace, catWorkspace)
	}
	ids := p.begin(f)
	last := len(p.units) - 1
	p.gather(p.units[0])
	x := f.embed(p.units[0])
	p.ops[0] = t.take()
	p.ungather(p.units[0])
	caches := make([]layerCache, m.Layers)
	for l := range m.Layers {
		if t.failed {
			return
		}
		var c *layerCache
		if m.ReturnsCache && w.Checkpointing == 0 {
			c = &caches[l]
		}
		x = p.layerForward(f, l, x, c)
	}
	u := p.units[last]
	p.gather(u)
	loss, logits := f.head(u, x, true)
	p.ops[last] = t.take()
	p.ungather(u)
	t.drop(f.rot[0], f.rot[1])
	p.dropHeld() // the previous step's outputs, replaced now
	p.held, p.caches = []*tensor{logits, ids}, caches
	if w.LossOnly {
		p.dropHeld()
	}

	t.s.phase("backward")
	if first {
		t.alloc(cuBLASWorkspace, catWorkspace)
	}
	loss.grad = t.alloc(4, catActivations)
	for i := last; i >= 0 && !t.failed; i-- {
		u := p.units[i]
		p.gather(u)
		if c, ok := p.ckpts[i]; ok {
			p.recompute(f, i, c)
		} else {
			t.backward(p.ops[i])
		}
		p.ops[i] = nil
		p.reduce(u)
		p.ungather(u)
	}
	t.drop(loss)
	t.s.phase("optimizer")
	p.optimizerStep(first)
	if w.Optimizer != NoOptimizer {
		p.zeroGrad()
	}
}

// ckpt is a checkpointed block: its input, kept, and its output, whose
// gradient the recomputed block takes over.
type ckpt struct{ x, y *tensor }

// layerForward runs block l. A checkpointed block runs without recording
// (its activations are freed as in inference) and keeps only its input.
func (p *program) layerForward(f *fwd, l int, x *tensor, c *layerCache) *tensor {
	t := p.t
	u := p.units[l+1]
	p.gather(u)
	defer p.ungather(u)
	if !p.checkpointed(l) {
		y := f.block(u, x, c, false)
		p.ops[l+1] = t.take()
		return y
	}
	x.saves++ // the checkpoint keeps its inputs: the hidden states, and cos and sin
	for _, r := range f.rot {
		if r != nil {
			r.saves++
		}
	}
	t.record = false
	y := f.block(u, x, nil, false)
	t.record = true
	p.ckpts[l+1] = ckpt{x, y}
	return y
}

// recompute runs a checkpointed block's forward again, recording, then
// its backward, handing it the gradient of the original output.
func (p *program) recompute(f *fwd, i int, c ckpt) {
	t := p.t
	delete(p.ckpts, i)
	t.keep(c.x)
	y := f.block(p.units[i], c.x, nil, false)
	ops := t.take()
	y.grad, c.y.grad = c.y.grad, nil
	t.backward(ops)
	t.drop(y)
	t.unsave(c.x)
	for _, r := range f.rot {
		if r != nil {
			t.unsave(r)
		}
	}
}

// bareStep is a training step of a bare parameter count: gradients, the
// optimizer step, zero_grad.
func (p *program) bareStep(first bool) {
	t := p.t
	t.s.phase("backward")
	for _, u := range p.units {
		for _, x := range u.params {
			t.paramGrad(x)
		}
		p.reduce(u)
	}
	t.s.phase("optimizer")
	p.optimizerStep(first)
	if p.w.Optimizer != NoOptimizer {
		p.zeroGrad()
	}
}

// infer runs the prefill of batch × seq tokens, keeping every layer's
// keys and values, then decodes Generate tokens one at a time, each
// growing the cache.
func (p *program) infer() {
	t, w, m := p.t, p.w, p.m
	t.record = false
	t.s.phase("prefill")
	t.alloc(cuBLASWorkspace, catWorkspace)
	b, s := uint64(w.Batch), uint64(w.Seq)
	p.caches = make([]layerCache, m.Layers)
	steps := decodeSteps(w.Generate)
	for i := -1; i < len(steps) && !t.failed; i++ {
		g := 0 // the prefill
		if i >= 0 {
			g = steps[i]
		}
		f := p.newFwd(b, s, s, false)
		if g > 0 {
			if i == 0 {
				t.s.phase("decode")
			}
			f = p.newFwd(b, 1, s+uint64(g), false)
		}
		ids := p.begin(f)
		u := p.units[0]
		p.gather(u)
		x := f.embed(u)
		p.ungather(u)
		for l := range m.Layers {
			if t.failed {
				break
			}
			var c *layerCache
			if m.Family != BERT {
				c = &p.caches[l]
			}
			u := p.units[l+1]
			p.gather(u)
			x = f.block(u, x, c, g > 0)
			p.ungather(u)
		}
		u = p.units[len(p.units)-1]
		p.gather(u)
		_, logits := f.head(u, x, false)
		p.ungather(u)
		t.drop(f.rot[0], f.rot[1], ids)
		t.drop(p.held...)
		p.held = []*tensor{logits}
		if g > 0 { // generate's next-token scores in fp32, and the token
			scores := t.alloc(mul(b, uint64(m.Vocab), 4), catActivations)
			t.drop(scores)
		}
	}
	p.dropHeld()
}

// decodeExact is how many decode steps are simulated one token at a
// time at the start and at the end of a long generation; in between, at
// most decodeExact steps are simulated, evenly spaced, each growing the
// key/value cache by the tokens of the steps it stands for (the cache is
// torch.cat's new tensor of the context so far, whatever the step before
// held). A step's tensors grow with the context, so the counted peak is
// the last step's, which is simulated exactly with the step before it;
// the simulated allocator sees fewer, larger growths of the cache in
// between. A generation of G tokens costs about min(G, 3 x decodeExact)
// steps instead of G (100,000 tokens took 46 s).
var decodeExact = 512

// decodeSteps returns the decode steps to simulate, in increasing order,
// for a generation of n tokens: step g decodes token g with a context of
// the prompt and g tokens.
func decodeSteps(n int) []int {
	out := make([]int, 0, min(n, 3*decodeExact))
	if n <= 3*decodeExact {
		for g := 1; g <= n; g++ {
			out = append(out, g)
		}
		return out
	}
	for g := 1; g <= decodeExact; g++ {
		out = append(out, g)
	}
	first, last := decodeExact, n-decodeExact+1 // exact from last on
	for k := 1; k < decodeExact; k++ {
		out = append(out, first+(last-first)*k/decodeExact)
	}
	for g := last; g <= n; g++ {
		out = append(out, g)
	}
	return out
}

// stateBytes is the optimizer state of one parameter.
func (p *program) stateBytes(x *param) uint64 {
	_, _, _, sb := p.w.trainBytes()
	e := x.elems()
	switch p.w.Optimizer {
	case AdamW, Adam:
		return mul(e, 2*sb)
	case Momentum:
		return mul(e, sb)
	case Adam8bit: // bitsandbytes: 8-bit states with an fp32 absmax per 256, for tensors of 4096 or more
		if e >= 4096 {
			return mul(2, add(e, mul(ceilDiv(e, 256), 4)))
		}
		return mul(e, 8)
	case Adafactor: // factored second moment of a matrix: a row and a column vector
		if x.rows > 1 {
			return mul(add(x.rows, x.cols), sb)
		}
		return mul(e, sb)
	}
	return 0
}

// stepTemps returns the temporaries the step allocates for one parameter
// (or flat shard) of n state-sized bytes, and whether they live for the
// whole step (a foreach list) or only for that parameter's update.
func (p *program) stepTemps(n uint64) (temps []uint64, wholeStep bool) {
	w := p.w
	switch w.Optimizer {
	case AdamW, Adam:
		switch w.OptimizerImpl {
		case Foreach:
			return []uint64{n}, true
		case Foreach113:
			return []uint64{n, n}, true
		case SingleTensor:
			return []uint64{n, n}, false
		}
	case Adafactor:
		return []uint64{n, n}, false
	}
	return nil, false
}

// optimizerStep runs the step on the GPU (unless the optimizer is
// offloaded): the state on the first step, then the temporaries.
func (p *program) optimizerStep(first bool) {
	t, w := p.t, p.w
	if w.Optimizer == NoOptimizer || w.Offload.optimizer() {
		return
	}
	_, _, _, sb := w.trainBytes()
	type group struct {
		u            *unit
		params       []*param
		state, elems uint64
	}
	var groups []group
	for _, u := range p.units {
		g := group{u: u}
		for _, x := range u.params {
			if x.train {
				g.params = append(g.params, x)
				g.state = add(g.state, p.stateBytes(x))
				g.elems = add(g.elems, x.elems())
			}
		}
		if len(g.params) > 0 {
			groups = append(groups, g)
		}
	}
	if first { // the state, created lazily for every parameter before the update
		for _, g := range groups {
			if w.Shard.states() {
				g.u.states = append(g.u.states, t.alloc(ceilDiv(g.state, p.gpus), catOptimizer))
				continue
			}
			for _, x := range g.params {
				g.u.states = append(g.u.states, t.alloc(p.stateBytes(x), catOptimizer))
			}
		}
	}
	var whole []*tensor
	for _, g := range groups {
		if w.Shard.states() {
			p.temps(ceilDiv(mul(g.elems, sb), p.gpus), &whole)
			continue
		}
		for _, x := range g.params {
			p.temps(mul(x.elems(), sb), &whole)
		}
	}
	for _, x := range whole {
		t.release(x)
	}
}

// temps allocates one parameter's step temporaries: kept in whole when
// they are a foreach list, freed at once otherwise.
func (p *program) temps(n uint64, whole *[]*tensor) {
	ts, keep := p.stepTemps(n)
	var now []*tensor
	for _, m := range ts {
		x := p.t.alloc(m, catTemporary)
		if keep {
			*whole = append(*whole, x)
		} else {
			now = append(now, x)
		}
	}
	for _, x := range now {
		p.t.release(x)
	}
}
