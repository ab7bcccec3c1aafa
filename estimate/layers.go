// This file holds the model code: the blocks, embeddings and heads of each
// family, written as Hugging Face transformers writes them, with a drop
// wherever a Python variable goes out of scope.

package estimate

// unit is one group of parameters used together: the embeddings, one
// block, or the head (an FSDP unit).
type unit struct {
	params   []*param // every parameter, LoRA adapters last
	lins     []*lin   // linear layers in use order
	norms    []*param // norm weights and biases in use order
	embs     []*param // embedding tables in use order
	tied     *param   // the LM head's weight when tied to the embedding
	store    []*tensor
	gathered *tensor // the whole unit's weights while a sharded or offloaded unit is in use
	shard    *tensor // sharded gradient
	bucket   *tensor // DDP gradient bucket
	states   []*tensor
}

// layerCache is one layer's keys and values held by the returned cache.
type layerCache struct{ k, v *tensor }

// cacheKV hands k and v to the layer's cache and returns what attention
// reads: the fresh keys and values (fresh true), or, when decoding, the
// cache grown by this step's (torch.cat: a new tensor, the old freed).
func (f *fwd) cacheKV(c *layerCache, k, v *tensor, decode bool) (ka, va *tensor, fresh bool) {
	if c == nil {
		return k, v, true
	}
	if !decode {
		c.k, c.v = f.keep(k), f.keep(v)
		f.moveTo(k, catKVCache)
		f.moveTo(v, catKVCache)
		return k, v, true
	}
	n := mul(f.batch, f.ctx, uint64(f.m.kvHeads()), uint64(f.m.HeadWidth()), f.a)
	nk, nv := f.alloc(n, catKVCache), f.alloc(n, catKVCache)
	f.drop(c.k, c.v)
	c.k, c.v = nk, nv
	return nk, nv, false
}

// block runs one transformer block on x (which it consumes).
func (f *fwd) block(u *unit, x *tensor, c *layerCache, decode bool) *tensor {
	switch f.m.Family {
	case GPT2:
		return f.gpt2Block(u, x, c, decode)
	case BERT:
		return f.bertBlock(u, x)
	}
	return f.llamaBlock(u, x, c, decode)
}

func (f *fwd) gpt2Block(u *unit, x *tensor, c *layerCache, decode bool) *tensor {
	t, h := f.tokens(), uint64(f.m.Hidden)
	h1 := f.layerNorm(x, u.norms[0], u.norms[1], t)
	qkvOut := f.linear(h1, u.lins[0], t)
	f.drop(h1)
	k, v, fresh := f.cacheKV(c, qkvOut, qkvOut, decode)
	ctx := f.attention(qkv{q: qkvOut, k: k, v: v, copyQ: true, copyK: fresh, copyV: fresh})
	f.drop(qkvOut)
	o := f.linear(ctx, u.lins[1], t)
	f.drop(ctx)
	od := f.dropout(o, mul(t, h))
	f.drop(o)
	x2 := f.ew(x.n, []*tensor{x, od})
	f.drop(od, x)
	h2 := f.layerNorm(x2, u.norms[2], u.norms[3], t)
	y := f.mlp(u, h2, x2, 2)
	return y
}

// mlp runs the two-matrix MLP from lins[i] on h (consumed) and adds the
// residual r (consumed).
func (f *fwd) mlp(u *unit, hIn, r *tensor, i int) *tensor {
	t := f.tokens()
	fc := f.linear(hIn, u.lins[i], t)
	f.drop(hIn)
	g := f.mlpAct(fc)
	f.drop(fc)
	mo := f.linear(g, u.lins[i+1], t)
	f.drop(g)
	md := f.dropout(mo, mul(t, uint64(f.m.Hidden)))
	f.drop(mo)
	y := f.ew(r.n, []*tensor{r, md})
	f.drop(r, md)
	return y
}

func (f *fwd) bertBlock(u *unit, x *tensor) *tensor {
	t, h := f.tokens(), uint64(f.m.Hidden)
	q := f.linear(x, u.lins[0], t)
	k := f.linear(x, u.lins[1], t)
	v := f.linear(x, u.lins[2], t)
	ctx := f.attention(qkv{q: q, k: k, v: v, copyQ: true, copyK: true, copyV: true})
	f.drop(q, k, v)
	o := f.linear(ctx, u.lins[3], t)
	f.drop(ctx)
	od := f.dropout(o, mul(t, h))
	f.drop(o)
	a1 := f.ew(x.n, []*tensor{od, x})
	f.drop(od, x)
	x1 := f.layerNorm(a1, u.norms[0], u.norms[1], t)
	f.drop(a1)
	a2 := f.mlp(u, f.keep(x1), x1, 4)
	y := f.layerNorm(a2, u.norms[2], u.norms[3], t)
	f.drop(a2)
	return y
}

func (f *fwd) llamaBlock(u *unit, x *tensor, c *layerCache, decode bool) *tensor {
	t := f.tokens()
	h1 := f.rmsNorm(x, u.norms[0], t)
	q := f.linear(h1, u.lins[0], t)
	k := f.linear(h1, u.lins[1], t)
	v := f.linear(h1, u.lins[2], t)
	f.drop(h1)
	qe := f.rope(q)
	f.drop(q)
	ke := f.rope(k)
	f.drop(k)
	ka, va, fresh := f.cacheKV(c, ke, v, decode)
	ctx := f.attention(qkv{q: qe, k: ka, v: va, copyQ: true, copyK: fresh, copyV: fresh})
	f.drop(qe, ke, v)
	o := f.linear(ctx, u.lins[3], t)
	f.drop(ctx)
	x2 := f.ew(x.n, []*tensor{x, o})
	f.drop(o, x)
	h2 := f.rmsNorm(x2, u.norms[1], t)
	g := f.linear(h2, u.lins[4], t)
	up := f.linear(h2, u.lins[5], t)
	f.drop(h2)
	a := f.mlpAct(g)
	f.drop(g)
	p := f.ew(up.n, []*tensor{a, up}, a, up)
	f.drop(a, up)
	dn := f.linear(p, u.lins[6], t)
	f.drop(p)
	y := f.ew(x2.n, []*tensor{x2, dn})
	f.drop(x2, dn)
	return y
}

// rope applies rotary embeddings (x·cos + rotate_half(x)·sin), keeping
// cos and sin; only the result outlives it.
func (f *fwd) rope(x *tensor) *tensor {
	n := x.n
	c1 := f.ew(n, []*tensor{x}, f.rot[0])
	neg := f.ew(n/2, []*tensor{x})
	rh := f.ew(n, []*tensor{neg, x})
	f.drop(neg)
	s1 := f.ew(n, []*tensor{rh}, f.rot[1])
	f.drop(rh)
	y := f.ew(n, []*tensor{c1, s1})
	f.drop(c1, s1)
	return y
}

// embedding looks rows up in table p: the output, keeping only the
// indices (the caller's input ids).
func (f *fwd) embedding(p *param, rows uint64) *tensor {
	y := f.act(rows, uint64(f.m.Hidden))
	f.rec(y, nil, nil, []*param{p}, 0)
	return y
}

// embed runs the embeddings of the pass's tokens.
func (f *fwd) embed(u *unit) *tensor {
	t, h := f.tokens(), uint64(f.m.Hidden)
	e := f.embedding(u.embs[0], t)
	switch f.m.Family {
	case GPT2:
		pos := f.embedding(u.embs[1], f.seq)
		x := f.ew(e.n, []*tensor{e, pos})
		f.drop(e, pos)
		xd := f.dropout(x, mul(t, h))
		f.drop(x)
		return xd
	case BERT:
		tt := f.embedding(u.embs[2], t)
		x1 := f.ew(e.n, []*tensor{e, tt})
		f.drop(e, tt)
		pos := f.embedding(u.embs[1], f.seq)
		x2 := f.ew(e.n, []*tensor{x1, pos})
		f.drop(x1, pos)
		x3 := f.layerNorm(x2, u.norms[0], u.norms[1], t)
		f.drop(x2)
		xd := f.dropout(x3, mul(t, h))
		f.drop(x3)
		return xd
	}
	return e
}

// head runs the final norm and the head on x (consumed). In training it
// returns the loss; it always returns the logits, which the caller holds.
func (f *fwd) head(u *unit, x *tensor, loss bool) (l, logits *tensor) {
	m := f.m
	t, h := f.tokens(), uint64(m.Hidden)
	switch m.Family {
	case GPT2:
		y := f.layerNorm(x, u.norms[0], u.norms[1], t)
		f.drop(x)
		x = y
	case Llama:
		y := f.rmsNorm(x, u.norms[0], t)
		f.drop(x)
		x = y
	}
	if m.Head == ClassifierHead {
		return f.classify(u, x, loss)
	}
	i := 0
	if m.Family == BERT { // MLM transform: dense, activation, norm
		d := f.linear(x, u.lins[0], t)
		f.drop(x)
		g := f.mlpAct(d)
		f.drop(d)
		x = f.layerNorm(g, u.norms[0], u.norms[1], t)
		f.drop(g)
		i = 1
	}
	out := &lin{out: uint64(m.Vocab), in: h}
	if u.tied != nil {
		out.w = u.tied
	} else {
		out.w = u.lins[i].w
	}
	if m.Family == BERT {
		out.b = u.norms[2]
	}
	logits = f.linear(x, out, t)
	f.drop(x)
	if !loss {
		return nil, logits
	}
	return f.crossEntropy(logits, t, uint64(m.Vocab)), logits
}

// classify pools the first token (BERT: dense and tanh) and classifies.
func (f *fwd) classify(u *unit, x *tensor, loss bool) (l, logits *tensor) {
	b := f.batch
	in := x
	if f.m.Family == BERT {
		p := f.linear(x, u.lins[0], b)
		th := f.ew(p.n, []*tensor{p})
		f.saveOut(th)
		f.drop(p)
		in = f.dropout(th, mul(b, uint64(f.m.Hidden)))
		f.drop(th)
		f.drop(x)
		logits = f.linear(in, u.lins[1], b)
	} else {
		logits = f.linear(in, u.lins[0], f.tokens())
	}
	f.drop(in)
	if !loss {
		return nil, logits
	}
	return f.crossEntropy(logits, b, uint64(f.m.Labels)), logits
}

// crossEntropy is Hugging Face's loss: logits upcast to fp32, shifted
// labels, log_softmax (kept) and nll_loss.
func (f *fwd) crossEntropy(logits *tensor, rows, classes uint64) *tensor {
	l32 := logits
	if f.a < 4 {
		l32 = f.ew(mul(rows, classes, 4), []*tensor{logits})
	} else {
		f.keep(logits)
	}
	labels := f.alloc(mul(rows, 8), catActivations) // padded, shifted labels
	lsm := f.ew(l32.n, []*tensor{l32})
	f.saveOut(lsm)
	f.drop(l32)
	loss := f.ew(4, []*tensor{lsm}, lsm, labels)
	f.drop(lsm, labels)
	return loss
}
