package estimate

import (
	"errors"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/gpumemtest"
)

// The presets' parameter counts, as their model cards publish them.
func TestPresetParameters(t *testing.T) {
	for name, want := range map[string]int64{
		"gpt2":           124_439_808,
		"gpt2-medium":    354_823_168,
		"gpt2-large":     774_030_080,
		"gpt2-xl":        1_557_611_200,
		"bert-base":      109_483_778, // BertForSequenceClassification, 2 labels
		"bert-large":     335_143_938,
		"tinyllama-1.1b": 1_100_048_384,
		"llama-7b":       6_738_415_616,
		"llama-13b":      13_015_864_320,
		"llama-70b":      68_976_648_192,
		"llama3-8b":      8_030_261_248,
		"mistral-7b":     7_241_732_096,
		"qwen2.5-7b":     7_615_616_512,
		"qwen2.5-0.5b":   494_032_768,
	} {
		m, err := Preset(name)
		if err != nil {
			t.Fatal(err)
		}
		if got := m.Params(); got != want {
			t.Errorf("%s: %d parameters, want %d", name, got, want)
		}
	}
	if _, err := Preset("gpt5"); err == nil || !strings.Contains(err.Error(), "llama-7b") {
		t.Errorf("unknown preset: %v", err)
	}
}

func TestParseConfig(t *testing.T) {
	llama := `{"architectures": ["LlamaForCausalLM"], "hidden_act": "silu", "hidden_size": 4096,
		"intermediate_size": 14336, "max_position_embeddings": 8192, "model_type": "llama",
		"num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
		"tie_word_embeddings": false, "vocab_size": 128256, "torch_dtype": "bfloat16"}`
	m, err := ParseConfig([]byte(llama))
	if err != nil {
		t.Fatal(err)
	}
	if m.Params() != 8_030_261_248 || m.KVHeads != 8 || m.Family != Llama {
		t.Errorf("llama 3 8B config: %+v, %d parameters", m, m.Params())
	}
	gpt2 := `{"model_type": "gpt2", "n_embd": 768, "n_layer": 12, "n_head": 12, "n_inner": null,
		"n_positions": 1024, "vocab_size": 50257, "activation_function": "gelu_new", "resid_pdrop": 0.1}`
	if m, err = ParseConfig([]byte(gpt2)); err != nil || m.Params() != 124_439_808 || m.Activation != GELUTanhExplicit {
		t.Errorf("gpt2 config: %+v, %v", m, err)
	}
	bert := `{"architectures": ["BertForMaskedLM"], "model_type": "bert", "hidden_size": 768,
		"num_hidden_layers": 12, "num_attention_heads": 12, "intermediate_size": 3072,
		"max_position_embeddings": 512, "type_vocab_size": 2, "vocab_size": 30522, "hidden_act": "gelu"}`
	if m, err = ParseConfig([]byte(bert)); err != nil || m.Head != LMHead || m.Params() != 109_514_298 {
		t.Errorf("bert MLM config: %+v (%d parameters), %v", m, m.Params(), err)
	}
	qwen := `{"model_type": "qwen2", "hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28,
		"num_attention_heads": 28, "num_key_value_heads": 4, "vocab_size": 152064, "tie_word_embeddings": false}`
	if m, err = ParseConfig([]byte(qwen)); err != nil || m.Params() != 7_615_616_512 {
		t.Errorf("qwen2 config: %d parameters, %v", m.Params(), err)
	}
	for _, bad := range []string{
		``, `[]`, `{"model_type": "t5"}`, `{"model_type": "llama", "num_hidden_layers": 2.5}`,
		`{"model_type": "llama", "num_hidden_layers": "32"}`, `{"model_type": "llama", "num_hidden_layers": 900000}`,
		`{"model_type": "llama", "hidden_size": 4096, "num_attention_heads": 3}`,
		`{"model_type": "gpt2", "activation_function": "gelu_weird"}`, `{"model_type": "bert", "tie_word_embeddings": 1}`,
	} {
		if _, err := ParseConfig([]byte(bad)); err == nil || strings.Contains(err.Error(), "\n") {
			t.Errorf("config %s: error %v, want one line", bad, err)
		}
	}
}

// A config without the model's shape is an error that names what is
// missing: {}, null and a generation_config.json answered as a default
// llama.
func TestParseConfigNeedsTheShape(t *testing.T) {
	for conf, want := range map[string]string{
		`{}`:   "no hidden_size, num_hidden_layers, num_attention_heads, intermediate_size, vocab_size",
		`null`: "null, not an object",
		`{"_from_model_config": true, "bos_token_id": 1, "eos_token_id": 2, "transformers_version": "4.36.0"}`: "no hidden_size",
		`{"model_type": "gpt2", "n_layer": 12}`:                                                                                                              "no n_embd, n_head, vocab_size",
		`{"model_type": "bert", "hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12}`:                                                     "no intermediate_size, vocab_size",
		`{"model_type": "mistral", "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32, "intermediate_size": null, "vocab_size": 32000}`: "no intermediate_size",
	} {
		_, err := ParseConfig([]byte(conf))
		if assert.Error(t, err, conf) {
			assert.Contains(t, err.Error(), want, conf)
		}
	}
}

// The parsers quote at most about 100 bytes of their input: they
// repeated a 5 MB argument whole.
func TestParseErrorsAreShort(t *testing.T) {
	long := strings.Repeat("\x1b[31m", 5<<20/8)
	errs := map[string]error{}
	_, errs["ParseActivation"] = ParseActivation(long)
	_, errs["ParseFamily"] = ParseFamily(long)
	_, errs["ParseMode"] = ParseMode(long)
	_, errs["ParseCount"] = ParseCount(long)
	_, errs["LookupCard"] = LookupCard(long)
	_, errs["Preset"] = Preset(long)
	_, errs["ParseConfig model_type"] = ParseConfig([]byte(`{"model_type": "` + long + `"}`))
	_, errs["ParseConfig hidden_act"] = ParseConfig([]byte(`{"model_type": "llama", "hidden_act": "` + long + `"}`))
	_, errs["ParseConfig a list"] = ParseConfig([]byte(`{"model_type": "llama", "hidden_size": [` + strings.Repeat("1,", 1<<20) + `1]}`))
	for name, err := range errs {
		if assert.Error(t, err, name) {
			assert.Less(t, len(err.Error()), 600, "%s: %.300s", name, err.Error())
			assert.NotContains(t, err.Error(), "\x1b", "%s: control characters are escaped", name)
		}
	}
}

func TestParseCount(t *testing.T) {
	for in, want := range map[string]int64{"7B": 7e9, "7e9": 7e9, "1.3B": 1.3e9, "125m": 125e6, "70b": 70e9, "7000000000": 7e9, "1.5T": 1.5e12} {
		if got, err := ParseCount(in); err != nil || got != want {
			t.Errorf("%q: %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "B", "-7B", "0", "7X", "NaN", "Inf", "1e400", "2e15", "seven"} {
		if _, err := ParseCount(in); err == nil {
			t.Errorf("%q: no error", in)
		}
	}
}

// Absurd models are refused by the limits with a one-line error; within
// them, sizes saturate and do not fit.
func TestLimits(t *testing.T) {
	m, _ := Preset("gpt2")
	m.Layers = 900000
	_, err := Plan{Model: &m, Capacity: 80 << 30}.Estimate()
	if err == nil || !strings.Contains(err.Error(), "layers must be 1..4096, got 900000") || strings.Contains(err.Error(), "\n") {
		t.Errorf("900000 layers: %v", err)
	}
	huge := Model{Family: Llama, Layers: MaxLayers, Hidden: MaxHidden, Heads: 1024, Vocab: MaxVocab, Intermediate: 8 * MaxHidden}
	r, err := Plan{Model: &huge, Workload: Workload{Batch: MaxBatch, Seq: MaxSequence, Attention: Eager}, Capacity: 80 << 30}.Estimate()
	if err != nil || r.Fits || r.Breakdown.Total <= 0 {
		t.Errorf("the largest model: %v, %+v", err, r)
	}
	for _, pl := range []Plan{
		{Params: 7e9},
		{Params: 0, Capacity: 1},
		{Params: 7e9, Capacity: 80 << 30, Workload: Workload{Mode: LoRA}},
		{Params: 7e9, Capacity: 80 << 30, Workload: Workload{Mode: Infer, Precision: AMPBF16}},
		{Params: 7e9, Capacity: 80 << 30, Workload: Workload{Precision: Int4}},
		{Params: 7e9, Capacity: 80 << 30, Workload: Workload{Batch: -1}},
		{Params: 7e9, Capacity: 80 << 30, Workload: Workload{LoRATargets: []string{"qq"}}},
		{Model: &m, Capacity: 80 << 30},
	} {
		if _, err := pl.Estimate(); err == nil || strings.Contains(err.Error(), "\n") {
			t.Errorf("%+v: error %v, want one line", pl, err)
		}
	}
}

// Random plans, valid or not, never panic: they estimate or fail with
// one line.
func TestRandomPlansDoNotPanic(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	pick := func(xs ...int) int { return xs[rng.IntN(len(xs))] }
	for range 600 {
		m := Model{Family: Family(rng.IntN(4) - rng.IntN(2)), Layers: pick(0, 1, 2, 3, 5000), Hidden: pick(0, 64, 96, 128),
			Heads: pick(0, 1, 2, 3, 4), KVHeads: pick(0, 1, 2), Vocab: pick(0, 7, 1000), Intermediate: pick(0, 5, 256),
			MaxPositions: pick(0, 16, 64), Dropout: []float64{0, 0.1, 1, -1}[rng.IntN(4)], Activation: Activation(rng.IntN(6)),
			Softmax: Softmax(rng.IntN(3)), Head: Head(rng.IntN(3)), Labels: pick(0, 1, 3), HeadDim: pick(0, 0, 16),
			TypeVocab: pick(0, 1), QKVBias: rng.IntN(2) == 0, Bias: rng.IntN(2) == 0,
			TieEmbeddings: rng.IntN(2) == 0, ReturnsCache: rng.IntN(2) == 0}
		w := Workload{Mode: Mode(rng.IntN(5)), Precision: Precision(rng.IntN(9)), Optimizer: Optimizer(rng.IntN(8)),
			OptimizerImpl: OptimizerImpl(rng.IntN(5)), Batch: pick(0, 1, 3, -2), Seq: pick(0, 1, 17, 100), Generate: pick(0, 0, 2),
			Checkpointing: pick(0, 1, 2), Attention: Attention(rng.IntN(3)), GPUs: pick(0, 1, 3), Shard: Shard(rng.IntN(6)),
			Offload: Offload(rng.IntN(5)), LossOnly: rng.IntN(2) == 0}
		pl := Plan{Model: &m, Workload: w, Capacity: uint64(pick(1, 1<<20, 1<<30)), Context: int64(pick(0, -1, 1<<20))}
		if rng.IntN(5) == 0 {
			pl.Model, pl.Params = nil, int64(pick(0, 1, 5000, 1<<27))
		}
		r, err := pl.Estimate()
		if err != nil {
			if strings.Contains(err.Error(), "\n") {
				t.Errorf("%+v: error of several lines: %v", pl, err)
			}
			continue
		}
		if r.Breakdown.Total < 0 || r.Sim == nil {
			t.Errorf("%+v: %+v", pl, r)
		}
		if _, err := pl.MaxBatch(64); err != nil && pl.Model != nil {
			t.Errorf("%+v: max batch: %v", pl, err)
		}
	}
}

func FuzzPlan(f *testing.F) {
	f.Add(uint8(0), uint8(0), 12, 768, 12, 2, 128, uint8(0), uint8(1), uint8(0), 0, 0)
	f.Add(uint8(2), uint8(3), 2, 64, 4, 1, 16, uint8(4), uint8(0), uint8(1), 1, 2)
	f.Fuzz(func(t *testing.T, fam, mode uint8, layers, hidden, heads, batch, seq int, prec, att, head uint8, labels, gen int) {
		if layers > 8 || hidden > 512 || batch > 64 || seq > 512 || labels > 100 || gen > 8 {
			t.Skip()
		}
		m := Model{Family: Family(fam % 3), Layers: layers, Hidden: hidden, Heads: heads, Vocab: 1000,
			Head: Head(head % 2), Labels: labels}
		pl := Plan{Model: &m, Capacity: 1 << 30, Workload: Workload{Mode: Mode(mode % 4), Precision: Precision(prec % 8),
			Batch: batch, Seq: seq, Attention: Attention(att % 2), Generate: gen}}
		if r, err := pl.Estimate(); err == nil && r.Breakdown.Total <= 0 {
			t.Errorf("total %d", r.Breakdown.Total)
		}
	})
}

// Drive plays the stream on a caller's allocator, step by step.
func TestDrive(t *testing.T) {
	m := Generic(GPT2)
	m.Layers, m.Hidden, m.Heads = 2, 256, 4
	a := gpumemtest.New(t, gpumemtest.WithCapacity(1<<30), gpumemtest.AllowLeaks())
	var steps []int
	pl := Plan{Model: &m, Workload: Workload{Batch: 2, Seq: 64}}
	if err := pl.Drive(a, 3, func(i int) error { steps = append(steps, i); return nil }); err != nil {
		t.Fatal(err)
	}
	if len(steps) != 4 || steps[3] != 3 {
		t.Errorf("after called for steps %v", steps)
	}
	st := a.Stats()
	if st.NumOOMs != 0 || st.AllocatedBytes[0].Current == 0 {
		t.Errorf("after the run: %+v", st.AllocatedBytes[0])
	}
	a = gpumemtest.New(t, gpumemtest.WithCapacity(16<<20), gpumemtest.AllowLeaks())
	if err := pl.Drive(a, 1, nil); !errors.Is(err, device.ErrOutOfMemory) {
		t.Errorf("on 16 MiB: %v, want out of memory", err)
	}
	stop := errors.New("stop")
	a = gpumemtest.New(t, gpumemtest.WithCapacity(1<<30), gpumemtest.AllowLeaks())
	if err := pl.Drive(a, 5, func(i int) error {
		if i == 1 {
			return stop
		}
		return nil
	}); err != stop {
		t.Errorf("stopped by after: %v", err)
	}
}
