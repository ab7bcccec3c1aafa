package main

// Regression tests of the second round of hostile use of the command
// (the output that was one of the inputs is output_test.go's): answers
// given with exit status 0 that were wrong (a config without a shape, an
// overflowing extrapolation, a silently capped overhead, only one of
// several fit failures), unbounded reads, raw names printed to the
// terminal and flags that did nothing.

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

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

// An extrapolation whose peak overflows 64 bits is refused: it printed
// a negative peak and the JSON a wrapped integer, with exit status 0.
func TestScaleOverflowRefused(t *testing.T) {
	dir := t.TempDir()
	var b1, b2 strings.Builder
	for i := 1; i <= 40; i++ {
		fmt.Fprintf(&b1, "a %d %d\n", i, 4<<20)
		fmt.Fprintf(&b2, "a %d %d\n", i, 8<<20)
	}
	for i := 1; i <= 40; i++ {
		fmt.Fprintf(&b1, "f %d\n", i)
		fmt.Fprintf(&b2, "f %d\n", i)
	}
	p1, p2 := filepath.Join(dir, "b1.trace"), filepath.Join(dir, "b2.trace")
	writeFile(t, p1, b1.String())
	writeFile(t, p2, b2.String())
	for _, json := range []bool{false, true} {
		args := []string{"scale", "--probe", p1 + "@1", "--probe", p2 + "@2", "--batch", "150000000000"}
		if json {
			args = append(args, "--json")
		}
		out, errOut, code := runCmd(t, args...)
		assert.Equal(t, 1, code, out)
		assert.Contains(t, errOut, "overflows")
		assert.Empty(t, out)
	}
	// A batch whose peak fits in 63 bits is answered.
	_, errOut, code := runCmd(t, "scale", "--probe", p1+"@1", "--probe", p2+"@2", "--batch", "1000")
	assert.Equal(t, 0, code, errOut)
}

// fit on a trace that fits under no configuration names every
// configuration's failure; it named only the last to end.
func TestFitReportsEveryFailure(t *testing.T) {
	path := filepath.Join(t.TempDir(), "huge.trace")
	writeFile(t, path, "a 1 1000000000000000000\nf 1\n")
	_, errOut, code := runCmd(t, "fit", "--conf", "", "--conf", "expandable_segments:True", "--conf", "max_split_size_mb:128", path)
	assert.Equal(t, 1, code)
	for _, conf := range []string{"default", "expandable_segments:True", "max_split_size_mb:128"} {
		assert.Contains(t, errOut, conf)
	}
	assert.Contains(t, errOut, "more than the largest simulated device")
	assert.Equal(t, 1, strings.Count(dropConfLine(errOut), "\n"), "one line: %q", errOut)
}

// --history without --snapshot is refused: it was silently ignored.
func TestHistoryNeedsSnapshot(t *testing.T) {
	_, errOut, code := runCmd(t, "replay", "--history", "5", "testdata/small.trace.gz")
	assert.Equal(t, 2, code)
	assert.Contains(t, errOut, "--history needs --snapshot")
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
