// This file reads a Hugging Face config.json into a Model.

package estimate

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/gpumem/gpumem/internal/quote"
)

// ParseConfig reads a Hugging Face transformers config.json of the llama,
// mistral, qwen2, gpt2 or bert family (model_type; guessed from the keys
// when absent). GPT-2 configs use n_embd, n_layer, n_head, n_inner and
// n_positions; the others hidden_size, intermediate_size,
// num_hidden_layers, num_attention_heads, num_key_value_heads and
// max_position_embeddings. vocab_size and tie_word_embeddings are read for
// all; the dropout probabilities, hidden_act, biases and, for BERT, the
// architecture (masked LM or sequence classification) too.
//
// The shape must be given: a config without the width, depth, heads, MLP
// width (llama and bert families) or vocabulary of its family, such as
// {}, null or a generation_config.json, is an error that names the
// missing keys. Errors quote at most about 100 bytes of any value.
func ParseConfig(data []byte) (Model, error) {
	var raw map[string]any
	if err := json.Unmarshal(data, &raw); err != nil {
		return Model{}, fmt.Errorf("config: not a JSON object: %v", err)
	}
	if raw == nil {
		return Model{}, errors.New("config: the JSON is null, not an object of the model's settings")
	}
	c := hfConfig{raw: raw}
	typ, _ := raw["model_type"].(string)
	if typ == "" {
		switch {
		case raw["n_embd"] != nil:
			typ = "gpt2"
		case raw["type_vocab_size"] != nil:
			typ = "bert"
		default:
			typ = "llama"
		}
	}
	var m Model
	switch typ {
	case "gpt2":
		m = Model{Family: GPT2, Vocab: c.int("vocab_size", 50257), Hidden: c.int("n_embd", 768),
			Layers: c.int("n_layer", 12), Heads: c.int("n_head", 12), Intermediate: c.int("n_inner", 0),
			MaxPositions: c.int("n_positions", 1024), TieEmbeddings: c.bool("tie_word_embeddings", true),
			Bias: true, Dropout: c.float("resid_pdrop", 0.1), ReturnsCache: c.bool("use_cache", true)}
		m.Activation = c.activation("activation_function", GELUTanhExplicit)
	case "bert":
		m = Model{Family: BERT, Vocab: c.int("vocab_size", 30522), Hidden: c.int("hidden_size", 768),
			Layers: c.int("num_hidden_layers", 12), Heads: c.int("num_attention_heads", 12),
			Intermediate: c.int("intermediate_size", 3072), MaxPositions: c.int("max_position_embeddings", 512),
			TypeVocab: c.int("type_vocab_size", 2), TieEmbeddings: c.bool("tie_word_embeddings", true),
			Bias: true, Dropout: c.float("hidden_dropout_prob", 0.1), Head: ClassifierHead}
		m.Activation = c.activation("hidden_act", GELU)
		if archs, _ := raw["architectures"].([]any); slices.ContainsFunc(archs, func(a any) bool {
			s, _ := a.(string)
			return strings.Contains(s, "MaskedLM") || strings.Contains(s, "PreTraining")
		}) {
			m.Head = LMHead
		}
		m.Labels = c.int("num_labels", 0)
		if id2, ok := raw["id2label"].(map[string]any); ok && m.Labels == 0 {
			m.Labels = len(id2)
		}
	case "llama", "mistral", "qwen2":
		m = Model{Family: Llama, Vocab: c.int("vocab_size", 32000), Hidden: c.int("hidden_size", 4096),
			Layers: c.int("num_hidden_layers", 32), Heads: c.int("num_attention_heads", 32),
			KVHeads: c.int("num_key_value_heads", 0), HeadDim: c.int("head_dim", 0),
			Intermediate: c.int("intermediate_size", 11008), MaxPositions: c.int("max_position_embeddings", 4096),
			TieEmbeddings: c.bool("tie_word_embeddings", false), Bias: c.bool("mlp_bias", false),
			QKVBias: typ == "qwen2" || c.bool("attention_bias", false), Dropout: c.float("attention_dropout", 0),
			ReturnsCache: c.bool("use_cache", true)}
		m.Activation = c.activation("hidden_act", SiLU)
	default:
		return Model{}, fmt.Errorf("config: model_type %s is not supported (want llama, mistral, qwen2, gpt2 or bert)", quote.Quote(typ))
	}
	if c.err != nil {
		return Model{}, c.err
	}
	if missing := c.missing(shapeKeys[m.Family]); len(missing) > 0 {
		return Model{}, fmt.Errorf("config: no %s: a %s config.json gives the model's shape "+
			"(a generation_config.json or tokenizer_config.json does not)", strings.Join(missing, ", "), typ)
	}
	if name, ok := raw["_name_or_path"].(string); ok && name != "" {
		m.Name = name
	} else {
		m.Name = typ + " config"
	}
	m.Normalize()
	if err := m.Validate(); err != nil {
		return Model{}, fmt.Errorf("config: %w", err)
	}
	return m, nil
}

// shapeKeys are the keys a config.json of each family must give: its
// shape, which no default can guess.
var shapeKeys = map[Family][]string{
	GPT2:  {"n_embd", "n_layer", "n_head", "vocab_size"},
	BERT:  {"hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size"},
	Llama: {"hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size"},
}

// missing returns the keys absent from the config or null there.
func (c *hfConfig) missing(keys []string) []string {
	var out []string
	for _, k := range keys {
		if c.raw[k] == nil {
			out = append(out, k)
		}
	}
	return out
}

// describeJSON names a decoded JSON value for a message, quoting at most
// about 100 bytes of it.
func describeJSON(v any) string {
	switch x := v.(type) {
	case string:
		return quote.Quote(x)
	case float64:
		return strconv.FormatFloat(x, 'g', -1, 64)
	case bool:
		return strconv.FormatBool(x)
	case []any:
		return fmt.Sprintf("a list of %d items", len(x))
	case map[string]any:
		return fmt.Sprintf("an object of %d keys", len(x))
	}
	return "null"
}

// hfConfig reads typed values, keeping the first error.
type hfConfig struct {
	raw map[string]any
	err error
}

func (c *hfConfig) fail(key, want string, v any) {
	if c.err == nil {
		c.err = fmt.Errorf("config: %s is %s, want %s", key, describeJSON(v), want)
	}
}

func (c *hfConfig) int(key string, def int) int {
	v, ok := c.raw[key]
	if !ok || v == nil {
		return def
	}
	f, ok := v.(float64)
	if !ok || f != math.Trunc(f) || f < 0 || f > 1<<40 {
		c.fail(key, "a non-negative integer", v)
		return def
	}
	return int(f)
}

func (c *hfConfig) float(key string, def float64) float64 {
	v, ok := c.raw[key]
	if !ok || v == nil {
		return def
	}
	f, ok := v.(float64)
	if !ok {
		c.fail(key, "a number", v)
		return def
	}
	return f
}

func (c *hfConfig) bool(key string, def bool) bool {
	v, ok := c.raw[key]
	if !ok || v == nil {
		return def
	}
	b, ok := v.(bool)
	if !ok {
		c.fail(key, "true or false", v)
		return def
	}
	return b
}

func (c *hfConfig) activation(key string, def Activation) Activation {
	v, ok := c.raw[key]
	if !ok || v == nil {
		return def
	}
	s, _ := v.(string)
	a, err := ParseActivation(s)
	if err != nil {
		c.fail(key, "an activation such as gelu, gelu_new or silu", v)
		return def
	}
	return a
}
