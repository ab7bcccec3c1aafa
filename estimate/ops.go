// This file holds the operations the model code is written with: each
// allocates what the PyTorch operation allocates and records what its
// autograd formula keeps (derivatives.yaml): a linear layer keeps its
// input when its weight trains, a norm its input and statistics, softmax
// its output, dropout its mask, and so on.

package estimate

// fwd runs model code over one pass of batch × seq tokens.
type fwd struct {
	*tape
	m *Model
	w *Workload
	a uint64 // activation element size

	batch, seq uint64 // sequences, and tokens of each in this pass
	ctx        uint64 // keys each query attends to (the cache length when decoding)
	train      bool   // dropout is active

	rot [2]*tensor // rotary cos and sin of the pass (Llama)
}

func (f *fwd) tokens() uint64 { return mul(f.batch, f.seq) }

// act allocates an activation of rows × cols elements of the activation
// type.
func (f *fwd) act(rows, cols uint64) *tensor {
	return f.alloc(mul(rows, cols, f.a), catActivations)
}

// ew is an elementwise operation (or any operation without parameters)
// with an output of n bytes.
func (f *fwd) ew(n uint64, ins []*tensor, saved ...*tensor) *tensor {
	y := f.alloc(n, catActivations)
	f.rec(y, ins, saved, nil, 0)
	return y
}

// lin is a linear layer: its weight, optional bias, LoRA adapter and how
// its weight is stored.
type lin struct {
	w, b    *param
	out, in uint64
	quant   Precision // Int8 or Int4 for a quantized weight, else 0
	lora    *adapter
}

// adapter is a LoRA pair: A (rank × in) and B (out × rank).
type adapter struct {
	a, b *param
	rank uint64
}

// linear applies l to x (rows tokens). A quantized weight is dequantized
// into a temporary for the product (bitsandbytes 4-bit), or the input is
// quantized to int8 with an int32 product (LLM.int8); a LoRA adapter adds
// B(A(x)) scaled.
func (f *fwd) linear(x *tensor, l *lin, rows uint64) *tensor {
	var tmp *tensor
	var bwdTemp uint64
	switch l.quant {
	case Int4:
		deq := mul(l.out, l.in, f.a)
		tmp, bwdTemp = f.alloc(deq, catTemporary), deq
	case Int8:
		tmp = f.alloc(add(mul(rows, l.in), mul(rows, l.out, 4)), catTemporary)
	}
	y := f.act(rows, l.out)
	var saved []*tensor
	if l.w.train {
		saved = append(saved, x) // for the weight's gradient
	}
	f.rec(y, []*tensor{x}, saved, []*param{l.w, l.b}, bwdTemp)
	f.release(tmp)
	if l.lora == nil {
		return y
	}
	ax := f.act(rows, l.lora.rank)
	f.rec(ax, []*tensor{x}, []*tensor{x}, []*param{l.lora.a}, 0)
	bx := f.act(rows, l.out)
	f.rec(bx, []*tensor{ax}, []*tensor{ax}, []*param{l.lora.b}, 0)
	f.drop(ax)
	scaled := f.ew(bx.n, []*tensor{bx})
	f.drop(bx)
	sum := f.ew(y.n, []*tensor{y, scaled})
	f.drop(y, scaled)
	return sum
}

// layerNorm is torch's fused layer norm: it keeps its input and the
// per-row mean and reciprocal deviation (fp32).
func (f *fwd) layerNorm(x *tensor, w, b *param, rows uint64) *tensor {
	y := f.act(rows, uint64(f.m.Hidden))
	mean, rstd := f.alloc(mul(rows, 4), catActivations), f.alloc(mul(rows, 4), catActivations)
	f.rec(y, []*tensor{x}, []*tensor{x, mean, rstd}, []*param{w, b}, 0)
	f.drop(mean, rstd)
	return y
}

// rmsNorm is Hugging Face's LlamaRMSNorm, written in Python: x in fp32,
// x·rsqrt(mean(x²) + ε), cast back, times the weight.
func (f *fwd) rmsNorm(x *tensor, w *param, rows uint64) *tensor {
	h := uint64(f.m.Hidden)
	x32 := x
	if f.a < 4 {
		x32 = f.ew(mul(rows, h, 4), []*tensor{x})
	} else {
		f.keep(x)
	}
	sq := f.ew(mul(rows, h, 4), []*tensor{x32}, x32)
	v := f.ew(mul(rows, 4), []*tensor{sq})
	f.drop(sq)
	r := f.ew(mul(rows, 4), []*tensor{v})
	f.drop(v)
	f.saveOut(r)
	n := f.ew(mul(rows, h, 4), []*tensor{x32, r}, x32, r)
	f.drop(r, x32)
	nh := n
	if f.a < 4 {
		nh = f.ew(mul(rows, h, f.a), []*tensor{n})
		f.drop(n)
	}
	var saved []*tensor
	if w.train {
		saved = append(saved, nh)
	}
	y := f.act(rows, h)
	f.rec(y, []*tensor{nh}, saved, []*param{w}, 0)
	f.drop(nh)
	return y
}

// saveOut makes the last recorded operation keep its own output, for
// operations whose backward needs their result (rsqrt, tanh, softmax).
func (f *fwd) saveOut(y *tensor) {
	if n := len(f.ops); n > 0 && f.ops[n-1].out == y {
		f.ops[n-1].saved = append(f.ops[n-1].saved, y)
		y.saves++
	}
}

// dropout applies dropout in training: a one-byte mask kept for backward
// and a new output. Without dropout it returns x itself (referenced once
// more).
func (f *fwd) dropout(x *tensor, elems uint64) *tensor {
	if !f.train || f.m.Dropout == 0 {
		return f.keep(x)
	}
	mask := f.alloc(elems, catActivations)
	y := f.ew(x.n, []*tensor{x}, mask)
	f.drop(mask)
	return y
}

// mlpAct applies the MLP's nonlinearity to x (rows × intermediate).
func (f *fwd) mlpAct(x *tensor) *tensor {
	n := x.n
	switch f.m.Activation {
	case GELUTanhExplicit: // 0.5·x · (1 + tanh(c·(x + 0.044715·x³)))
		half := f.ew(n, []*tensor{x})
		t := f.ew(n, []*tensor{x}, x) // pow(x, 3) keeps x
		for range 3 {                 // ·0.044715, x + ·, ·c
			u := f.ew(n, []*tensor{t, x})
			f.drop(t)
			t = u
		}
		th := f.ew(n, []*tensor{t})
		f.saveOut(th)
		f.drop(t)
		one := f.ew(n, []*tensor{th})
		f.drop(th)
		y := f.ew(n, []*tensor{half, one}, half, one)
		f.drop(half, one)
		return y
	case SiLUExplicit: // x · sigmoid(x)
		s := f.ew(n, []*tensor{x})
		f.saveOut(s)
		y := f.ew(n, []*tensor{x, s}, x, s)
		f.drop(s)
		return y
	case ReLU:
		y := f.ew(n, []*tensor{x})
		f.saveOut(y)
		return y
	}
	return f.ew(n, []*tensor{x}, x) // gelu, silu: keep the input
}
