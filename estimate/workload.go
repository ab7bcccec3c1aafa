// This file holds the workload: what is done with the model (training,
// fine-tuning, inference), in which precision, with which optimizer, and
// how it is spread over GPUs and host memory.

package estimate

import (
	"fmt"
	"strings"

	"github.com/gpumem/gpumem/internal/quote"
)

// Mode is what the model is used for.
type Mode int

// Modes.
const (
	Full  Mode = iota // full training: every parameter has a gradient and optimizer state
	LoRA              // frozen base, trainable low-rank adapters
	QLoRA             // LoRA on a base quantized to 4-bit NF4
	Infer             // prefill and decode with a key/value cache, no gradients
)

var modeNames = []string{"full", "lora", "qlora", "infer"}

// String names the mode.
func (m Mode) String() string { return enumString(modeNames, int(m), "Mode") }

// ParseMode reads "full", "lora", "qlora" or "infer".
func ParseMode(s string) (Mode, error) {
	i, err := parseEnum("mode", modeNames, s)
	return Mode(i), err
}

func (m Mode) training() bool { return m != Infer }

// Precision is how parameters are stored and computed.
type Precision int

// Precisions. DefaultPrecision is the mode's usual one: fp32 for full
// training and LoRA (PyTorch's default dtype), amp-bf16 for QLoRA's
// compute, fp16 for inference.
const (
	DefaultPrecision Precision = iota
	FP32                       // everything in fp32
	AMPBF16                    // mixed precision: fp32 master weights and optimizer state, bf16 compute copies, gradients and activations
	AMPFP16                    // the same with fp16
	BF16                       // everything in bf16, optimizer state included
	FP16                       // everything in fp16
	Int8                       // inference: int8 linear weights with per-row scales, fp16 compute
	Int4                       // inference: 4-bit NF4 linear weights with block scales, fp16 compute
)

var precisionNames = []string{"default", "fp32", "amp-bf16", "amp-fp16", "bf16", "fp16", "int8", "int4"}

// String names the precision.
func (p Precision) String() string { return enumString(precisionNames, int(p), "Precision") }

// ParsePrecision reads fp32, amp-bf16, amp-fp16, bf16, fp16, int8 or int4.
func ParsePrecision(s string) (Precision, error) {
	i, err := parseEnum("precision", precisionNames[1:], s)
	return Precision(i + 1), err
}

func (p Precision) amp() bool { return p == AMPBF16 || p == AMPFP16 }

// Optimizer is the training optimizer.
type Optimizer int

// Optimizers.
const (
	AdamW       Optimizer = iota // two states per parameter (exp_avg, exp_avg_sq)
	Adam                         // the same memory as AdamW
	SGD                          // no state
	Momentum                     // SGD with momentum: one state
	Adam8bit                     // bitsandbytes 8-bit Adam: two 1-byte states plus block scales
	Adafactor                    // factored second moment: rows + columns per matrix, no first moment
	NoOptimizer                  // forward and backward only: gradients are kept, nothing is updated
)

var optimizerNames = []string{"adamw", "adam", "sgd", "momentum", "adam8bit", "adafactor", "none"}

// String names the optimizer.
func (o Optimizer) String() string { return enumString(optimizerNames, int(o), "Optimizer") }

// ParseOptimizer reads adam, adamw, sgd, momentum, adam8bit, adafactor or
// none.
func ParseOptimizer(s string) (Optimizer, error) {
	i, err := parseEnum("optimizer", optimizerNames, s)
	return Optimizer(i), err
}

// OptimizerImpl is how the optimizer's step runs over the parameters,
// which decides its temporaries.
type OptimizerImpl int

// Optimizer implementations.
const (
	// Foreach is PyTorch's multi-tensor implementation, the default on
	// CUDA. Adam and AdamW (PyTorch 2.1 and later) allocate one
	// parameter-sized list of temporaries (the square root of exp_avg_sq)
	// for the whole step; SGD and momentum none.
	Foreach OptimizerImpl = iota
	// Fused is fused=True: one kernel per group, no temporaries.
	Fused
	// SingleTensor is foreach=False: a loop over parameters; Adam's
	// temporaries are two tensors of one parameter at a time.
	SingleTensor
	// Foreach113 is the multi-tensor Adam of PyTorch 1.13 and 2.0, which
	// allocated two parameter-sized lists (the square root, then the
	// denominator).
	Foreach113
)

var implNames = []string{"foreach", "fused", "single-tensor", "foreach-1.13"}

// String names the implementation.
func (o OptimizerImpl) String() string { return enumString(implNames, int(o), "OptimizerImpl") }

// ParseOptimizerImpl reads foreach, fused, single-tensor or foreach-1.13.
func ParseOptimizerImpl(s string) (OptimizerImpl, error) {
	i, err := parseEnum("optimizer implementation", implNames, s)
	return OptimizerImpl(i), err
}

// Attention is how attention is computed.
type Attention int

// Attention implementations.
const (
	// Flash is a fused scaled-dot-product kernel (FlashAttention or the
	// memory-efficient kernel, as torch's scaled_dot_product_attention
	// picks): nothing of size batch × heads × seq² is kept.
	Flash Attention = iota
	// Eager is matmul, softmax and matmul: the scores and probabilities
	// of batch × heads × seq² are kept for backward.
	Eager
)

var attentionNames = []string{"flash", "eager"}

// String names the attention.
func (a Attention) String() string { return enumString(attentionNames, int(a), "Attention") }

// ParseAttention reads "flash" (or "sdpa") or "eager".
func ParseAttention(s string) (Attention, error) {
	if strings.EqualFold(strings.TrimSpace(s), "sdpa") {
		return Flash, nil
	}
	i, err := parseEnum("attention", attentionNames, s)
	return Attention(i), err
}

// Shard is how the training state is divided among the GPUs.
type Shard int

// Sharding strategies.
const (
	NoShard Shard = iota // every GPU holds everything (DDP when GPUs > 1)
	ZeRO1                // optimizer state sharded
	ZeRO2                // optimizer state and gradients sharded
	ZeRO3                // parameters too, gathered one layer at a time
	FSDP                 // PyTorch FSDP full sharding: as ZeRO-3
)

var shardNames = []string{"none", "zero1", "zero2", "zero3", "fsdp"}

// String names the strategy.
func (s Shard) String() string { return enumString(shardNames, int(s), "Shard") }

// ParseShard reads none, zero1, zero2, zero3 or fsdp.
func ParseShard(s string) (Shard, error) {
	i, err := parseEnum("shard", shardNames, s)
	return Shard(i), err
}

func (s Shard) params() bool { return s >= ZeRO3 }
func (s Shard) grads() bool  { return s >= ZeRO2 }
func (s Shard) states() bool { return s >= ZeRO1 }

// Offload is what is kept in host memory instead of on the GPU.
type Offload int

// Offload choices.
const (
	NoOffload        Offload = iota
	OffloadOptimizer         // optimizer state (and fp32 master weights) on the host; the step runs there
	// OffloadParams keeps the weights on the host, streamed to the GPU one
	// layer at a time; in training their gradients go to the host too, and
	// so, as with FSDP's CPU offload, do the optimizer state and step.
	OffloadParams
	OffloadAll // both: in training the same as OffloadParams
)

var offloadNames = []string{"none", "optimizer", "params", "all"}

// String names the choice.
func (o Offload) String() string { return enumString(offloadNames, int(o), "Offload") }

// ParseOffload reads none, optimizer, params or all.
func ParseOffload(s string) (Offload, error) {
	i, err := parseEnum("offload", offloadNames, s)
	return Offload(i), err
}

func (o Offload) optimizer() bool { return o != NoOffload } // in training; see OffloadParams
func (o Offload) params() bool    { return o == OffloadParams || o == OffloadAll }

// LoRA target names; "all" means every linear layer of the blocks.
var loraTargetNames = []string{"q", "k", "v", "o", "gate", "up", "down", "all"}

// Workload is what is done with the model. The zero value is full fp32
// training with AdamW (foreach), batch 1, on one GPU.
type Workload struct {
	Mode          Mode
	Precision     Precision
	Optimizer     Optimizer
	OptimizerImpl OptimizerImpl

	Batch int // sequences per step; 0 means 1
	Seq   int // tokens per sequence (the context in inference); 0 means 512 or the model's positions if fewer
	// Generate is, in inference, the tokens decoded one at a time after
	// the prefill of Seq tokens; the key/value cache holds Seq + Generate.
	Generate int

	LoRARank    int      // 0 means 8
	LoRATargets []string // of q, k, v, o, gate, up, down, all; empty means q and v
	// Checkpointing is activation checkpointing: 0 off, 1 every layer
	// (only each layer's input is kept; the layer is recomputed in
	// backward), k > 1 every k-th layer.
	Checkpointing int
	Attention     Attention

	GPUs    int // 0 means 1
	Shard   Shard
	Offload Offload

	// LossOnly says the training loop keeps only the loss of the model's
	// outputs (loss = model(x).loss, as the Hugging Face Trainer does), so
	// that the logits and the returned cache are freed before backward.
	// By default the loop holds the whole output (outputs = model(x))
	// through backward, until the next step's forward replaces it.
	LossOnly bool
}

// Normalize fills the defaults that depend on nothing else.
func (w *Workload) Normalize() {
	if w.Precision == DefaultPrecision {
		switch w.Mode {
		case Infer:
			w.Precision = FP16
		case QLoRA:
			w.Precision = AMPBF16
		default:
			w.Precision = FP32
		}
	}
	if w.Batch == 0 {
		w.Batch = 1
	}
	if w.Seq == 0 {
		w.Seq = 512
	}
	if w.GPUs == 0 {
		w.GPUs = 1
	}
	if w.LoRARank == 0 {
		w.LoRARank = 8
	}
	if len(w.LoRATargets) == 0 {
		w.LoRATargets = []string{"q", "v"}
	}
}

// Validate checks the workload. The error is one line.
func (w *Workload) Validate() error {
	var errs []string
	bad := func(format string, args ...any) { errs = append(errs, fmt.Sprintf(format, args...)) }
	if w.Mode < Full || w.Mode > Infer {
		bad("unknown mode %d", int(w.Mode))
	}
	switch {
	case w.Precision < DefaultPrecision || w.Precision > Int4:
		bad("unknown precision %d", int(w.Precision))
	case w.Mode == Infer && w.Precision.amp():
		bad("%s is a training precision; for inference use fp32, bf16, fp16, int8 or int4", w.Precision)
	case w.Mode == QLoRA && (w.Precision == Int8 || w.Precision == Int4):
		bad("qlora keeps its base in 4-bit NF4; --precision is its compute type: fp32, amp-bf16, amp-fp16, bf16 or fp16")
	case w.Mode.training() && w.Mode != QLoRA && (w.Precision == Int8 || w.Precision == Int4):
		bad("%s weights are for --mode infer (4-bit fine-tuning is --mode qlora)", w.Precision)
	}
	if w.Optimizer < AdamW || w.Optimizer > NoOptimizer {
		bad("unknown optimizer %d", int(w.Optimizer))
	}
	if w.OptimizerImpl < Foreach || w.OptimizerImpl > Foreach113 {
		bad("unknown optimizer implementation %d", int(w.OptimizerImpl))
	}
	if w.Batch < 1 || w.Batch > MaxBatch {
		bad("batch must be 1..%d, got %d", MaxBatch, w.Batch)
	}
	if w.Seq < 1 || w.Seq > MaxSequence {
		bad("seq must be 1..%d, got %d", MaxSequence, w.Seq)
	}
	if w.Generate < 0 || w.Generate > MaxSequence {
		bad("generate must be 0..%d, got %d", MaxSequence, w.Generate)
	} else if w.Generate > 0 && w.Mode != Infer {
		bad("generate applies to --mode infer")
	}
	if w.LoRARank < 1 || w.LoRARank > 1<<16 {
		bad("lora rank must be 1..%d, got %d", 1<<16, w.LoRARank)
	}
	for _, t := range w.LoRATargets {
		if !contains(loraTargetNames, t) {
			bad("unknown LoRA target %s (want %s)", quote.Quote(t), strings.Join(loraTargetNames, ", "))
		}
	}
	if w.Checkpointing < 0 || w.Checkpointing > MaxLayers {
		bad("checkpointing must be 0 (off), 1 (every layer) or k (every k-th layer) up to %d, got %d", MaxLayers, w.Checkpointing)
	} else if w.Checkpointing > 0 && w.Mode == Infer {
		bad("checkpointing applies to training")
	}
	if w.Attention < Flash || w.Attention > Eager {
		bad("unknown attention %d", int(w.Attention))
	}
	if w.GPUs < 1 || w.GPUs > 1<<16 {
		bad("gpus must be 1..%d, got %d", 1<<16, w.GPUs)
	}
	if w.Shard < NoShard || w.Shard > FSDP {
		bad("unknown shard %d", int(w.Shard))
	}
	if w.Offload < NoOffload || w.Offload > OffloadAll {
		bad("unknown offload %d", int(w.Offload))
	} else if w.Mode == Infer && w.Offload == OffloadOptimizer {
		bad("inference has no optimizer to offload (use --offload params)")
	}
	if len(errs) > 0 {
		return fmt.Errorf("invalid workload: %s", strings.Join(errs, "; "))
	}
	return nil
}

func contains(names []string, s string) bool {
	for _, n := range names {
		if strings.EqualFold(n, s) {
			return true
		}
	}
	return false
}

// actBytes is the element size of activations.
func (w *Workload) actBytes() uint64 {
	if w.Precision == FP32 {
		return 4
	}
	return 2
}

// trainBytes are a trainable parameter's bytes: stored weights (the fp32
// master and the half compute copy under AMP), gradient, one optimizer
// state element.
func (w *Workload) trainBytes() (master, half, grad, state uint64) {
	switch {
	case w.Precision == FP32:
		return 4, 0, 4, 4
	case w.Precision.amp():
		return 4, 2, 2, 4
	}
	return 2, 0, 2, 2
}
