package estimate

import (
	"testing"
)

// The PyTorch memory guide's figures.

// Mixed-precision Adam needs 16 bytes per parameter before activations: a
// 7B model needs 112 GB. fp32 Adam needs the same 16; pure bf16 Adam 8.
func TestGuideSixteenBytesPerParameter(t *testing.T) {
	for _, c := range []struct {
		p                   Precision
		weights, grads, opt int64
	}{
		{AMPBF16, 6, 2, 8}, // fp32 master + bf16 copy; bf16 gradients; two fp32 moments
		{AMPFP16, 6, 2, 8},
		{FP32, 4, 4, 8},
		{BF16, 2, 2, 4},
	} {
		r := estimateOf(t, Plan{Params: 7e9, Workload: Workload{Mode: Full, Precision: c.p, Optimizer: AdamW}, Capacity: MaxDevice})
		b := r.Breakdown
		if b.Weights != c.weights*7e9 || b.Gradients != c.grads*7e9 || b.Optimizer != c.opt*7e9 {
			t.Errorf("%s: weights %d, gradients %d, optimizer %d; want %d, %d, %d bytes per parameter",
				c.p, b.Weights, b.Gradients, b.Optimizer, c.weights, c.grads, c.opt)
		}
		if c.p == AMPBF16 && b.Weights+b.Gradients+b.Optimizer != 112e9 {
			t.Errorf("7B mixed-precision AdamW: %d bytes of parameter state, want 112 GB", b.Weights+b.Gradients+b.Optimizer)
		}
		// The foreach step adds one state-sized list; the peak is the step.
		state := int64(4)
		if c.p == BF16 {
			state = 2
		}
		if b.Temporaries != state*7e9 || b.PeakPhase != "optimizer" {
			t.Errorf("%s: temporaries %d in %s, want %d in the optimizer step", c.p, b.Temporaries, b.PeakPhase, state*7e9)
		}
	}
}

// Inference: 14 GB of fp16 weights for 7B, about 7 GB at int8 and 3.5 GB
// at int4 plus the scales.
func TestGuideInferenceWeights(t *testing.T) {
	for _, c := range []struct {
		p      Precision
		lo, hi int64
	}{
		{FP16, 14e9, 14e9},
		{BF16, 14e9, 14e9},
		{Int8, 7e9, 7.01e9},    // + an fp32 scale per row of 4096
		{Int4, 3.55e9, 3.65e9}, // 0.5 + 1/64 + 4/16384 bytes per parameter
	} {
		r := estimateOf(t, Plan{Params: 7e9, Workload: Workload{Mode: Infer, Precision: c.p}})
		if w := r.Breakdown.Weights; w < c.lo || w > c.hi {
			t.Errorf("7B %s: weights %d bytes, want %d..%d", c.p, w, c.lo, c.hi)
		}
		if r.Breakdown.Gradients+r.Breakdown.Optimizer != 0 {
			t.Errorf("7B %s inference counts gradients or optimizer state", c.p)
		}
	}
	r := estimateOf(t, Plan{Params: 7e9, Workload: Workload{Mode: Infer}})
	if r.Plan.Workload.Precision != FP16 {
		t.Errorf("inference defaults to %s, want fp16", r.Plan.Workload.Precision)
	}
}

// A 1.3B model (24 layers, hidden 2048) with LoRA r=8 at batch 4 × 512 in
// fp16 mixed precision needs about 6 to 9 GB and fits a 12 GB RTX 3060.
func TestGuideLoRAOnRTX3060(t *testing.T) {
	card, err := LookupCard("rtx3060-12g")
	if err != nil {
		t.Fatal(err)
	}
	m := Generic(GPT2) // what --layers 24 --hidden 2048 gives
	m.Layers, m.Hidden, m.Heads = 24, 2048, 32
	r := estimateOf(t, Plan{Model: &m, Capacity: card.Memory,
		Workload: Workload{Mode: LoRA, LoRARank: 8, Precision: AMPFP16, Batch: 4, Seq: 512}})
	if p := r.Parameters; p < 1.3e9 || p > 1.45e9 {
		t.Errorf("%d parameters, want about 1.3B", p)
	}
	if tot := r.Breakdown.Total; tot < 6e9 || tot > 9e9 {
		t.Errorf("needs %d bytes, want 6 to 9 GB", tot)
	}
	if !r.Fits {
		t.Error("does not fit an RTX 3060 12 GB")
	}
	if r.Trainable > r.Parameters/100 || r.Breakdown.Optimizer > 100e6 {
		t.Errorf("LoRA trains %d parameters with %d bytes of optimizer state: adapters only expected", r.Trainable, r.Breakdown.Optimizer)
	}
}
