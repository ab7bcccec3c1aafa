// This file holds `gpumem estimate`: will this model fit on this card,
// and if not, what to change.

package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"github.com/gpumem/gpumem/estimate"
	"github.com/gpumem/gpumem/stats"
)

const estimateSynopsis = `(--model NAME | --config config.json | --params 7B | --layers N --hidden N ...) [flags]

The model comes from a preset, a Hugging Face config.json, a bare parameter
count (parameter state only), or dimension flags (which also override a
preset or config). Sizes accept 80GiB, 24GB or bytes; counts 7e9, 7B or 1.3B.`

// estimateFlags are the command's flags, read into a plan.
type estimateFlags struct {
	fs                                *flagSet
	model, config, params, family     string
	layers, hidden, heads, kvHeads    int
	intermediate, vocab, headDim      int
	mode, precision, optimizer, impl  string
	attention, activation, softmax    string
	batch, seq, generate, loraRank    int
	loraTargets, shard, offload, card string
	dropout                           float64
	checkpointing                     ckptFlag
	gpus                              int
	capacity                          sizeFlag
	overhead                          overheadFlag
	conf                              string
	maxBatch, maxSeq, asJSON, loss    bool
}

func newEstimateFlags(stderr io.Writer) *estimateFlags {
	f := &estimateFlags{fs: newFlags("estimate", estimateSynopsis, stderr)}
	fs := f.fs
	fs.StringVar(&f.model, "model", "", "a preset: "+strings.Join(estimate.Presets(), ", "))
	fs.StringVar(&f.config, "config", "", "a Hugging Face config.json (llama, mistral, qwen2, gpt2, bert)")
	fs.StringVar(&f.params, "params", "", "a bare parameter count (7e9, 7B, 1.3B): parameter state only")
	fs.StringVar(&f.family, "family", "", "with dimension flags alone: gpt2, bert or llama (default gpt2)")
	fs.IntVar(&f.layers, "layers", 0, "transformer blocks")
	fs.IntVar(&f.hidden, "hidden", 0, "model width")
	fs.IntVar(&f.heads, "heads", 0, "attention heads (default hidden/64)")
	fs.IntVar(&f.kvHeads, "kv-heads", 0, "key/value heads for grouped-query attention (default heads)")
	fs.IntVar(&f.intermediate, "intermediate", 0, "MLP width (default 4 × hidden; Llama 8/3 × hidden)")
	fs.IntVar(&f.vocab, "vocab", 0, "vocabulary (default 50257)")
	fs.IntVar(&f.headDim, "head-dim", 0, "per-head width (default hidden/heads)")
	fs.StringVar(&f.mode, "mode", "full", "full, lora, qlora or infer")
	fs.StringVar(&f.precision, "precision", "", "fp32, amp-bf16, amp-fp16, bf16, fp16, int8 or int4 (default fp32 for full and lora, amp-bf16 for qlora, fp16 for infer)")
	fs.StringVar(&f.optimizer, "optimizer", "adamw", "adam, adamw, sgd, momentum, adam8bit, adafactor or none (forward and backward only)")
	fs.StringVar(&f.impl, "optimizer-impl", "foreach", "foreach (PyTorch's CUDA default: Adam keeps a parameter-sized list of temporaries), fused (none), single-tensor, or foreach-1.13 (two lists)")
	fs.IntVar(&f.batch, "batch", 1, "sequences per step (per GPU)")
	fs.IntVar(&f.seq, "seq", 0, "tokens per sequence; in inference the prompt (default 512, or fewer positions)")
	fs.IntVar(&f.generate, "generate", 0, "inference: tokens decoded after the prompt, one at a time")
	fs.IntVar(&f.loraRank, "lora-rank", 8, "LoRA rank")
	fs.StringVar(&f.loraTargets, "lora-targets", "q,v", "LoRA targets: q, k, v, o, gate, up, down or all, comma-separated")
	fs.Var(&f.checkpointing, "checkpointing", "activation checkpointing: every layer, or --checkpointing=K for every K-th")
	fs.StringVar(&f.attention, "attention", "flash", "flash (fused scaled_dot_product_attention: no seq² tensors kept) or eager")
	fs.Float64Var(&f.dropout, "dropout", -1, "dropout probability in training (default the model's)")
	fs.StringVar(&f.activation, "activation", "", "MLP activation: gelu, gelu-tanh-explicit (GPT-2's gelu_new), silu, silu-explicit, relu (default the model's)")
	fs.StringVar(&f.softmax, "softmax", "", "eager attention's softmax: fused or explicit (exp/sum written out)")
	fs.IntVar(&f.gpus, "gpus", 1, "GPUs (data parallel; with --shard, the state is divided among them)")
	fs.StringVar(&f.shard, "shard", "none", "none, zero1, zero2, zero3 or fsdp")
	fs.StringVar(&f.offload, "offload", "none", "none, optimizer, params or all: kept in host memory")
	fs.StringVar(&f.card, "card", "", "a card: "+strings.Join(estimate.CardNames(), ", "))
	fs.Var(&f.capacity, "capacity", "one GPU's memory instead of --card (default 80GiB)")
	fs.Var(&f.overhead, "overhead", "per-process memory outside the allocator: the CUDA context (default 512MiB)")
	fs.StringVar(&f.conf, "conf", "", "allocator configuration, PYTORCH_CUDA_ALLOC_CONF syntax (default: "+envOrder+")")
	fs.BoolVar(&f.loss, "loss-only", false, "the training loop keeps only the loss (loss = model(x).loss, as the Hugging Face Trainer), not the whole output, through backward")
	fs.BoolVar(&f.maxBatch, "max-batch", false, "also search the largest batch that fits")
	fs.BoolVar(&f.maxSeq, "max-seq", false, "also search the longest sequence that fits")
	fs.BoolVar(&f.asJSON, "json", false, "print one JSON object")
	return f
}

func runEstimate(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	f := newEstimateFlags(stderr)
	fs := f.fs
	usage := fs.Usage
	fs.Usage = func() {}
	fs.SetOutput(io.Discard) // one-line errors; --help prints the usage below
	if err := parseFlags(fs, args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fs.SetOutput(stderr)
			usage()
		}
		return err
	}
	if fs.NArg() > 0 {
		msg := fmt.Sprintf("unexpected argument %q", fs.Arg(0))
		if _, err := strconv.Atoi(fs.Arg(0)); err == nil {
			msg += " (a value of --checkpointing is written --checkpointing=K)"
		}
		return usageError{msg}
	}
	pl, err := f.plan()
	if err != nil {
		return usageError{err.Error()}
	}
	if err := pl.Normalize(); err != nil {
		return usageError{err.Error()}
	}
	if (f.maxBatch || f.maxSeq) && pl.Model == nil {
		return usageError{"--max-batch and --max-seq need the model's dimensions (--model, --config or --layers and --hidden), not a bare --params"}
	}
	fs.begin()
	var lines io.Writer
	if f.maxBatch || f.maxSeq {
		lines = lineOutput(stderr)
	}
	stop := startProgress(lines, "gpumem estimate", func() string { return "searching the largest batch or sequence that fits" })
	rep, err := newReport(ctx, pl, f.card, f.maxBatch, f.maxSeq)
	stop()
	if err != nil {
		return err
	}
	rep.quoteName = f.config != ""
	var buf bytes.Buffer
	if f.asJSON {
		err = rep.writeJSON(&buf)
	} else {
		rep.writeText(&buf)
	}
	if err != nil {
		return err
	}
	if _, err := stdout.Write(buf.Bytes()); err != nil {
		return fmt.Errorf("writing the estimate: %v", err)
	}
	return nil
}

// plan turns the flags into a plan.
func (f *estimateFlags) plan() (estimate.Plan, error) {
	var pl estimate.Plan
	set := map[string]bool{}
	f.fs.Visit(func(fl *flag.Flag) { set[fl.Name] = true })
	dims := false
	for _, n := range []string{"layers", "hidden", "heads", "kv-heads", "intermediate", "vocab", "head-dim"} {
		dims = dims || set[n]
	}
	sources := 0
	for _, n := range []string{"model", "config", "params"} {
		if set[n] {
			sources++
		}
	}
	switch {
	case sources > 1:
		return pl, errors.New("give one of --model, --config and --params")
	case set["params"] && dims:
		return pl, errors.New("--params is a bare count; it does not combine with dimension flags")
	case sources == 0 && !dims:
		return pl, errors.New("no model: give --model NAME, --config config.json, --params 7B or --layers and --hidden")
	case set["family"] && sources > 0:
		return pl, errors.New("--family applies to a model given by dimension flags alone")
	}
	var m *estimate.Model
	switch {
	case set["model"]:
		p, err := estimate.Preset(f.model)
		if err != nil {
			return pl, err
		}
		m = &p
	case set["config"]:
		data, err := readConfigFile(f.config)
		if err != nil {
			return pl, err
		}
		p, err := estimate.ParseConfig(data)
		if err != nil {
			return pl, err
		}
		m = &p
	case set["params"]:
		n, err := estimate.ParseCount(f.params)
		if err != nil {
			return pl, err
		}
		pl.Params = n
	default:
		fam := estimate.GPT2
		if set["family"] {
			var err error
			if fam, err = estimate.ParseFamily(f.family); err != nil {
				return pl, err
			}
		}
		if !set["layers"] || !set["hidden"] {
			return pl, errors.New("dimension flags alone need at least --layers and --hidden")
		}
		g := estimate.Generic(fam)
		m = &g
	}
	if m != nil {
		if err := f.applyDims(m, set); err != nil {
			return pl, err
		}
		pl.Model = m
	}
	if err := f.workload(&pl.Workload, set); err != nil {
		return pl, err
	}
	if err := f.device(&pl, set); err != nil {
		return pl, err
	}
	return pl, nil
}

// applyDims sets the dimension flags (and the other model flags) on m.
func (f *estimateFlags) applyDims(m *estimate.Model, set map[string]bool) error {
	for _, d := range []struct {
		name string
		v    int
		dst  *int
	}{{"layers", f.layers, &m.Layers}, {"hidden", f.hidden, &m.Hidden}, {"heads", f.heads, &m.Heads},
		{"kv-heads", f.kvHeads, &m.KVHeads}, {"intermediate", f.intermediate, &m.Intermediate},
		{"vocab", f.vocab, &m.Vocab}, {"head-dim", f.headDim, &m.HeadDim}} {
		if !set[d.name] {
			continue
		}
		if d.v < 1 {
			return fmt.Errorf("--%s must be at least 1, got %d", d.name, d.v)
		}
		*d.dst = d.v
	}
	if set["hidden"] && !set["heads"] && m.Heads == 0 {
		if m.Hidden%64 != 0 {
			return fmt.Errorf("give --heads: hidden %d is not a multiple of 64", m.Hidden)
		}
		m.Heads = m.Hidden / 64
	}
	if set["dropout"] {
		m.Dropout = f.dropout
	}
	if set["activation"] {
		a, err := estimate.ParseActivation(f.activation)
		if err != nil {
			return err
		}
		m.Activation = a
	}
	if set["softmax"] {
		s, err := estimate.ParseSoftmax(f.softmax)
		if err != nil {
			return err
		}
		m.Softmax = s
	}
	m.Normalize()
	return m.Validate()
}

// workload reads the workload flags.
func (f *estimateFlags) workload(w *estimate.Workload, set map[string]bool) error {
	var err error
	if w.Mode, err = estimate.ParseMode(f.mode); err != nil {
		return err
	}
	if set["precision"] {
		if w.Precision, err = estimate.ParsePrecision(f.precision); err != nil {
			return err
		}
	}
	if w.Optimizer, err = estimate.ParseOptimizer(f.optimizer); err != nil {
		return err
	}
	if w.OptimizerImpl, err = estimate.ParseOptimizerImpl(f.impl); err != nil {
		return err
	}
	if w.Attention, err = estimate.ParseAttention(f.attention); err != nil {
		return err
	}
	if w.Shard, err = estimate.ParseShard(f.shard); err != nil {
		return err
	}
	if w.Offload, err = estimate.ParseOffload(f.offload); err != nil {
		return err
	}
	if w.Mode == estimate.Infer {
		for _, n := range []string{"optimizer", "optimizer-impl", "lora-rank", "lora-targets", "dropout", "loss-only"} {
			if set[n] {
				return fmt.Errorf("--%s applies to training, not --mode infer", n)
			}
		}
	}
	if w.Mode != estimate.LoRA && w.Mode != estimate.QLoRA && (set["lora-rank"] || set["lora-targets"]) {
		return errors.New("--lora-rank and --lora-targets apply to --mode lora and qlora")
	}
	if set["dropout"] && !(f.dropout >= 0 && f.dropout < 1) {
		return fmt.Errorf("--dropout must be in [0, 1), got %g", f.dropout)
	}
	for _, n := range []struct {
		name string
		v    int
		dst  *int
	}{{"batch", f.batch, &w.Batch}, {"seq", f.seq, &w.Seq}, {"lora-rank", f.loraRank, &w.LoRARank}, {"gpus", f.gpus, &w.GPUs}} {
		if n.v < 1 && (set[n.name] || n.name != "seq") {
			return fmt.Errorf("--%s must be at least 1, got %d", n.name, n.v)
		}
		*n.dst = n.v
	}
	if f.generate < 0 {
		return fmt.Errorf("--generate must be at least 0, got %d", f.generate)
	}
	w.Generate = f.generate
	w.LossOnly = f.loss
	w.Checkpointing = f.checkpointing.k
	for _, t := range strings.Split(f.loraTargets, ",") {
		if t = strings.TrimSpace(t); t != "" {
			w.LoRATargets = append(w.LoRATargets, strings.ToLower(t))
		}
	}
	if set["shard"] && w.Shard != estimate.NoShard && w.GPUs < 2 {
		return fmt.Errorf("--shard %s divides the state among GPUs: give --gpus 2 or more", w.Shard)
	}
	return nil
}

// device reads the card, capacity, overhead and allocator configuration.
func (f *estimateFlags) device(pl *estimate.Plan, set map[string]bool) error {
	switch {
	case set["card"] && set["capacity"]:
		return errors.New("give --card or --capacity, not both")
	case set["card"]:
		c, err := estimate.LookupCard(f.card)
		if err != nil {
			return err
		}
		pl.Capacity = c.Memory
	case set["capacity"]:
		pl.Capacity = f.capacity.n
	default:
		pl.Capacity = 80 << 30
	}
	if pl.Capacity > estimate.MaxDevice {
		return fmt.Errorf("--capacity must be at most 8TiB, got %s", f.capacity.String())
	}
	pl.Context = 0
	if set["overhead"] {
		if f.overhead.n > maxOverhead {
			return fmt.Errorf("--overhead must be at most 1PiB, got %s", quote(f.overhead.arg))
		}
		pl.Context = -1
		if f.overhead.n > 0 {
			pl.Context = int64(f.overhead.n)
		}
	}
	var err error
	pl.Alloc, _, err = resolveConf(f.fs, f.conf)
	return err
}

// ckptFlag is --checkpointing: a bool (every layer) or a number (every
// k-th layer; 0 is off).
type ckptFlag struct{ k int }

func (c *ckptFlag) IsBoolFlag() bool { return true }

func (c *ckptFlag) String() string {
	if c == nil || c.k == 0 {
		return "false"
	}
	return strconv.Itoa(c.k)
}

func (c *ckptFlag) Set(s string) error {
	switch strings.ToLower(s) {
	case "true", "every", "all":
		c.k = 1
		return nil
	case "false", "off", "none":
		c.k = 0
		return nil
	}
	k, err := strconv.Atoi(s)
	if err != nil || k < 0 || k > estimate.MaxLayers {
		return fmt.Errorf("want true, false or K (every K-th layer, 1..%d)", estimate.MaxLayers)
	}
	c.k = k
	return nil
}

// maxOverhead is the largest --overhead: 1 PiB, already far beyond any
// device (a larger value was silently cut to it).
const maxOverhead = 1 << 50

// overheadFlag is a byte size that may be zero.
type overheadFlag struct {
	n   uint64
	arg string // as given, for messages
}

func (o *overheadFlag) String() string {
	if o == nil {
		return ""
	}
	return strconv.FormatUint(o.n, 10)
}

func (o *overheadFlag) Set(s string) error {
	n, err := parseSize(s)
	if err != nil {
		return err
	}
	o.n, o.arg = n, s
	return nil
}

// maxConfigFile bounds the config.json that estimate --config reads: a
// model's config.json is a few kilobytes (a few hundred with a large
// id2label), and the file is read whole.
const maxConfigFile = 4 << 20

// readConfigFile reads the config.json at path, refusing one larger than
// maxConfigFile (a device such as /dev/zero was read until the runtime
// died) and anything that is not a file.
func readConfigFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("config: %w", fileError(err))
	}
	defer f.Close()
	if info, err := f.Stat(); err == nil && info.IsDir() {
		return nil, fmt.Errorf("config: %s is a directory", quote(path))
	}
	data, err := io.ReadAll(io.LimitReader(f, maxConfigFile+1))
	if err != nil {
		return nil, fmt.Errorf("config: reading %s: %w", quote(path), fileError(err))
	}
	if len(data) > maxConfigFile {
		return nil, fmt.Errorf("config: %s is larger than %d MiB, the limit of a config.json", quote(path), maxConfigFile>>20)
	}
	return data, nil
}

func size(n int64) string {
	if n < 0 {
		return "-" + stats.FormatSize(uint64(-n))
	}
	return stats.FormatSize(uint64(n))
}
