package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func num(t *testing.T, res map[string]any, key string) float64 {
	t.Helper()
	v, ok := res[key].(float64)
	require.True(t, ok, "%s is %v", key, res[key])
	return v
}

func TestEstimateJSONContract(t *testing.T) {
	res := runJSON(t, "estimate", "--model", "gpt2", "--batch", "2", "--seq", "256", "--card", "rtx4090-24g", "--max-batch", "--max-seq")
	for _, k := range []string{"parameters", "weights_bytes", "gradients_bytes", "optimizer_bytes", "activations_bytes",
		"kv_cache_bytes", "overhead_bytes", "total_bytes", "host_bytes", "peak_allocated_bytes", "peak_reserved_bytes",
		"fits", "max_batch", "max_seq", "phases", "remedies", "need_bytes", "min_capacity_bytes", "fragmentation"} {
		assert.Contains(t, res, k)
	}
	assert.EqualValues(t, 124439808, res["parameters"])
	assert.Equal(t, true, res["fits"])
	assert.Greater(t, num(t, res, "max_batch"), 2.0)
	assert.EqualValues(t, 1024, res["max_seq"])
	assert.EqualValues(t, 24<<30, res["capacity_bytes"])
	assert.Greater(t, num(t, res, "peak_reserved_bytes"), num(t, res, "peak_allocated_bytes")*0.99)
	res = runJSON(t, "estimate", "--model", "gpt2")
	assert.NotContains(t, res, "max_batch", "only when asked")
}

// The guide's figures through the command line.
func TestEstimateGuideFigures(t *testing.T) {
	res := runJSON(t, "estimate", "--params", "7B", "--mode", "full", "--precision", "amp-bf16", "--optimizer", "adamw")
	state := num(t, res, "weights_bytes") + num(t, res, "gradients_bytes") + num(t, res, "optimizer_bytes")
	assert.Equal(t, 112e9, state, "16 bytes per parameter")
	assert.Equal(t, false, res["fits"], "112 GB does not fit 80 GiB")
	assert.Equal(t, false, res["activations_counted"])

	for prec, want := range map[string][2]float64{"": {14e9, 14e9}, "int8": {7e9, 7.01e9}, "int4": {3.5e9, 3.7e9}} {
		args := []string{"--params", "7B", "--mode", "infer"}
		if prec != "" {
			args = append(args, "--precision", prec)
		}
		w := num(t, runJSON(t, "estimate", args...), "weights_bytes")
		assert.True(t, w >= want[0] && w <= want[1], "7B %s: %g bytes of weights", prec, w)
	}

	res = runJSON(t, "estimate", "--layers", "24", "--hidden", "2048", "--mode", "lora", "--lora-rank", "8", "--batch", "4",
		"--seq", "512", "--precision", "amp-fp16", "--card", "rtx3060-12g")
	tot := num(t, res, "total_bytes")
	assert.True(t, tot >= 6e9 && tot <= 9e9, "1.3B LoRA needs %g bytes", tot)
	assert.Equal(t, true, res["fits"])
}

func TestEstimateText(t *testing.T) {
	out, errOut, code := runCmd(t, "estimate", "--model", "llama-7b", "--precision", "amp-bf16", "--batch", "4", "--seq", "2048", "--card", "a100-80g")
	require.Equal(t, 0, code, errOut)
	for _, s := range []string{"llama-7b: 32 layers", "optimizer state", "peak allocated", "peak reserved", "does not fit on a100-80g",
		"remedies that make it fit, cheapest first", "--mode qlora", "--offload optimizer", "--shard fsdp",
		"combined: checkpoint every layer's activations, 8-bit Adam (--checkpointing --optimizer adam8bit)"} {
		assert.Contains(t, out, s)
	}
	out, errOut, code = runCmd(t, "estimate", "--model", "tinyllama-1.1b", "--mode", "infer", "--batch", "8", "--seq", "1024",
		"--generate", "32", "--card", "l4-24g", "--max-batch")
	require.Equal(t, 0, code, errOut)
	assert.Contains(t, out, "fits on l4-24g")
	assert.Contains(t, out, "key/value cache")
	assert.Regexp(t, `largest batch that fits: \d+`, out)
	out, errOut, code = runCmd(t, "estimate", "--params", "7B")
	require.Equal(t, 0, code, errOut)
	assert.Contains(t, out, "activations need the model's dimensions")
}

// min_capacity_bytes is what the plan needs: a bisection over --capacity
// agrees with it (the run at it fits, the run 2 MiB below does not), fits
// is min_capacity_bytes <= capacity_bytes, and each remedy, applied with
// its flags, fits with the need it was listed with. The 7B example needed
// 135.52 GiB (the peak reserved on a roomy device) although it runs on
// 130 GiB.
func TestEstimateMinCapacity(t *testing.T) {
	plan := []string{"--model", "llama-7b", "--precision", "amp-bf16", "--batch", "4"}
	res := runJSON(t, "estimate", append(plan, "--card", "a100-80g")...)
	minCap := num(t, res, "min_capacity_bytes")
	assert.Equal(t, minCap, num(t, res, "need_bytes"))
	assert.Equal(t, false, res["fits"])
	assert.LessOrEqual(t, minCap, float64(130<<30))
	for _, c := range []float64{minCap - 2<<20, minCap, minCap + 2<<20} {
		at := runJSON(t, "estimate", append(plan, "--capacity", strconv.FormatFloat(c, 'f', 0, 64))...)
		assert.Equal(t, minCap, num(t, at, "min_capacity_bytes"))
		assert.Equal(t, c >= minCap, at["fits"], "on %.0f bytes", c)
		assert.Equal(t, c < minCap, at["oom"], "on %.0f bytes", c)
	}
	out, errOut, code := runCmd(t, append([]string{"estimate", "--capacity", "130GiB"}, plan...)...)
	require.Equal(t, 0, code, errOut)
	assert.Contains(t, out, "fits on 130.00 GiB device: needs 129.53 GiB")

	remedies, ok := res["remedies"].([]any)
	require.True(t, ok && len(remedies) > 0, "%v", res["remedies"])
	for _, x := range remedies {
		m := x.(map[string]any)
		args := append(append([]string{}, plan...), "--card", "a100-80g")
		args = append(args, strings.Fields(m["change"].(string))...)
		got := runJSON(t, "estimate", args...)
		assert.Equal(t, true, got["fits"], "%v", m)
		assert.Equal(t, m["need_bytes"], got["min_capacity_bytes"], "%v", m)
		assert.NotContains(t, m, "fits")
	}
}

// A plan that no simulated device runs says so, with min_capacity_bytes 0;
// one that nothing makes fit says that too, and lists no remedy.
func TestEstimateBeyondEveryDevice(t *testing.T) {
	plan := []string{"--model", "llama-70b", "--batch", "64", "--seq", "4096", "--attention", "eager", "--capacity", "8GiB"}
	out, errOut, code := runCmd(t, append([]string{"estimate"}, plan...)...)
	require.Equal(t, 0, code, errOut)
	assert.Contains(t, out, "needs more than the largest simulated device")
	assert.Contains(t, out, "no remedy here makes it fit")
	res := runJSON(t, "estimate", plan...)
	assert.EqualValues(t, 0, res["min_capacity_bytes"])
	assert.Equal(t, false, res["fits"])
	assert.Empty(t, res["remedies"])
}

// A search in which everything is too big answers none, not an error.
func TestEstimateSearchTooBig(t *testing.T) {
	res := runJSON(t, "estimate", "--model", "llama-70b", "--card", "rtx3060-12g", "--max-batch", "--max-seq")
	assert.EqualValues(t, 0, res["max_batch"])
	assert.EqualValues(t, 0, res["max_seq"])
	assert.Equal(t, false, res["fits"])
	out, _, code := runCmd(t, "estimate", "--model", "llama-70b", "--card", "rtx3060-12g", "--max-batch")
	assert.Equal(t, 0, code)
	assert.Contains(t, out, "largest batch that fits: none")
}

func TestEstimateConfigFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "config.json")
	require.NoError(t, os.WriteFile(path, []byte(`{"model_type": "mistral", "hidden_size": 4096, "intermediate_size": 14336,
		"num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 32000}`), 0o644))
	res := runJSON(t, "estimate", "--config", path, "--mode", "qlora", "--batch", "2", "--seq", "1024", "--checkpointing")
	assert.EqualValues(t, 7241732096, res["parameters"])
	assert.Equal(t, "amp-bf16", res["precision"])
	assert.EqualValues(t, 1, res["checkpointing"])
	res = runJSON(t, "estimate", "--config", path, "--layers", "2", "--checkpointing=2", "--gpus", "4", "--shard", "zero3", "--offload", "optimizer")
	assert.Less(t, num(t, res, "parameters"), 1e9, "--layers overrides the config")
	assert.EqualValues(t, 2, res["checkpointing"])
	assert.Greater(t, num(t, res, "host_bytes"), 0.0)
}

func TestEstimateBadInput(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.json")
	require.NoError(t, os.WriteFile(bad, []byte(`{"model_type": "llama", "num_hidden_layers": -3}`), 0o644))
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{}, "no model"},
		{[]string{"--model", "gpt5"}, `unknown model "gpt5"`},
		{[]string{"--model", "gpt2", "--params", "7B"}, "one of --model, --config and --params"},
		{[]string{"--params", "7B", "--layers", "2"}, "does not combine"},
		{[]string{"--params", "seven"}, "bad parameter count"},
		{[]string{"--params", "0"}, "must be 1.."},
		{[]string{"--config", filepath.Join(dir, "missing.json")}, "no such file"},
		{[]string{"--config", bad}, "num_hidden_layers"},
		{[]string{"--hidden", "768"}, "need at least --layers and --hidden"},
		{[]string{"--layers", "900000", "--hidden", "768"}, "layers must be 1..4096, got 900000"},
		{[]string{"--layers", "2", "--hidden", "100"}, "give --heads"},
		{[]string{"--layers", "2", "--hidden", "768", "--heads", "5"}, "not a multiple of heads"},
		{[]string{"--layers", "2", "--hidden", "768", "--kv-heads", "5"}, "kv-heads"},
		{[]string{"--layers", "0", "--hidden", "768"}, "--layers must be at least 1"},
		{[]string{"--layers", "2", "--hidden", "768", "--family", "t5"}, `unknown family "t5"`},
		{[]string{"--model", "gpt2", "--family", "llama"}, "--family applies"},
		{[]string{"--model", "gpt2", "--mode", "pretrain"}, `unknown mode "pretrain"`},
		{[]string{"--model", "gpt2", "--precision", "fp8"}, `unknown precision "fp8"`},
		{[]string{"--model", "gpt2", "--precision", "int4"}, "for --mode infer"},
		{[]string{"--model", "gpt2", "--mode", "infer", "--precision", "amp-bf16"}, "training precision"},
		{[]string{"--model", "gpt2", "--mode", "qlora", "--precision", "int8"}, "NF4"},
		{[]string{"--model", "gpt2", "--optimizer", "lion"}, `unknown optimizer "lion"`},
		{[]string{"--model", "gpt2", "--optimizer-impl", "magic"}, "unknown optimizer implementation"},
		{[]string{"--model", "gpt2", "--mode", "infer", "--optimizer", "sgd"}, "--optimizer applies to training"},
		{[]string{"--model", "gpt2", "--mode", "infer", "--loss-only"}, "--loss-only applies to training"},
		{[]string{"--model", "gpt2", "--batch", "0"}, "--batch must be at least 1"},
		{[]string{"--model", "gpt2", "--batch", "x"}, `invalid value "x" for flag --batch`},
		{[]string{"--model", "gpt2", "--seq", "0"}, "--seq must be at least 1"},
		{[]string{"--model", "gpt2", "--seq", "2048"}, "longer than the model's 1024 learned positions"},
		{[]string{"--model", "gpt2", "--batch", "999999999"}, "batch must be 1.."},
		{[]string{"--model", "gpt2", "--generate", "5"}, "generate applies to --mode infer"},
		{[]string{"--model", "bert-base", "--mode", "infer", "--generate", "5"}, "does not generate"},
		{[]string{"--model", "gpt2", "--lora-rank", "8"}, "apply to --mode lora and qlora"},
		{[]string{"--model", "gpt2", "--mode", "lora", "--lora-rank", "0"}, "--lora-rank must be at least 1"},
		{[]string{"--model", "gpt2", "--mode", "lora", "--lora-targets", "q,x"}, `unknown LoRA target "x"`},
		{[]string{"--model", "gpt2", "--checkpointing=many"}, "want true, false or K"},
		{[]string{"--model", "gpt2", "--checkpointing", "4"}, "--checkpointing=K"},
		{[]string{"--model", "gpt2", "--mode", "infer", "--checkpointing"}, "checkpointing applies to training"},
		{[]string{"--model", "gpt2", "--attention", "sparse"}, `unknown attention "sparse"`},
		{[]string{"--model", "gpt2", "--dropout", "1.5"}, "dropout must be in [0, 1)"},
		{[]string{"--model", "gpt2", "--activation", "swoosh"}, `unknown activation "swoosh"`},
		{[]string{"--model", "gpt2", "--softmax", "slow"}, `unknown softmax "slow"`},
		{[]string{"--model", "gpt2", "--gpus", "0"}, "--gpus must be at least 1"},
		{[]string{"--model", "gpt2", "--shard", "zero4"}, `unknown shard "zero4"`},
		{[]string{"--model", "gpt2", "--shard", "fsdp"}, "give --gpus 2 or more"},
		{[]string{"--model", "gpt2", "--offload", "disk"}, `unknown offload "disk"`},
		{[]string{"--model", "gpt2", "--mode", "infer", "--offload", "optimizer"}, "no optimizer to offload"},
		{[]string{"--model", "gpt2", "--card", "rtx9090"}, `unknown card "rtx9090"`},
		{[]string{"--model", "gpt2", "--card", "a100-80g", "--capacity", "1GiB"}, "not both"},
		{[]string{"--model", "gpt2", "--capacity", "0"}, "more than 0"},
		{[]string{"--model", "gpt2", "--capacity", "9TiB"}, "at most 8TiB"},
		{[]string{"--model", "gpt2", "--overhead", "-1"}, "bad size"},
		{[]string{"--model", "gpt2", "--conf", "bogus:1"}, `unrecognized key "bogus"`},
		{[]string{"--params", "7B", "--max-batch"}, "need the model's dimensions"},
		{[]string{"--params", "7B", "--mode", "lora"}, "need the model's dimensions"},
		{[]string{"--model", "gpt2", "extra"}, `unexpected argument "extra"`},
	} {
		_, errOut, code := runCmd(t, append([]string{"estimate"}, c.args...)...)
		assert.Equal(t, 2, code, "%v: %s", c.args, errOut)
		assert.Contains(t, errOut, c.want, "%v", c.args)
		assert.Equal(t, 1, strings.Count(errOut, "\n"), "%v: one line: %q", c.args, errOut)
	}
}

// A failed write of the output is an error (exit status 1), reported in
// one line.
func TestEstimateWriteError(t *testing.T) {
	for _, args := range [][]string{{"--model", "gpt2"}, {"--model", "gpt2", "--json"}} {
		var errOut bytes.Buffer
		code := run(append([]string{"estimate"}, args...), failingWriter{}, &errOut)
		assert.Equal(t, 1, code)
		assert.Contains(t, errOut.String(), "no space left on device")
		assert.Equal(t, 1, strings.Count(dropConfLine(errOut.String()), "\n"), errOut.String())
	}
	if f, err := os.OpenFile("/dev/full", os.O_WRONLY, 0); err == nil {
		defer f.Close()
		var errOut bytes.Buffer
		assert.Equal(t, 1, run([]string{"estimate", "--model", "gpt2"}, f, &errOut), errOut.String())
	}
}

func TestEstimateHelp(t *testing.T) {
	_, errOut, code := runCmd(t, "estimate", "--help")
	assert.Equal(t, 0, code)
	for _, flag := range []string{"-model", "-config", "-params", "-layers", "-hidden", "-heads", "-kv-heads", "-intermediate",
		"-vocab", "-mode", "-precision", "-optimizer", "-batch", "-seq", "-lora-rank", "-checkpointing", "-attention", "-gpus",
		"-shard", "-offload", "-card", "-capacity", "-max-batch", "-json"} {
		assert.Contains(t, errOut, flag)
	}
}

// estimate --config reads at most 4 MiB (it read /dev/zero until the
// runtime died), and a config without the model's shape is an error that
// names the missing keys (it answered as a default llama).
func TestEstimateConfigRefused(t *testing.T) {
	dir := t.TempDir()
	big := filepath.Join(dir, "big.json")
	writeFile(t, big, `{"pad": "`+strings.Repeat("x", 5<<20)+`"}`)
	cases := map[string]string{
		big:    "larger than 4 MiB",
		dir:    "is a directory",
		"{}":   "no hidden_size, num_hidden_layers, num_attention_heads, intermediate_size, vocab_size",
		"null": "null, not an object",
		`{"_from_model_config": true, "bos_token_id": 1, "eos_token_id": 2, "transformers_version": "4.40.0"}`: "generation_config.json",
	}
	if _, err := os.Stat("/dev/zero"); err == nil {
		cases["/dev/zero"] = "larger than 4 MiB"
	}
	i := 0
	for arg, want := range cases {
		path := arg
		if strings.HasPrefix(arg, "{") || arg == "null" {
			i++
			path = filepath.Join(dir, fmt.Sprintf("config%d.json", i))
			writeFile(t, path, arg)
		}
		out, errOut, code := runCmd(t, "estimate", "--config", path)
		assert.Equal(t, 2, code, "%.40s: %s", arg, out)
		assert.Contains(t, errOut, want, "%.40s", arg)
		assert.Equal(t, 1, strings.Count(errOut, "\n"), "one line: %q", errOut)
		assert.Empty(t, out)
	}
}

// A config's _name_or_path is printed quoted and bounded: escape
// sequences and half a million line breaks reached the terminal.
func TestEstimateNameQuoted(t *testing.T) {
	path := filepath.Join(t.TempDir(), "config.json")
	name := `evil\u001b]0;pwned\u0007\u001b[2J` + strings.Repeat(`\n`, 500_000)
	writeFile(t, path, `{"_name_or_path": "`+name+`", "model_type": "gpt2", "n_embd": 768, "n_layer": 2, "n_head": 12, "vocab_size": 50257}`)
	out, errOut, code := runCmd(t, "estimate", "--config", path)
	require.Equal(t, 0, code, errOut)
	assert.NotContains(t, out, "\x1b")
	assert.NotContains(t, out, "\a")
	first, _, _ := strings.Cut(out, "\n")
	assert.True(t, strings.HasPrefix(first, `"evil\x1b]0;pwned\a\x1b[2J\n\n`), first)
	assert.Less(t, len(first), 500, "the name is cut: %q", first)
	assert.Less(t, strings.Count(out, "\n"), 60, "no line breaks from the name")
	res := runJSON(t, "estimate", "--config", path)
	assert.Equal(t, "evil\x1b]0;pwned\a\x1b[2J"+strings.Repeat("\n", 500_000), res["model"], "JSON keeps the name, escaped")
}

// --overhead above 1 PiB is refused; it was silently cut to 1 PiB.
func TestEstimateOverheadAbove1PiB(t *testing.T) {
	_, errOut, code := runCmd(t, "estimate", "--model", "gpt2", "--overhead", "1025TiB")
	assert.Equal(t, 2, code)
	assert.Contains(t, errOut, `--overhead must be at most 1PiB, got "1025TiB"`)
	res := runJSON(t, "estimate", "--model", "gpt2", "--overhead", "1024TiB")
	assert.GreaterOrEqual(t, num(t, res, "overhead_bytes"), float64(1<<50), "1 PiB is counted")
}

// A bare parameter count of 100 trillion is answered quickly in bounded
// memory (the runtime died past 2.6 GB).
func TestEstimateHugeParamsBounded(t *testing.T) {
	res := runJSON(t, "estimate", "--params", "100T")
	assert.EqualValues(t, 1e14, res["parameters"])
	assert.Equal(t, false, res["fits"])
}

// estimate --config quotes at most about 100 bytes of a path or a value:
// a long path gave about 900 bytes (the message cut in its middle).
func TestEstimateConfigMessageShort(t *testing.T) {
	path := filepath.Join(t.TempDir(), "config.json")
	writeFile(t, path, `{"model_type": "llama", "hidden_size": "`+strings.Repeat("x", 1<<20)+`"}`)
	for _, arg := range []string{strings.Repeat("x", 100_000), path} {
		_, errOut, code := runCmd(t, "estimate", "--config", arg)
		assert.Equal(t, 2, code)
		assert.Less(t, len(errOut), 300, "%q", errOut)
	}
}
