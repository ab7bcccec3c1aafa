package estimate

import (
	"fmt"
	"math"
	"runtime"
	"testing"
)

// plans returns a grid of small plans over every family, mode and option.
func plans() []Plan {
	var out []Plan
	for _, name := range []string{"gpt2", "bert-base", "tinyllama-1.1b"} {
		m, _ := Preset(name)
		m.Layers = 3
		for _, w := range []Workload{
			{},
			{Precision: AMPBF16, Attention: Eager, Checkpointing: 1},
			{Precision: BF16, Checkpointing: 2, Optimizer: Momentum},
			{Mode: LoRA, Precision: AMPFP16, LoRATargets: []string{"all"}},
			{Mode: QLoRA, Optimizer: Adam8bit},
			{Mode: Infer, Generate: 3},
			{Mode: Infer, Precision: Int8, Attention: Eager, Generate: 2},
			{Mode: Infer, Precision: Int4, Offload: OffloadParams},
			{Precision: AMPBF16, GPUs: 4, Shard: ZeRO1},
			{Precision: AMPBF16, GPUs: 4, Shard: ZeRO2, OptimizerImpl: SingleTensor},
			{Precision: AMPBF16, GPUs: 4, Shard: ZeRO3, Optimizer: Adafactor},
			{GPUs: 4, Shard: FSDP, Checkpointing: 1, Offload: OffloadOptimizer},
			{GPUs: 2, Offload: OffloadAll, OptimizerImpl: Foreach113},
			{GPUs: 8, Precision: AMPFP16, Offload: OffloadParams},
			{GPUs: 2, Attention: Eager, Optimizer: Adam},
			{Optimizer: NoOptimizer, LossOnly: true},
			{Optimizer: SGD, OptimizerImpl: Fused, Batch: 2, Seq: 64},
		} {
			if m.Family == BERT && w.Generate > 0 {
				w.Generate = 0
			}
			mm := m
			out = append(out, Plan{Model: &mm, Workload: w, Capacity: 80 << 30})
		}
	}
	out = append(out, Plan{Params: 3e8, Capacity: 80 << 30},
		Plan{Params: 3e8, Workload: Workload{Mode: Infer, Precision: Int4}, Capacity: 80 << 30},
		Plan{Params: 3e8, Workload: Workload{Precision: AMPBF16, GPUs: 8, Shard: ZeRO3}, Capacity: 80 << 30},
		Plan{Params: 3e8, Workload: Workload{Optimizer: NoOptimizer, Offload: OffloadAll}, Capacity: 80 << 30})
	return out
}

func (pl Plan) label() string {
	name := fmt.Sprintf("%d params", pl.Params)
	if pl.Model != nil {
		name = pl.Model.Name
	}
	w := pl.Workload
	return fmt.Sprintf("%s %s %s %s %s ckpt%d gpus%d %s offload %s", name, w.Mode, w.Precision, w.Optimizer, w.Attention,
		w.Checkpointing, w.GPUs, w.Shard, w.Offload)
}

// Every run frees what it allocated for the step: after it only weights,
// optimizer state, workspaces (and, without an optimizer, gradients) are
// left; the count and the simulation see the same stream.
func TestNoLeaksAndCountMatchesSimulation(t *testing.T) {
	for _, pl := range plans() {
		if err := pl.Normalize(); err != nil {
			t.Fatalf("%s: %v", pl.label(), err)
		}
		c, _ := count(&pl)
		for _, cat := range []category{catActivations, catKVCache, catTemporary} {
			if c.live[cat] != 0 {
				t.Errorf("%s: %d bytes of category %d left after the run", pl.label(), c.live[cat], cat)
			}
		}
		var buckets uint64 // DDP's gradient buckets stay
		if p := newProgram(&pl, &counter{}); p.ddp && !pl.Workload.Offload.params() {
			for _, u := range p.units {
				for _, x := range u.params {
					buckets += x.gradN
				}
			}
		}
		if pl.Workload.Optimizer != NoOptimizer && c.live[catGrads] != buckets {
			t.Errorf("%s: %d bytes of gradients left after zero_grad, want %d", pl.label(), c.live[catGrads], buckets)
		}
		if c.live[catWeights] != c.high[catWeights] || c.live[catOptimizer] != c.high[catOptimizer] {
			t.Errorf("%s: weights or optimizer state freed during the run", pl.label())
		}
		s, _, err := simulate(&pl, MaxDevice)
		if err != nil {
			t.Fatalf("%s: %v", pl.label(), err)
		}
		if s.OOM || uint64(s.PeakRequested) != c.peak {
			t.Errorf("%s: simulated peak requested %d (oom %v), counted %d", pl.label(), s.PeakRequested, s.OOM, c.peak)
		}
	}
}

func train(t *testing.T, name string, w Workload) *Result {
	t.Helper()
	m, err := Preset(name)
	if err != nil {
		t.Fatal(err)
	}
	return estimateOf(t, Plan{Model: &m, Workload: w, Capacity: MaxDevice})
}

// Checkpointing every layer keeps only the layers' inputs; every other
// layer is in between.
func TestCheckpointingTradesActivations(t *testing.T) {
	w := Workload{Batch: 8, Seq: 512}
	none := train(t, "bert-base", w).Breakdown.Activations
	w.Checkpointing = 2
	half := train(t, "bert-base", w).Breakdown.Activations
	w.Checkpointing = 1
	all := train(t, "bert-base", w).Breakdown.Activations
	if !(all < half && half < none) || all > none/3 {
		t.Errorf("activations: none %d, every other layer %d, every layer %d", none, half, all)
	}
}

// Eager attention keeps b × heads × s² tensors: doubling the sequence
// quadruples what it adds over flash attention.
func TestEagerAttentionGrowsWithSequenceSquared(t *testing.T) {
	extra := func(seq int) float64 {
		e := train(t, "bert-base", Workload{Batch: 4, Seq: seq, Attention: Eager}).Breakdown.Activations
		f := train(t, "bert-base", Workload{Batch: 4, Seq: seq}).Breakdown.Activations
		return float64(e - f)
	}
	if r := extra(512) / extra(256); r < 3.6 || r > 4.4 {
		t.Errorf("eager attention's extra memory grows %.2f× from seq 256 to 512, want about 4", r)
	}
}

// ZeRO and FSDP: per-GPU state falls linearly with the GPUs.
func TestShardingDividesState(t *testing.T) {
	one := train(t, "gpt2-medium", Workload{Precision: AMPBF16, Batch: 1, Seq: 128}).Breakdown
	for _, n := range []int{2, 4, 8} {
		z1 := train(t, "gpt2-medium", Workload{Precision: AMPBF16, Batch: 1, Seq: 128, GPUs: n, Shard: ZeRO1}).Breakdown
		if d := math.Abs(float64(z1.Optimizer*int64(n))/float64(one.Optimizer) - 1); d > 0.01 {
			t.Errorf("zero1 over %d GPUs: optimizer state %d, want %d/%d", n, z1.Optimizer, one.Optimizer, n)
		}
		z3 := train(t, "gpt2-medium", Workload{Precision: AMPBF16, Batch: 1, Seq: 128, GPUs: n, Shard: FSDP}).Breakdown
		if d := math.Abs(float64(z3.Weights*int64(n))/float64(one.Weights*4/6) - 1); d > 0.01 {
			t.Errorf("fsdp over %d GPUs: weights %d, want the fp32 shard %d/%d", n, z3.Weights, one.Weights*4/6, n)
		}
	}
}

// Offloading moves the optimizer state to the host, reported apart.
func TestOffloadReportsHostMemory(t *testing.T) {
	on := train(t, "gpt2", Workload{Precision: AMPBF16, Offload: OffloadOptimizer}).Breakdown
	off := train(t, "gpt2", Workload{Precision: AMPBF16}).Breakdown
	if on.Optimizer != 0 || on.Host < off.Optimizer || on.Weights >= off.Weights {
		t.Errorf("offloaded: optimizer %d on the GPU, host %d, weights %d (not offloaded: %d, weights %d)",
			on.Optimizer, on.Host, on.Weights, off.Optimizer, off.Weights)
	}
}

// The key/value cache of grouped-query attention: 2 × layers × batch ×
// context × kv heads × head width × 2 bytes.
func TestKVCacheGroupedQuery(t *testing.T) {
	r := train(t, "llama3-8b", Workload{Mode: Infer, Batch: 2, Seq: 1000})
	if want := int64(2 * 32 * 2 * 1000 * 8 * 128 * 2); r.Breakdown.KVCache != want {
		t.Errorf("kv cache %d, want %d", r.Breakdown.KVCache, want)
	}
	g := train(t, "llama3-8b", Workload{Mode: Infer, Batch: 2, Seq: 1000, Generate: 24})
	final := int64(2 * 32 * 2 * 1024 * 8 * 128 * 2)
	if kv := g.Breakdown.KVCache; kv < final || kv > final+final/32 {
		t.Errorf("kv cache after decoding to 1024: %d, want %d and one layer's growth", kv, final)
	}
}

// The foreach step allocates a state-sized list; fused allocates none.
func TestOptimizerImplementations(t *testing.T) {
	p := int64(1e9)
	for _, c := range []struct {
		impl OptimizerImpl
		want int64
	}{{Foreach, 4 * p}, {Foreach113, 8 * p}, {Fused, 0}} {
		r := estimateOf(t, Plan{Params: p, Workload: Workload{OptimizerImpl: c.impl}, Capacity: MaxDevice})
		if r.Breakdown.Temporaries != c.want {
			t.Errorf("%s: temporaries %d, want %d", c.impl, r.Breakdown.Temporaries, c.want)
		}
	}
	r := estimateOf(t, Plan{Params: p, Workload: Workload{OptimizerImpl: SingleTensor}, Capacity: MaxDevice})
	if r.Breakdown.Temporaries != 2*bareChunk*4 {
		t.Errorf("single-tensor: temporaries %d, want two of the largest tensor", r.Breakdown.Temporaries)
	}
}

// Optimizer state per parameter, fp32.
func TestOptimizerState(t *testing.T) {
	p := int64(1 << 30) // 16 chunks of 64 Mi parameters in rows of 4096
	for _, c := range []struct {
		o      Optimizer
		lo, hi int64
	}{
		{AdamW, 8 * p, 8 * p}, {Adam, 8 * p, 8 * p}, {Momentum, 4 * p, 4 * p}, {SGD, 0, 0}, {NoOptimizer, 0, 0},
		{Adam8bit, 2*p + 2*p/256*4, 2*p + 2*p/256*4},                  // two bytes and two fp32 absmax per 256
		{Adafactor, 16 * 4 * (16384 + 4096), 16 * 4 * (16384 + 4096)}, // a row and a column per matrix
	} {
		r := estimateOf(t, Plan{Params: p, Workload: Workload{Optimizer: c.o}, Capacity: MaxDevice})
		if o := r.Breakdown.Optimizer; o < c.lo || o > c.hi {
			t.Errorf("%s: optimizer state %d, want %d..%d", c.o, o, c.lo, c.hi)
		}
	}
}

// GPT-2 small inference in fp32 at batch 4 × 512 is its weights, the
// returned cache (the fused QKV output of every layer) and the logits.
func TestGPT2InferenceComposition(t *testing.T) {
	r := train(t, "gpt2", Workload{Mode: Infer, Precision: FP32, Batch: 4, Seq: 512})
	tokens := int64(4 * 512)
	want := 124_439_808*4 + 12*tokens*3*768*4 + tokens*50257*4
	within(t, "peak allocated", r.Sim.PeakAllocated, want+2*int64(tokens*768*4), 0.02)
}

// A bare parameter count costs the same to simulate however large it is:
// it was divided into tensors of 64 Mi parameters, so that 100 trillion
// made 1.5 million tensors and the runtime died past 2.6 GB. Past 4,096
// tensors the tensors grow instead, and the weights, gradients and
// optimizer state still add up to the count.
func TestBareCountIsBounded(t *testing.T) {
	var before, after runtime.MemStats
	for _, p := range []int64{2e12, 1e14, MaxParameters} {
		pl := Plan{Params: p, Capacity: MaxDevice}
		runtime.GC()
		runtime.ReadMemStats(&before)
		r, err := pl.Estimate()
		runtime.ReadMemStats(&after)
		if err != nil {
			t.Fatal(err)
		}
		if n := after.TotalAlloc - before.TotalAlloc; n > 32<<20 {
			t.Fatalf("%d parameters: the estimate allocated %d bytes", p, n)
		}
		// fp32 AdamW: 4 bytes of weights, 4 of gradients, 8 of state.
		if r.Breakdown.Weights != min(4*p, 1<<62) || r.Breakdown.Optimizer != min(8*p, 1<<62) {
			t.Errorf("%d parameters: weights %d, optimizer state %d", p, r.Breakdown.Weights, r.Breakdown.Optimizer)
		}
	}
}

// A long generation costs about 1,500 decode steps however long it is
// (100,000 tokens took 46 s, every step simulated): the first and last
// 512 steps are simulated one token at a time and the steps between at
// most 512 at a time. The counted peak is exact, and the simulated
// allocator's peaks stay within a few percent of simulating every step.
func TestLongGenerationSampled(t *testing.T) {
	m, err := Preset("tinyllama-1.1b")
	if err != nil {
		t.Fatal(err)
	}
	allocs := func(gen int) int64 {
		pl := Plan{Model: &m, Workload: Workload{Mode: Infer, Generate: gen}, Capacity: MaxDevice}
		r := estimateOf(t, pl)
		return r.Sim.Stats.Allocation[0].Allocated
	}
	short, long := allocs(2000), allocs(100_000)
	if long > 2*short {
		t.Errorf("generating 100,000 tokens made %d allocations, 2,000 tokens %d", long, short)
	}

	// Sampled against every step, on a generation long enough to be
	// sampled at a smaller decodeExact.
	defer func(n int) { decodeExact = n }(decodeExact)
	for _, att := range []Attention{Flash, Eager} {
		pl := Plan{Model: &m, Workload: Workload{Mode: Infer, Generate: 1500, Batch: 2, Attention: att}, Capacity: 80 << 30}
		decodeExact = 1 << 30
		every := estimateOf(t, pl)
		decodeExact = 32
		sampled := estimateOf(t, pl)
		if sampled.Breakdown.Total != every.Breakdown.Total {
			t.Errorf("%s: counted peak %d sampled, %d with every step", att, sampled.Breakdown.Total, every.Breakdown.Total)
		}
		for _, c := range []struct {
			name      string
			got, want int64
		}{{"allocated", sampled.Sim.PeakAllocated, every.Sim.PeakAllocated}, {"reserved", sampled.Sim.PeakReserved, every.Sim.PeakReserved}} {
			if math.Abs(float64(c.got-c.want)) > 0.03*float64(c.want) {
				t.Errorf("%s: simulated peak %s %d sampled, %d with every step", att, c.name, c.got, c.want)
			}
		}
	}
}
