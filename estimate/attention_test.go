package estimate

import "testing"

// What eager attention keeps per layer for backward with dropout, as
// PyTorch's autograd keeps it: softmax its output, native_dropout its
// bool mask (one byte per probability), the product with the values its
// input, the dropped probabilities; the residual dropouts a mask each.
// Under AMP softmax runs in fp32 (autocast's fp32 list): BERT keeps the
// fp32 probabilities, drops out in fp32, and the product keeps its cast
// to the compute type. The differences below are exact: one layer's
// kept bytes times the layers.
func TestEagerAttentionKeeps(t *testing.T) {
	bert, _ := Preset("bert-base")
	const b, s = 32, 128
	L := int64(bert.Layers)
	S := int64(b * bert.Heads * s * s) // probabilities per layer
	TH := int64(b * s * bert.Hidden)   // hidden states per layer
	acts := func(p Precision, dropout float64) int64 {
		m := bert
		m.Dropout = dropout
		r := estimateOf(t, Plan{Model: &m, Workload: Workload{Precision: p, Batch: b, Seq: s, Attention: Eager}})
		return r.Breakdown.Activations
	}
	for _, c := range []struct {
		p    Precision
		want int64 // dropout 0.1 less dropout 0
	}{
		{FP32, L * (S*(1+4) + 2*TH)}, // mask and dropped fp32 probabilities; two residual masks
		{BF16, L * (S*(1+2) + 2*TH)}, // the same in bf16
		{AMPBF16, L * (S*1 + 2*TH)},  // the cast for the product is kept either way
	} {
		if d := acts(c.p, 0.1) - acts(c.p, 0); d != c.want {
			t.Errorf("%s: dropout keeps %d bytes, want %d", c.p, d, c.want)
		}
	}
	// AMP keeps the fp32 softmax output where pure bf16 keeps a bf16 one.
	if d, want := acts(AMPBF16, 0.1)-acts(BF16, 0.1), L*2*S; d != want {
		t.Errorf("AMP keeps %d bytes more than bf16, want %d (fp32 probabilities)", d, want)
	}
}
