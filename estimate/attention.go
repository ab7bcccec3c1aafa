// This file holds attention, eager and fused, as Hugging Face's
// eager_attention_forward and sdpa_attention_forward compute it.

package estimate

// qkv describes attention's inputs: the tensors holding the queries, keys
// and values (one tensor for GPT-2's fused projection) and whether each is
// a strided view that must be copied before the product. Keys and values
// read from a decoding cache are contiguous.
type qkv struct {
	q, k, v             *tensor
	copyQ, copyK, copyV bool
}

// attention returns the context (tokens × heads·head width) of q, k, v.
func (f *fwd) attention(in qkv) *tensor {
	m := f.m
	b, s, ctx := f.batch, f.seq, f.ctx
	h, kvh, d := uint64(m.Heads), uint64(m.kvHeads()), uint64(m.HeadWidth())
	qBytes := mul(b, s, h, d, f.a)
	kvBytes := mul(b, ctx, kvh, d, f.a)
	// repeat_kv expands grouped keys and values to every head (a copy),
	// then anything still strided is made contiguous.
	prep := func(x *tensor, copyIt bool, n uint64, isKV bool) *tensor {
		if kvh < h && isKV {
			return f.ew(mul(b, ctx, h, d, f.a), []*tensor{x})
		}
		if copyIt {
			return f.ew(n, []*tensor{x})
		}
		return f.keep(x)
	}
	q := prep(in.q, in.copyQ, qBytes, false)
	k := prep(in.k, in.copyK, kvBytes, true)
	v := prep(in.v, in.copyV, kvBytes, true)
	if f.w.Attention == Flash {
		out := f.act(mul(b, s), mul(h, d))
		lse := f.alloc(mul(b, h, ceilDiv(s, 32), 32, 4), catActivations)
		temp := mul(b, h, s, 4) // backward's delta
		if f.a < 4 {
			temp = add(temp, mul(b, s, h, d, 4)) // fp32 accumulator of dq
		}
		f.rec(out, []*tensor{q, k, v}, []*tensor{q, k, v, out, lse}, nil, temp)
		f.drop(q, k, v, lse)
		return out // already laid out as tokens × heads·width
	}
	scoreElems := mul(b, h, s, ctx)
	scores := f.ew(mul(scoreElems, f.a), []*tensor{q, k}, q, k)
	f.drop(q, k)
	scaled := f.ew(scores.n, []*tensor{scores}) // / √d (or · scaling)
	f.drop(scores)
	maskedN := scores.n
	if m.Family == BERT && f.w.Precision.amp() {
		// BERT's additive mask has the parameters' type, fp32 under
		// AMP: the sum is promoted to fp32.
		maskedN = mul(scoreElems, 4)
	}
	masked := f.ew(maskedN, []*tensor{scaled}) // causal where / additive mask
	f.drop(scaled)
	p := f.softmax(masked, scoreElems)
	f.drop(masked)
	pd := f.dropout(p, scoreElems)
	f.drop(p)
	if half := mul(scoreElems, f.a); pd.n != half {
		// Autocast ran the softmax in fp32 and the dropout after it; the
		// product casts its input to the compute type, and keeps that.
		c := f.ew(half, []*tensor{pd})
		f.drop(pd)
		pd = c
	}
	out := f.ew(mul(b, s, h, d, f.a), []*tensor{pd, v}, pd, v)
	f.drop(pd, v)
	ctxOut := f.ew(out.n, []*tensor{out}) // transpose(1, 2).contiguous()
	f.drop(out)
	return ctxOut
}

// softmax of the attention scores, in the model's way. Llama computes it
// in fp32 and casts back; so does GPT-2 under AMP (autocast runs softmax
// in fp32). BERT under AMP returns the fp32 probabilities, which the
// caller casts back after the dropout.
func (f *fwd) softmax(x *tensor, elems uint64) *tensor {
	m := f.m
	if m.Softmax == SoftmaxExplicit { // exp(x − max) / sum
		rows := mul(f.batch, uint64(m.Heads), f.seq)
		mx := f.ew(mul(rows, f.a), []*tensor{x})
		idx := f.alloc(mul(rows, 8), catActivations) // max's indices, kept
		f.rec(mx, []*tensor{x}, []*tensor{idx}, nil, 0)
		f.drop(idx)
		sub := f.ew(x.n, []*tensor{x, mx})
		f.drop(mx)
		e := f.ew(x.n, []*tensor{sub})
		f.saveOut(e)
		f.drop(sub)
		sum := f.ew(mul(rows, f.a), []*tensor{e})
		y := f.ew(x.n, []*tensor{e, sum}, e, sum)
		f.drop(e, sum)
		return y
	}
	amp := f.w.Precision.amp() && f.a < 4
	if f.a < 4 && (m.Family == Llama || m.Family == GPT2 && amp) {
		// Llama asks for an fp32 softmax and casts it to the query's
		// type; GPT-2's softmax is fp32 under autocast, and GPT-2 casts
		// it to the value's type. Either way before the dropout.
		p32 := f.ew(mul(elems, 4), []*tensor{x})
		f.saveOut(p32)
		p := f.ew(x.n, []*tensor{p32})
		f.drop(p32)
		return p
	}
	if amp {
		// BERT: softmax is on autocast's fp32 list, so its output is
		// fp32, kept for backward; the dropout works on it, and the
		// product with the values casts the result (attention).
		p32 := f.ew(mul(elems, 4), []*tensor{x})
		f.saveOut(p32)
		return p32
	}
	p := f.ew(x.n, []*tensor{x})
	f.saveOut(p)
	return p
}
