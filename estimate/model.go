// This file holds the model: a transformer's architecture, its limits and
// its parameter tensors. See doc.go for the overview.

package estimate

import (
	"fmt"
	"strings"

	"github.com/gpumem/gpumem/internal/quote"
)

// Family is the shape of a transformer block, named after the
// implementation whose tensors the estimate follows (Hugging Face
// transformers' modeling code for each family).
type Family int

// Families.
const (
	// GPT2 is a pre-norm decoder with a fused QKV projection, learned
	// positions, LayerNorm, biases and a two-matrix MLP (GPT-2, GPT-Neo-like).
	GPT2 Family = iota
	// BERT is a post-norm encoder with separate Q, K, V projections,
	// learned positions and token types, LayerNorm and biases.
	BERT
	// Llama is a pre-norm decoder with RMSNorm, rotary positions,
	// grouped-query attention and a gated (SwiGLU) MLP (Llama, Mistral,
	// Qwen2, TinyLlama).
	Llama
)

var familyNames = []string{"gpt2", "bert", "llama"}

// String names the family.
func (f Family) String() string { return enumString(familyNames, int(f), "Family") }

// ParseFamily reads "gpt2", "bert" or "llama".
func ParseFamily(s string) (Family, error) {
	i, err := parseEnum("family", familyNames, s)
	return Family(i), err
}

// Activation is the MLP's nonlinearity and how it is computed, which
// decides what autograd keeps for backward.
type Activation int

// Activations.
const (
	// GELU is torch.nn.functional.gelu (erf or tanh form): one fused
	// kernel that keeps only its input.
	GELU Activation = iota
	// GELUTanhExplicit is GPT-2's "gelu_new", written as the Python
	// expression 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))): autograd keeps
	// the input, tanh's output, 0.5·x and 1 + tanh, four MLP-wide tensors.
	GELUTanhExplicit
	// SiLU is torch.nn.functional.silu: fused, keeps its input.
	SiLU
	// SiLUExplicit is x·sigmoid(x) written out: keeps x and sigmoid(x).
	SiLUExplicit
	// ReLU is torch.relu: keeps its output.
	ReLU
)

var activationNames = []string{"gelu", "gelu-tanh-explicit", "silu", "silu-explicit", "relu"}

// String names the activation.
func (a Activation) String() string { return enumString(activationNames, int(a), "Activation") }

// ParseActivation reads an activation name, or a Hugging Face hidden_act
// value ("gelu_new", "gelu_pytorch_tanh", "swish", ...).
func ParseActivation(s string) (Activation, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "gelu_new", "gelu_fast":
		return GELUTanhExplicit, nil
	case "gelu_pytorch_tanh", "gelu_python", "gelu_accurate":
		return GELU, nil
	case "swish":
		return SiLU, nil
	}
	i, err := parseEnum("activation", activationNames, s)
	return Activation(i), err
}

// Softmax says how attention's softmax is computed in eager attention.
type Softmax int

// Softmax implementations.
const (
	// SoftmaxFused is torch.softmax: keeps its output.
	SoftmaxFused Softmax = iota
	// SoftmaxExplicit is exp(x − max) / sum written out: keeps the
	// exponentials and the result, two score-sized tensors.
	SoftmaxExplicit
)

var softmaxNames = []string{"fused", "explicit"}

// String names the softmax.
func (s Softmax) String() string { return enumString(softmaxNames, int(s), "Softmax") }

// ParseSoftmax reads "fused" or "explicit".
func ParseSoftmax(s string) (Softmax, error) {
	i, err := parseEnum("softmax", softmaxNames, s)
	return Softmax(i), err
}

// Head is what sits on top of the last block.
type Head int

// Heads.
const (
	// LMHead projects every token to the vocabulary (causal or masked
	// language modelling): logits of tokens × vocab.
	LMHead Head = iota
	// ClassifierHead pools the first token and classifies it into Labels
	// classes (BertForSequenceClassification): tiny logits.
	ClassifierHead
)

var headNames = []string{"lm", "classifier"}

// String names the head.
func (h Head) String() string { return enumString(headNames, int(h), "Head") }

// Model is a transformer's architecture. The zero value is not valid;
// start from a preset (Preset), a Hugging Face config (ParseConfig) or
// fill the dimensions and call Normalize.
type Model struct {
	Name   string
	Family Family

	Vocab        int // vocabulary size
	Hidden       int // model width
	Intermediate int // MLP width
	Layers       int // transformer blocks
	Heads        int // attention heads
	KVHeads      int // key/value heads (grouped-query attention); 0 means Heads
	HeadDim      int // per-head width; 0 means Hidden / Heads
	MaxPositions int // learned position table size (GPT2, BERT); the longest sequence for every family
	TypeVocab    int // BERT token types

	TieEmbeddings bool    // the LM head reuses the token embedding
	Bias          bool    // every linear layer has a bias (GPT2, BERT)
	QKVBias       bool    // only Q, K and V have biases (Qwen2)
	Dropout       float64 // dropout probability in training (embeddings, attention, residual)

	Activation Activation
	Softmax    Softmax // how eager attention computes its softmax
	Head       Head
	Labels     int // classes of a ClassifierHead

	// ReturnsCache says the forward pass returns its keys and values (a
	// Hugging Face decoder's use_cache=True default), so that in training
	// too every layer's keys and values stay allocated while the caller
	// holds the output.
	ReturnsCache bool
}

// Limits on models and workloads. Anything larger is refused with an
// error; within them every size is computed without overflow (products
// saturate, and a saturated size simply does not fit).
const (
	MaxLayers     = 4096
	MaxHidden     = 1 << 17
	MaxHeads      = 1 << 12
	MaxVocab      = 1 << 24
	MaxSequence   = 1 << 24 // tokens per sequence, and MaxPositions
	MaxBatch      = 1 << 24
	MaxParameters = 1e15 // a bare --params count
)

// HeadWidth returns the per-head width.
func (m *Model) HeadWidth() int {
	if m.HeadDim > 0 {
		return m.HeadDim
	}
	if m.Heads <= 0 {
		return 0
	}
	return m.Hidden / m.Heads
}

// kvHeads returns the key/value heads.
func (m *Model) kvHeads() int {
	if m.KVHeads > 0 {
		return m.KVHeads
	}
	return m.Heads
}

// Normalize fills what can be derived: KV heads from heads, the MLP
// width (4 × hidden, or the Llama rule 8/3 × hidden rounded up to 256),
// the position table, labels and the family's customs (GELU, cache
// returned by decoders).
func (m *Model) Normalize() {
	if m.KVHeads == 0 {
		m.KVHeads = m.Heads
	}
	if m.Intermediate == 0 && m.Hidden > 0 {
		if m.Family == Llama {
			m.Intermediate = (8*m.Hidden/3 + 255) / 256 * 256
		} else {
			m.Intermediate = 4 * m.Hidden
		}
	}
	if m.Family == BERT && m.TypeVocab == 0 {
		m.TypeVocab = 2
	}
	if m.Head == ClassifierHead && m.Labels == 0 {
		m.Labels = 2
	}
	if m.MaxPositions == 0 {
		switch m.Family {
		case GPT2:
			m.MaxPositions = 1024
		case BERT:
			m.MaxPositions = 512
		default:
			m.MaxPositions = 4096
		}
	}
}

// Validate checks the dimensions against each other and the limits. The
// error is one line.
func (m *Model) Validate() error {
	var errs []string
	check := func(name string, v, lo, hi int) {
		if v < lo || v > hi {
			errs = append(errs, fmt.Sprintf("%s must be %d..%d, got %d", name, lo, hi, v))
		}
	}
	if m.Family < GPT2 || m.Family > Llama {
		errs = append(errs, fmt.Sprintf("unknown family %d", int(m.Family)))
	}
	check("layers", m.Layers, 1, MaxLayers)
	check("hidden", m.Hidden, 1, MaxHidden)
	check("heads", m.Heads, 1, MaxHeads)
	check("vocab", m.Vocab, 1, MaxVocab)
	check("intermediate", m.Intermediate, 1, 8*MaxHidden)
	check("kv-heads", m.KVHeads, 0, MaxHeads)
	check("head-dim", m.HeadDim, 0, MaxHidden)
	check("max positions", m.MaxPositions, 0, MaxSequence)
	check("type vocab", m.TypeVocab, 0, 1<<16)
	check("labels", m.Labels, 0, 1<<20)
	if len(errs) == 0 {
		if m.HeadDim == 0 && m.Hidden%m.Heads != 0 {
			errs = append(errs, fmt.Sprintf("hidden %d is not a multiple of heads %d", m.Hidden, m.Heads))
		}
		if kv := m.kvHeads(); kv > m.Heads || m.Heads%kv != 0 {
			errs = append(errs, fmt.Sprintf("heads %d is not a multiple of kv-heads %d", m.Heads, kv))
		}
	}
	if !(m.Dropout >= 0 && m.Dropout < 1) {
		errs = append(errs, fmt.Sprintf("dropout must be in [0, 1), got %g", m.Dropout))
	}
	if m.Activation < GELU || m.Activation > ReLU {
		errs = append(errs, fmt.Sprintf("unknown activation %d", int(m.Activation)))
	}
	if m.Softmax < SoftmaxFused || m.Softmax > SoftmaxExplicit {
		errs = append(errs, fmt.Sprintf("unknown softmax %d", int(m.Softmax)))
	}
	if m.Head < LMHead || m.Head > ClassifierHead {
		errs = append(errs, fmt.Sprintf("unknown head %d", int(m.Head)))
	}
	if len(errs) > 0 {
		return fmt.Errorf("invalid model: %s", strings.Join(errs, "; "))
	}
	return nil
}

// role names a parameter tensor's job, for LoRA targets and quantization.
type role int

const (
	roleEmbed role = iota // token embedding
	rolePos               // learned positions, token types
	roleNorm              // norm weight or bias
	roleBias              // a linear layer's bias
	roleQKV               // GPT-2's fused projection
	roleQ
	roleK
	roleV
	roleO
	roleUp   // MLP up (or GPT-2 c_fc, BERT intermediate)
	roleGate // gated MLP's gate
	roleDown // MLP down
	roleHead // untied LM head, pooler, classifier
)

// linear reports whether the role is a transformer block's linear weight:
// what LoRA adapts and int8/int4 quantize.
func (r role) linear() bool { return r >= roleQKV && r <= roleDown }

// spec is one parameter tensor: rows × cols elements (cols is the input
// width of a linear weight; vectors have one row).
type spec struct {
	role       role
	rows, cols uint64
}

func (s spec) elems() uint64 { return mul(s.rows, s.cols) }

func vec(r role, n int) spec { return spec{r, 1, uint64(n)} }

func mat(r role, out, in int) spec { return spec{r, uint64(out), uint64(in)} }

// linearSpecs appends a linear layer's weight and, if it has one, bias.
func linearSpecs(ss []spec, r role, out, in int, bias bool) []spec {
	ss = append(ss, mat(r, out, in))
	if bias {
		ss = append(ss, vec(roleBias, out))
	}
	return ss
}

// layerSpecs returns one block's parameter tensors, in the order the
// block uses them.
func (m *Model) layerSpecs() []spec {
	h, i := m.Hidden, m.Intermediate
	q, kv := m.Heads*m.HeadWidth(), m.kvHeads()*m.HeadWidth()
	var ss []spec
	switch m.Family {
	case GPT2:
		ss = append(ss, vec(roleNorm, h), vec(roleNorm, h))
		ss = linearSpecs(ss, roleQKV, q+2*kv, h, m.Bias)
		ss = linearSpecs(ss, roleO, h, q, m.Bias)
		ss = append(ss, vec(roleNorm, h), vec(roleNorm, h))
		ss = linearSpecs(ss, roleUp, i, h, m.Bias)
		ss = linearSpecs(ss, roleDown, h, i, m.Bias)
	case BERT:
		ss = linearSpecs(ss, roleQ, q, h, m.Bias)
		ss = linearSpecs(ss, roleK, kv, h, m.Bias)
		ss = linearSpecs(ss, roleV, kv, h, m.Bias)
		ss = linearSpecs(ss, roleO, h, q, m.Bias)
		ss = append(ss, vec(roleNorm, h), vec(roleNorm, h))
		ss = linearSpecs(ss, roleUp, i, h, m.Bias)
		ss = linearSpecs(ss, roleDown, h, i, m.Bias)
		ss = append(ss, vec(roleNorm, h), vec(roleNorm, h))
	case Llama:
		ss = append(ss, vec(roleNorm, h))
		ss = linearSpecs(ss, roleQ, q, h, m.Bias || m.QKVBias)
		ss = linearSpecs(ss, roleK, kv, h, m.Bias || m.QKVBias)
		ss = linearSpecs(ss, roleV, kv, h, m.Bias || m.QKVBias)
		ss = linearSpecs(ss, roleO, h, q, m.Bias)
		ss = append(ss, vec(roleNorm, h))
		ss = linearSpecs(ss, roleGate, i, h, m.Bias)
		ss = linearSpecs(ss, roleUp, i, h, m.Bias)
		ss = linearSpecs(ss, roleDown, h, i, m.Bias)
	}
	return ss
}

// embedSpecs returns the tensors before the first block.
func (m *Model) embedSpecs() []spec {
	ss := []spec{mat(roleEmbed, m.Vocab, m.Hidden)}
	switch m.Family {
	case GPT2:
		ss = append(ss, mat(rolePos, m.MaxPositions, m.Hidden))
	case BERT:
		ss = append(ss, mat(rolePos, m.MaxPositions, m.Hidden), mat(rolePos, m.TypeVocab, m.Hidden),
			vec(roleNorm, m.Hidden), vec(roleNorm, m.Hidden))
	}
	return ss
}

// headSpecs returns the tensors after the last block: the final norm and
// the head (nothing for a tied LM head).
func (m *Model) headSpecs() []spec {
	var ss []spec
	switch m.Family {
	case GPT2:
		ss = append(ss, vec(roleNorm, m.Hidden), vec(roleNorm, m.Hidden))
	case Llama:
		ss = append(ss, vec(roleNorm, m.Hidden))
	}
	switch {
	case m.Head == ClassifierHead && m.Family == BERT: // pooler and classifier
		ss = linearSpecs(ss, roleHead, m.Hidden, m.Hidden, true)
		ss = linearSpecs(ss, roleHead, m.Labels, m.Hidden, true)
	case m.Head == ClassifierHead: // a decoder's score layer on the last token
		ss = append(ss, mat(roleHead, m.Labels, m.Hidden))
	case m.Family == BERT: // BertForMaskedLM's transform and decoder bias
		ss = linearSpecs(ss, roleHead, m.Hidden, m.Hidden, true)
		ss = append(ss, vec(roleNorm, m.Hidden), vec(roleNorm, m.Hidden), vec(roleBias, m.Vocab))
		if !m.TieEmbeddings {
			ss = append(ss, mat(roleHead, m.Vocab, m.Hidden))
		}
	case !m.TieEmbeddings:
		ss = append(ss, mat(roleHead, m.Vocab, m.Hidden))
	}
	return ss
}

func sumElems(ss []spec) uint64 {
	var n uint64
	for _, s := range ss {
		n = add(n, s.elems())
	}
	return n
}

// Params returns the number of parameters.
func (m *Model) Params() int64 {
	n := add(sumElems(m.embedSpecs()), mul(uint64(m.Layers), sumElems(m.layerSpecs())), sumElems(m.headSpecs()))
	return int64(min(n, capBytes))
}

// enumString and parseEnum back the String and Parse functions of the
// small enums.
func enumString(names []string, i int, typ string) string {
	if i >= 0 && i < len(names) {
		return names[i]
	}
	return fmt.Sprintf("%s(%d)", typ, i)
}

func parseEnum(what string, names []string, s string) (int, error) {
	t := strings.ToLower(strings.TrimSpace(s))
	for i, n := range names {
		if t == n {
			return i, nil
		}
	}
	return 0, fmt.Errorf("unknown %s %s (want %s)", what, quote.Quote(s), strings.Join(names, ", "))
}
