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
	assert.Equal(t, uint64(40<<30), j.Capacity)
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
