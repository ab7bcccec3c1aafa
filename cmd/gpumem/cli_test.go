package main

// The command line as Go users write it: flags after the arguments,
// gpumem help CMD, version --help; and the configuration line every
// command writes on stderr.

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpumem/gpumem/allocator"
)

// clearConfEnv unsets every variable the commands read a configuration
// from.
func clearConfEnv(t *testing.T) {
	for _, v := range allocator.ConfEnvVars() {
		t.Setenv(v, "")
	}
}

func TestFlagsAfterArguments(t *testing.T) {
	clearConfEnv(t)
	out, errOut, code := runCmd(t, "replay", "testdata/small.trace.gz", "--conf", "expandable_segments:True", "--json")
	require.Equal(t, 0, code, errOut)
	var j map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &j), out)
	assert.Equal(t, "expandable_segments:True", j["conf"])
	assert.Equal(t, "--conf", j["conf_from"])

	// Flags between arguments, and "--" ending the flags.
	out, errOut, code = runCmd(t, "replay", "testdata/small.trace.gz", "--json", "testdata/small.trace.gz")
	require.Equal(t, 0, code, errOut)
	assert.Len(t, strings.Split(strings.TrimSpace(out), "\n"), 2)
	_, errOut, code = runCmd(t, "replay", "testdata/small.trace.gz", "--", "--json")
	assert.Equal(t, 1, code)
	assert.Contains(t, errOut, "--json", "after --, --json is a file name")

	// An unknown flag after the arguments is still a usage error.
	_, errOut, code = runCmd(t, "fit", "testdata/small.trace.gz", "--bogus")
	assert.Equal(t, 2, code)
	assert.Contains(t, errOut, "unknown flag --bogus")

	_, errOut, code = runCmd(t, "estimate", "--model", "gpt2", "--json", "extra")
	assert.Equal(t, 2, code)
	assert.Contains(t, errOut, `unexpected argument "extra"`)
}

func TestHelpCommand(t *testing.T) {
	for name := range commands {
		out, errOut, code := runCmd(t, "help", name)
		assert.Equal(t, 0, code, "%s: %s", name, errOut)
		assert.True(t, strings.HasPrefix(out, "Usage: gpumem "+name), "%s: %q", name, out)
		assert.Empty(t, errOut, name)
	}
	out, _, code := runCmd(t, "help", "replay")
	require.Equal(t, 0, code)
	assert.Contains(t, out, "--conf CONF")
	_, errOut, code := runCmd(t, "help", "bogus")
	assert.Equal(t, 2, code)
	assert.Contains(t, errOut, `unknown command "bogus"`)
	_, _, code = runCmd(t, "help", "replay", "fit")
	assert.Equal(t, 2, code)
}

func TestVersionHelp(t *testing.T) {
	for _, arg := range []string{"--help", "-h"} {
		out, errOut, code := runCmd(t, "version", arg)
		assert.Equal(t, 0, code, errOut)
		assert.Empty(t, out)
		assert.Equal(t, "Usage: gpumem version\n", errOut)
	}
	_, errOut, code := runCmd(t, "version", "x")
	assert.Equal(t, 2, code)
	assert.Contains(t, errOut, "version takes no arguments")
	_, _, code = runCmd(t, "version", "--bogus")
	assert.Equal(t, 2, code)
}

// TestConfHelpNamesVariables: every --conf help names the three variables
// in the order they are read.
func TestConfHelpNamesVariables(t *testing.T) {
	want := "GPUMEM_ALLOC_CONF, then PYTORCH_ALLOC_CONF, then PYTORCH_CUDA_ALLOC_CONF"
	for _, name := range []string{"demo", "replay", "compare", "estimate", "viz", "fit", "scale", "tune"} {
		out, _, code := runCmd(t, "help", name)
		require.Equal(t, 0, code)
		assert.Contains(t, strings.Join(strings.Fields(out), " "), want, name)
	}
	_, _, code := runCmd(t, "help")
	assert.Equal(t, 0, code)
}

func TestConfLine(t *testing.T) {
	run := func(args ...string) string {
		t.Helper()
		_, errOut, code := runCmd(t, args...)
		require.Equal(t, 0, code, errOut)
		return errOut
	}
	small := "testdata/small.trace.gz"
	clearConfEnv(t)
	assert.Equal(t, "gpumem replay: configuration PyTorch's default (none of --conf, GPUMEM_ALLOC_CONF, PYTORCH_ALLOC_CONF, PYTORCH_CUDA_ALLOC_CONF is set)\n",
		run("replay", small))
	assert.Equal(t, "gpumem replay: configuration max_split_size_mb:64 (from --conf)\n", run("replay", "--conf", "max_split_size_mb:64", small))
	t.Setenv("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:128")
	assert.Equal(t, "gpumem viz: configuration max_split_size_mb:128 (from PYTORCH_CUDA_ALLOC_CONF)\n", run("viz", "-o", t.TempDir()+"/x.svg", small))
	t.Setenv("PYTORCH_ALLOC_CONF", "expandable_segments:True")
	assert.Equal(t, "gpumem demo: configuration expandable_segments:True (from PYTORCH_ALLOC_CONF)\n", run("demo", "--steps", "1", "--layers", "1"))
	t.Setenv("GPUMEM_ALLOC_CONF", "garbage_collection_threshold:0.5")
	assert.Equal(t, "gpumem estimate: configuration garbage_collection_threshold:0.5 (from GPUMEM_ALLOC_CONF)\n", run("estimate", "--model", "gpt2"))
	assert.Equal(t, "gpumem compare: configurations PyTorch's default; max_split_size_mb:64 (from --conf)\n",
		run("compare", "--conf", "", "--conf", "max_split_size_mb:64", small))

	clearConfEnv(t)
	assert.Equal(t, "gpumem fit: configurations PyTorch's default; expandable_segments:True (fit's default: none of --conf, GPUMEM_ALLOC_CONF, PYTORCH_ALLOC_CONF, PYTORCH_CUDA_ALLOC_CONF is set)\n",
		run("fit", "--checks", "1", small))

	// replay --json carries the configuration and the capacity.
	t.Setenv("PYTORCH_ALLOC_CONF", "expandable_segments:True")
	out, _, code := runCmd(t, "replay", "--json", "--card", "a100-40g", small)
	require.Equal(t, 0, code)
	var j struct {
		Conf     string `json:"conf"`
		From     string `json:"conf_from"`
		Capacity uint64 `json:"capacity_bytes"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &j))
	assert.Equal(t, "expandable_segments:True", j.Conf)
	assert.Equal(t, "PYTORCH_ALLOC_CONF", j.From)
	assert.Equal(t, uint64(40<<30-512<<20), j.Capacity, "the card less the default overhead")
	clearConfEnv(t)
	out, _, _ = runCmd(t, "replay", "--json", small)
	require.NoError(t, json.Unmarshal([]byte(out), &j))
	assert.Equal(t, "", j.Conf)
	assert.Equal(t, "default", j.From)
	assert.Equal(t, uint64(80<<30), j.Capacity)

	// A usage error stays one line: the configuration line comes when the
	// work starts.
	_, errOut, code := runCmd(t, "replay", "--history", "0", small)
	assert.Equal(t, 2, code)
	assert.Equal(t, 1, strings.Count(errOut, "\n"), errOut)
}

// TestOverhead: with --card, the allocator gets the card's memory less
// --overhead (512 MiB by default, as estimate counts the CUDA context),
// and the commands print it.
func TestOverhead(t *testing.T) {
	clearConfEnv(t)
	small := "testdata/small.trace.gz"
	capOf := func(args ...string) (capacity, overhead uint64) {
		t.Helper()
		out, errOut, code := runCmd(t, append([]string{"replay", "--json", small}, args...)...)
		require.Equal(t, 0, code, errOut)
		var j struct {
			Capacity uint64 `json:"capacity_bytes"`
			Overhead uint64 `json:"overhead_bytes"`
		}
		require.NoError(t, json.Unmarshal([]byte(out), &j))
		return j.Capacity, j.Overhead
	}
	c, o := capOf("--card", "a100-80g")
	assert.Equal(t, uint64(80<<30-512<<20), c)
	assert.Equal(t, uint64(512<<20), o)
	c, o = capOf("--card", "a100-80g", "--overhead", "1GiB")
	assert.Equal(t, uint64(79<<30), c)
	assert.Equal(t, uint64(1<<30), o)
	c, o = capOf("--card", "a100-80g", "--overhead", "0")
	assert.Equal(t, uint64(80<<30), c)
	assert.Zero(t, o)
	c, o = capOf("--capacity", "16GiB")
	assert.Equal(t, uint64(16<<30), c, "--capacity is the allocator's whole")
	assert.Zero(t, o)

	out, _, code := runCmd(t, "replay", small, "--card", "a100-80g")
	require.Equal(t, 0, code)
	assert.Contains(t, out, "simulated device        a100-80g (80GiB, less 512.00 MiB overhead: 79.50 GiB)")

	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"replay", small, "--capacity", "8GiB", "--overhead", "1GiB"}, "--overhead applies with --card"},
		{[]string{"tune", small, "--overhead", "1GiB"}, "--overhead applies with --card"},
		{[]string{"replay", small, "--card", "a100-80g", "--overhead", "80GiB"}, "leaves the allocator less than 2 MiB"},
		{[]string{"fit", small, "--overhead", "2048TiB"}, "--overhead must be at most 1PiB"},
	} {
		_, errOut, code := runCmd(t, c.args...)
		assert.Equal(t, 2, code, "%v: %s", c.args, errOut)
		assert.Contains(t, errOut, c.want, c.args)
	}

	// fit adds the overhead to its answer for the card.
	out, errOut, code := runCmd(t, "fit", "--json", "--conf", "", "--checks", "1", small)
	require.Equal(t, 0, code, errOut)
	var f fitJSON
	require.NoError(t, json.Unmarshal([]byte(out), &f))
	assert.Equal(t, uint64(512<<20), f.OverheadBytes)
	assert.Equal(t, f.MinCapacityBytes+512<<20, f.MinCardBytes)
	out, _, code = runCmd(t, "fit", "--conf", "", "--checks", "1", "--overhead", "1GiB", small)
	require.Equal(t, 0, code)
	assert.Contains(t, out, "a card of 11.84 GiB: the answer plus 1024.00 MiB outside the allocator (--overhead)")

	// tune measures on the card less the overhead.
	out, errOut, code = runCmd(t, "tune", "--json", "--card", "a100-40g", "--overhead", "2GiB", small)
	require.Equal(t, 0, code, errOut)
	var tj tuneJSON
	require.NoError(t, json.Unmarshal([]byte(out), &tj))
	assert.Equal(t, uint64(38<<30), tj.CapacityBytes)
	assert.Equal(t, uint64(2<<30), tj.OverheadBytes)
}

// TestTuneConfLine: tune names its sweep, and what it tries besides.
func TestTuneConfLine(t *testing.T) {
	clearConfEnv(t)
	_, errOut, code := runCmd(t, "tune", "--json", "testdata/small.trace.gz")
	require.Equal(t, 0, code, errOut)
	assert.Equal(t, "gpumem tune: configurations the sweep alone (none of --conf, GPUMEM_ALLOC_CONF, PYTORCH_ALLOC_CONF, PYTORCH_CUDA_ALLOC_CONF is set)\n", errOut)
	t.Setenv("PYTORCH_ALLOC_CONF", "max_split_size_mb:1024")
	_, errOut, code = runCmd(t, "tune", "--json", "testdata/small.trace.gz")
	require.Equal(t, 0, code, errOut)
	assert.Equal(t, "gpumem tune: the sweep and configuration max_split_size_mb:1024 (from PYTORCH_ALLOC_CONF)\n", errOut)
}
