package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// confLineRE matches the line on which a command says which configuration
// it uses (fs.begin).
var confLineRE = regexp.MustCompile(`(?m)^gpumem [a-z]+: (the sweep and )?configurations? .*\n`)

// dropConfLine returns the stderr s without the configuration line, for
// the tests of the one-line messages that follow it.
func dropConfLine(s string) string {
	return confLineRE.ReplaceAllString(s, "")
}

func runCmd(t *testing.T, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	var o, e bytes.Buffer
	code = run(args, &o, &e)
	return o.String(), e.String(), code
}

// runJSON runs gpumem COMMAND --json with args, requires the exit status
// 0, and decodes its output (one JSON object).
func runJSON(t *testing.T, command string, args ...string) map[string]any {
	t.Helper()
	out, errOut, code := runCmd(t, append([]string{command, "--json"}, args...)...)
	require.Equal(t, 0, code, errOut)
	var res map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &res), out)
	return res
}

func TestDemo(t *testing.T) {
	out, errOut, code := runCmd(t, "demo", "--steps", "3", "--layers", "4")
	require.Equal(t, 0, code, errOut)
	assert.Contains(t, out, "step 1")
	assert.Contains(t, out, "step 3")
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, "step 2") || strings.HasPrefix(line, "step 3") {
			assert.Contains(t, line, "device mallocs 0, frees 0", "after the first step everything comes from the cache")
		}
	}
	assert.Contains(t, out, "every step after the first was served from the cache")
	assert.Contains(t, out, "| Allocated memory      |")
	assert.Contains(t, out, "gpumem memory summary, device 0")
	assert.Contains(t, out, "Memory by phase", "the loop names its phases")
	assert.Regexp(t, `\| forward +\|`, out)
	assert.Regexp(t, `\| backward +\|`, out)
	assert.NotContains(t, out, "possible leaks", "a training loop that keeps nothing across steps leaks nothing")
}

func TestDemoExpandable(t *testing.T) {
	out, errOut, code := runCmd(t, "demo", "--steps", "2", "--layers", "2", "--conf", "expandable_segments:True")
	require.Equal(t, 0, code, errOut)
	assert.Contains(t, out, "configuration: expandable_segments:True")
	assert.Regexp(t, `step 1 .*device mallocs [1-9]`, out, "the first step maps pages")
	assert.Regexp(t, `step 2 .*device mallocs 0, frees 0`, out)
}

// TestDemoExpandableWithMaxSplitSize runs the demo with a configuration
// that PyTorch users copy, under which the steps after the first keep
// mapping memory (allocator's TestMaxSplitSizeStrandsExpandableMemory):
// the demo says so and what to change.
func TestDemoExpandableWithMaxSplitSize(t *testing.T) {
	out, errOut, code := runCmd(t, "demo", "--steps", "3", "--conf", "expandable_segments:True,max_split_size_mb:128")
	require.Equal(t, 0, code, errOut)
	assert.Regexp(t, `step 2 .*device mallocs [1-9]`, out, "the second step maps more")
	assert.Contains(t, out, "max_split_size_mb keeps a request below it out of the free ranges")
	out, errOut, code = runCmd(t, "demo", "--steps", "3", "--conf", "expandable_segments:True")
	require.Equal(t, 0, code, errOut)
	assert.Regexp(t, `step 2 .*device mallocs 0, frees 0`, out, "without max_split_size_mb the second step maps nothing")
}

func TestDemoBadFlags(t *testing.T) {
	_, errOut, code := runCmd(t, "demo", "--steps", "0")
	assert.Equal(t, 2, code)
	assert.Contains(t, errOut, "--steps")
	_, errOut, code = runCmd(t, "demo", "--conf", "bogus:1")
	assert.Equal(t, 2, code)
	assert.Contains(t, errOut, `unrecognized key "bogus"`)
	assert.Equal(t, 1, strings.Count(strings.TrimSpace(errOut), "\n")+1, "one line: %q", errOut)
}

func TestReplayJSON(t *testing.T) {
	out, errOut, code := runCmd(t, "replay", "--json", "testdata/small.trace.gz", "testdata/small.trace.gz")
	require.Equal(t, 0, code, errOut)
	assert.Empty(t, dropConfLine(errOut), "no progress bar when not on a terminal")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, 2, "one object per trace")
	var res map[string]any
	require.NoError(t, json.Unmarshal([]byte(lines[0]), &res))
	for _, k := range []string{"trace", "ops", "allocs", "frees", "ooms", "ns_per_op", "replay_seconds", "device_seconds",
		"peak_requested_bytes", "peak_allocated_bytes", "peak_reserved_bytes", "device_allocs", "device_frees", "fragmentation", "stats"} {
		assert.Contains(t, res, k)
	}
	st := res["stats"].(map[string]any)
	assert.Equal(t, res["peak_reserved_bytes"], st["reserved_bytes.all.peak"])
	assert.Equal(t, res["peak_requested_bytes"], st["requested_bytes.all.peak"])
	assert.Equal(t, res["peak_allocated_bytes"], st["allocated_bytes.all.peak"])
	assert.EqualValues(t, 3118, res["ops"])
}

func TestReplayTextSummaryBaselineCapacity(t *testing.T) {
	out, errOut, code := runCmd(t, "replay", "--summary", "--conf", "max_split_size_mb:64", "testdata/small.trace.gz")
	require.Equal(t, 0, code, errOut)
	assert.Contains(t, out, "fragmentation")
	assert.Contains(t, out, "| GPU reserved memory   |")
	out, _, code = runCmd(t, "replay", "--baseline", "--capacity", "4GiB", "testdata/small.trace.gz")
	require.Equal(t, 0, code)
	assert.Contains(t, out, "out of memory")
	out, _, code = runCmd(t, "replay", "--capacity", "64MiB", "testdata/small.trace.gz")
	require.Equal(t, 0, code, "out of memory is counted, not fatal")
	assert.NotContains(t, out, "out of memory           0")
}

func TestReplayErrors(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.trace")
	require.NoError(t, os.WriteFile(bad, []byte("a 0 10\nf 7\n"), 0o644))
	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"replay"}, 2, "no trace given"},
		{[]string{"replay", "--capacity", "lots", "x"}, 2, "bad size"},
		{[]string{"replay", "--bogus", "x"}, 2, "unknown flag --bogus (see gpumem replay --help)"},
		{[]string{"replay", "-x", "x"}, 2, "unknown flag -x"},
		{[]string{"replay", "--capacity"}, 2, "flag needs an argument: --capacity"},
		{[]string{"replay", "--json=maybe", "x"}, 2, "for --json"},
		{[]string{"replay", "--conf", "max_split_size_mb:5", "x"}, 2, "too small"},
		{[]string{"replay", filepath.Join(dir, "missing")}, 1, "no such file"},
		{[]string{"replay", bad}, 1, `line 2: "f 7": ID 7 is not live`},
		{[]string{"compare"}, 2, "exactly one trace"},
		{[]string{"convert"}, 2, "exactly one file"},
		{[]string{"nonsense"}, 2, "unknown command"},
		{[]string{}, 2, "Usage"},
	} {
		_, errOut, code := runCmd(t, c.args...)
		assert.Equal(t, c.code, code, "%v", c.args)
		assert.Contains(t, errOut, c.want, "%v", c.args)
	}
}

func TestHelp(t *testing.T) {
	for _, cmd := range []string{"demo", "replay", "compare", "convert", "estimate", "viz"} {
		_, errOut, code := runCmd(t, cmd, "--help")
		assert.Equal(t, 0, code, cmd)
		assert.Contains(t, errOut, "Usage: gpumem "+cmd, cmd)
	}
	out, _, code := runCmd(t, "help")
	assert.Equal(t, 0, code)
	assert.Contains(t, out, "gpumem replay")
}

func TestCompare(t *testing.T) {
	out, errOut, code := runCmd(t, "compare", "--conf", "", "--conf", "max_split_size_mb:64", "testdata/small.trace.gz")
	require.Equal(t, 0, code, errOut)
	assert.Contains(t, out, "baseline (no cache)")
	assert.Contains(t, out, "default")
	assert.Contains(t, out, "max_split_size_mb:64")
	assert.Contains(t, out, "peak reserved")
}

func TestConvert(t *testing.T) {
	out, errOut, code := runCmd(t, "convert", "testdata/rmm_log.csv")
	require.Equal(t, 0, code, errOut)
	assert.True(t, strings.HasPrefix(out, "# memtrace v1"), out)
	assert.Contains(t, out, "\na ")
	dst := filepath.Join(t.TempDir(), "out.trace.gz")
	_, errOut, code = runCmd(t, "convert", "-o", dst, "testdata/rmm_log.csv")
	require.Equal(t, 0, code, errOut)
	out2, errOut, code := runCmd(t, "replay", "--json", dst)
	require.Equal(t, 0, code, errOut)
	assert.Contains(t, out2, `"ooms":0`)
}

func TestParseSize(t *testing.T) {
	for in, want := range map[string]uint64{"80GiB": 80 << 30, "512MiB": 512 << 20, "1024": 1024, "1.5GiB": 3 << 29, "2GB": 2e9, "4 KiB": 4096} {
		got, err := parseSize(in)
		require.NoError(t, err, in)
		assert.Equal(t, want, got, in)
	}
	for _, in := range []string{"", "GiB", "-1", "1e400", "12XB", "99999999999999999999TiB"} {
		_, err := parseSize(in)
		assert.Error(t, err, in)
	}
}

func TestViz(t *testing.T) {
	dst := filepath.Join(t.TempDir(), "out.svg")
	_, errOut, code := runCmd(t, "viz", "-o", dst, "--conf", "expandable_segments:True", "testdata/small.trace.gz")
	require.Equal(t, 0, code, errOut)
	b, err := os.ReadFile(dst)
	require.NoError(t, err)
	assert.Contains(t, string(b), "<svg")
	assert.Contains(t, string(b), "expandable_segments:True")
	_, errOut, code = runCmd(t, "viz")
	assert.Equal(t, 2, code)
	assert.Contains(t, errOut, "exactly one trace")
}

func TestReplaySnapshotRoundTrip(t *testing.T) {
	dir := t.TempDir()
	snap := filepath.Join(dir, "snap.pickle")
	_, errOut, code := runCmd(t, "replay", "--snapshot", snap, "testdata/small.trace.gz")
	require.Equal(t, 0, code, errOut)
	back := filepath.Join(dir, "back.trace")
	_, errOut, code = runCmd(t, "convert", "-o", back, snap)
	require.Equal(t, 0, code, errOut)
	out, errOut, code := runCmd(t, "replay", "--json", back)
	require.Equal(t, 0, code, errOut)
	assert.Contains(t, out, `"ops":3118`, "the snapshot's history holds every allocation and free of the replay")
	_, errOut, code = runCmd(t, "replay", "--snapshot", snap, "--baseline", "testdata/small.trace.gz")
	assert.Equal(t, 2, code)
	assert.Contains(t, errOut, "--snapshot takes one trace")
}

// TestReplayPlannedSteps: under the planned policy, replay reports what
// the plan served (a row of the text, "plan" in --json); under another
// policy, neither.
func TestReplayPlannedSteps(t *testing.T) {
	const cnn = "../../trace/replay/testdata/EoR_NN_cnn_counterfactuals.trace.gz"
	out, errOut, code := runCmd(t, "replay", "--conf", "gpumem_policy:planned", cnn)
	require.Equal(t, 0, code, errOut)
	assert.Contains(t, out, "planned steps           1 planned, 0 taken up again, 0 packed again, 748 requests served from an arena, 8 skips, 0 departures, 0 spared (steps found without marks: 193 allocations each)\n")
	out, errOut, code = runCmd(t, "replay", "--json", "--conf", "gpumem_policy:planned", cnn)
	require.Equal(t, 0, code, errOut)
	var res struct {
		Plan map[string]any `json:"plan"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &res))
	require.NotNil(t, res.Plan)
	assert.EqualValues(t, 748, res.Plan["served"])
	assert.EqualValues(t, 193, res.Plan["found_period"])
	for _, k := range []string{"plans", "served", "skips", "departures", "spared", "reused", "repacks", "time_ordered", "arena_bytes", "following", "found_period"} {
		assert.Contains(t, res.Plan, k)
	}
	assert.NotContains(t, out, "in time order")

	// A step of 7,000 blocks, some 2,300 of them in use at once, is
	// packed in time order, as every marked step is first; the third
	// step, which frees its first block last, skips, and the plan is
	// packed again, in time order too (its packing by size would take the
	// boundary too long), which the row says.
	var big strings.Builder
	for s := range 5 {
		fmt.Fprintf(&big, "m step%d\n", s)
		id, held := 0, []int{}
		for i := range 3500 {
			fmt.Fprintf(&big, "a %d %d\n", id, 512+(i*7919)%(2<<20))
			if i == 0 && s == 2 {
				held = append([]int{id}, held...) // freed last
			} else if i%3 == 0 {
				fmt.Fprintf(&big, "f %d\n", id)
			} else {
				held = append(held, id)
			}
			id++
		}
		for i := range 3500 {
			fmt.Fprintf(&big, "a %d %d\nf %d\n", id, 512+(i*104729)%(2<<20), id)
			id++
			if len(held) > 0 {
				fmt.Fprintf(&big, "f %d\n", held[len(held)-1])
				held = held[:len(held)-1]
			}
		}
		for _, h := range held {
			fmt.Fprintf(&big, "f %d\n", h)
		}
	}
	path := writeTrace(t, big.String())
	out, errOut, code = runCmd(t, "replay", "--conf", "gpumem_policy:planned", path)
	require.Equal(t, 0, code, errOut)
	assert.Contains(t, out, "1 planned, 0 taken up again, 1 packed again (1 in time order: steps too large to pack by size at a boundary), 20998 requests served from an arena, 2 skips,")
	out, errOut, code = runCmd(t, "replay", "--json", "--conf", "gpumem_policy:planned", path)
	require.Equal(t, 0, code, errOut)
	require.NoError(t, json.Unmarshal([]byte(out), &res))
	assert.EqualValues(t, 1, res.Plan["time_ordered"])

	out, errOut, code = runCmd(t, "replay", cnn)
	require.Equal(t, 0, code, errOut)
	assert.NotContains(t, out, "planned steps")
	out, errOut, code = runCmd(t, "replay", "--json", "--conf", "gpumem_policy:low_fragmentation", cnn)
	require.Equal(t, 0, code, errOut)
	assert.NotContains(t, out, `"plan"`)
}
