// This file holds the model presets, with the dimensions their authors
// published (the config.json of each model's Hugging Face repository).

package estimate

import (
	"fmt"
	"slices"
	"strings"

	"github.com/gpumem/gpumem/internal/quote"
)

func gpt2Preset(name string, hidden, layers, heads int) Model {
	return Model{Name: name, Family: GPT2, Vocab: 50257, Hidden: hidden, Layers: layers, Heads: heads,
		MaxPositions: 1024, TieEmbeddings: true, Bias: true, Dropout: 0.1,
		Activation: GELUTanhExplicit, ReturnsCache: true}
}

func bertPreset(name string, hidden, layers, heads int) Model {
	return Model{Name: name, Family: BERT, Vocab: 30522, Hidden: hidden, Layers: layers, Heads: heads,
		MaxPositions: 512, TypeVocab: 2, TieEmbeddings: true, Bias: true, Dropout: 0.1,
		Activation: GELU, Head: ClassifierHead, Labels: 2}
}

func llamaPreset(name string, vocab, hidden, inter, layers, heads, kv, positions int) Model {
	return Model{Name: name, Family: Llama, Vocab: vocab, Hidden: hidden, Intermediate: inter, Layers: layers,
		Heads: heads, KVHeads: kv, MaxPositions: positions, Activation: SiLU, ReturnsCache: true}
}

// presets maps names to models. Sources: openai-community/gpt2{,-medium,
// -large,-xl}, google-bert/bert-{base,large}-uncased (with the two-class
// sequence-classification head), TinyLlama/TinyLlama-1.1B-intermediate-
// step-1431k-3T, meta-llama/Llama-2-{7b,13b,70b}-hf, meta-llama/Meta-
// Llama-3-{8B,70B}, mistralai/Mistral-7B-v0.1, Qwen/Qwen2.5-{0.5B,7B}.
var presets = map[string]func() Model{
	"gpt2":           func() Model { return gpt2Preset("gpt2", 768, 12, 12) },
	"gpt2-medium":    func() Model { return gpt2Preset("gpt2-medium", 1024, 24, 16) },
	"gpt2-large":     func() Model { return gpt2Preset("gpt2-large", 1280, 36, 20) },
	"gpt2-xl":        func() Model { return gpt2Preset("gpt2-xl", 1600, 48, 25) },
	"bert-base":      func() Model { return bertPreset("bert-base", 768, 12, 12) },
	"bert-large":     func() Model { return bertPreset("bert-large", 1024, 24, 16) },
	"tinyllama-1.1b": func() Model { return llamaPreset("tinyllama-1.1b", 32000, 2048, 5632, 22, 32, 4, 2048) },
	"llama-7b":       func() Model { return llamaPreset("llama-7b", 32000, 4096, 11008, 32, 32, 32, 4096) },
	"llama-13b":      func() Model { return llamaPreset("llama-13b", 32000, 5120, 13824, 40, 40, 40, 4096) },
	"llama-70b":      func() Model { return llamaPreset("llama-70b", 32000, 8192, 28672, 80, 64, 8, 4096) },
	"llama3-8b":      func() Model { return llamaPreset("llama3-8b", 128256, 4096, 14336, 32, 32, 8, 8192) },
	"llama3-70b":     func() Model { return llamaPreset("llama3-70b", 128256, 8192, 28672, 80, 64, 8, 8192) },
	"mistral-7b":     func() Model { return llamaPreset("mistral-7b", 32000, 4096, 14336, 32, 32, 8, 32768) },
	"qwen2.5-0.5b": func() Model {
		m := llamaPreset("qwen2.5-0.5b", 151936, 896, 4864, 24, 14, 2, 32768)
		m.QKVBias, m.TieEmbeddings = true, true
		return m
	},
	"qwen2.5-7b": func() Model {
		m := llamaPreset("qwen2.5-7b", 152064, 3584, 18944, 28, 28, 4, 32768)
		m.QKVBias = true
		return m
	},
}

// Generic returns a model of the family without any one implementation's
// customs, for dimensions given by hand: PyTorch's fused activation (GELU;
// SiLU for Llama), no dropout, no cache returned in training; the
// family's usual vocabulary (50257, 30522, 32000), biases and tied
// embeddings for GPT2 and BERT, a two-class head for BERT. Set the
// dimensions, then Normalize.
func Generic(f Family) Model {
	switch f {
	case BERT:
		return Model{Name: "bert-shaped model", Family: BERT, Vocab: 30522, Bias: true, TieEmbeddings: true,
			Activation: GELU, Head: ClassifierHead}
	case Llama:
		return Model{Name: "llama-shaped model", Family: Llama, Vocab: 32000, Activation: SiLU}
	}
	return Model{Name: "gpt2-shaped model", Family: GPT2, Vocab: 50257, Bias: true, TieEmbeddings: true, Activation: GELU}
}

// Preset returns the model of that name (see Presets).
func Preset(name string) (Model, error) {
	f, ok := presets[strings.ToLower(strings.TrimSpace(name))]
	if !ok {
		return Model{}, fmt.Errorf("unknown model %s (want one of %s, or --config, --params or dimensions)",
			quote.Quote(name), strings.Join(Presets(), ", "))
	}
	m := f()
	m.Normalize()
	return m, nil
}

// Presets returns the preset names, sorted.
func Presets() []string {
	names := make([]string, 0, len(presets))
	for n := range presets {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}
