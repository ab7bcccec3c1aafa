package main

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"runtime/debug"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const (
	batches    = "../../trace/plan/testdata/batches/"
	snapshotGz = "../../trace/pytorch/testdata/cs336_MAGMA27_lm_fwdbwd.noframes.pickle.gz"
)

func TestFitVerifiedByReplay(t *testing.T) {
	out, errOut, code := runCmd(t, "fit", "--json", batches+"bert_b2.trace.gz")
	require.Equal(t, 0, code, errOut)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, 2, "PyTorch's default and expandable_segments by default")
	for i, conf := range []string{"", "expandable_segments:True"} {
		var r map[string]any
		require.NoError(t, json.Unmarshal([]byte(lines[i]), &r))
		assert.Equal(t, conf, r["conf"])
		for _, k := range []string{"trace", "min_capacity_bytes", "peak_requested_bytes", "fit_ratio"} {
			assert.Contains(t, r, k)
		}
		minCap := uint64(r["min_capacity_bytes"].(float64))
		req := r["peak_requested_bytes"].(float64)
		assert.InDelta(t, float64(minCap)/req, r["fit_ratio"], 1e-9)
		// The offline best: the bound is the peak requested rounded, the
		// packing no less; greedy packing meets the bound on this trace.
		bound, planned := r["bound_bytes"].(float64), r["planned_bytes"].(float64)
		assert.GreaterOrEqual(t, bound, req)
		assert.Less(t, bound, req*1.001)
		assert.GreaterOrEqual(t, planned, bound)
		assert.LessOrEqual(t, planned, bound*1.001)
		assert.Greater(t, float64(minCap), planned, "no allocator beats the bound")
		at := runJSON(t, "replay", "--conf", conf, "--capacity", fmt.Sprint(minCap), batches+"bert_b2.trace.gz")
		assert.EqualValues(t, 0, at["ooms"], "no out of memory at the answer")
		below := runJSON(t, "replay", "--conf", conf, "--capacity", fmt.Sprint(minCap-2<<20), batches+"bert_b2.trace.gz")
		assert.Positive(t, below["ooms"], "out of memory 2 MiB below")
	}
}

func TestFitText(t *testing.T) {
	out, errOut, code := runCmd(t, "fit", "--conf", "max_split_size_mb:128", "testdata/small.trace.gz", snapshotGz)
	require.Equal(t, 0, code, errOut)
	assert.Contains(t, out, "testdata/small.trace.gz: 3118 ops")
	assert.Contains(t, out, "cs336_MAGMA27_lm_fwdbwd.noframes.pickle.gz: 3900 ops", "a PyTorch snapshot is a trace too")
	assert.Equal(t, 2, strings.Count(out, "  max_split_size_mb:128\n"))
	assert.Contains(t, out, "runs on ")
	assert.Contains(t, out, "not on ")
	assert.Equal(t, 2, strings.Count(out, "\n  offline best: "), "once per trace")
	assert.Regexp(t, `runs on .*: \d\.\d{3} x the peak requested, \d\.\d{3} x the offline best\n`, out)
	assert.NotContains(t, out, "default\n", "only the configuration given")

	_, errOut, code = runCmd(t, "fit")
	assert.Equal(t, 2, code)
	assert.Contains(t, errOut, "no trace given")
	_, errOut, code = runCmd(t, "fit", "--checks", "-1", "x")
	assert.Equal(t, 2, code)
	assert.Contains(t, errOut, "--checks -1")
}

// nonMonotoneTrace runs on 62 MiB, not on 70 MiB, and again from 72 MiB
// (trace/plan's tests say why).
const nonMonotoneTrace = "a 1 31457280\nf 1\na 2 41943040\na 3 3145728\na 4 1048576\nf 3\nf 2\na 5 1048576\na 6 46137344\nf 6\na 7 32505856\n"

func TestFitNonMonotoneReported(t *testing.T) {
	path := filepath.Join(t.TempDir(), "nm.trace")
	writeFile(t, path, nonMonotoneTrace)
	out, errOut, code := runCmd(t, "fit", "--conf", "", path)
	require.Equal(t, 0, code, errOut)
	assert.Contains(t, out, "runs on  62.00 MiB")
	assert.Contains(t, out, "NON-MONOTONE: out of memory on 1 larger capacities tried (the first 70.00 MiB")
	assert.Contains(t, out, "from 72.00 MiB")
	out, _, code = runCmd(t, "fit", "--json", "--conf", "", path)
	require.Equal(t, 0, code)
	assert.Contains(t, out, `"non_monotone_oom_capacities":[73400320]`)
	assert.Contains(t, out, `"safe_capacity_bytes":75497472`)
}

func TestScaleFromProbes(t *testing.T) {
	args := []string{"scale", "--json", "--probe", batches + "bert_b2.trace.gz@2", "--probe", batches + "bert_b4.trace.gz@4", "--batch", "8"}
	out, errOut, code := runCmd(t, args...)
	require.Equal(t, 0, code, errOut)
	var s map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &s), out)
	real := runJSON(t, "replay", batches+"bert_b8.trace.gz")
	assert.Equal(t, real["peak_allocated_bytes"], s["predicted_peak_allocated_bytes"], "predicted against the real batch-8 trace")
	assert.Equal(t, real["peak_reserved_bytes"], s["predicted_peak_reserved_bytes"])
	assert.Equal(t, real["peak_requested_bytes"], s["predicted_peak_requested_bytes"])
	assert.EqualValues(t, 0, s["ooms"])
	assert.NotContains(t, s, "max_batch", "no capacity given: no search")

	// The synthesized trace, written, replays as the real one.
	dst := filepath.Join(t.TempDir(), "b8.trace.gz")
	_, errOut, code = runCmd(t, append(args, "--write", dst)...)
	require.Equal(t, 0, code, errOut)
	written := runJSON(t, "replay", dst)
	assert.Equal(t, real["stats"], written["stats"])

	// With a capacity: the largest batch, verified by replays.
	out, errOut, code = runCmd(t, "scale", "--json", "--probe", batches+"bert_b2.trace.gz@2", "--probe", batches+"bert_b4.trace.gz@4",
		"--probe", batches+"bert_b8.trace.gz@8", "--batch", "64", "--capacity", "6GiB", "--conf", "expandable_segments:True")
	require.Equal(t, 0, code, errOut)
	require.NoError(t, json.Unmarshal([]byte(out), &s), out)
	mb := uint64(s["max_batch"].(float64))
	require.Positive(t, mb)
	assert.Equal(t, false, s["max_batch_unbounded"])
	for b, fits := range map[uint64]bool{mb: true, mb + 1: false} {
		out, errOut, code := runCmd(t, "scale", "--json", "--probe", batches+"bert_b2.trace.gz@2", "--probe", batches+"bert_b4.trace.gz@4",
			"--batch", fmt.Sprint(b), "--capacity", "6GiB", "--conf", "expandable_segments:True")
		require.Equal(t, 0, code, errOut)
		var p map[string]any
		require.NoError(t, json.Unmarshal([]byte(out), &p))
		assert.Equal(t, fits, p["ooms"].(float64) == 0, "batch %d", b)
	}

	// Text.
	out, errOut, code = runCmd(t, "scale", "--probe", batches+"bert_b2.trace.gz@2", "--probe", batches+"bert_b4.trace.gz@4", "--batch", "8", "--card", "rtx3080-10g")
	require.Equal(t, 0, code, errOut)
	assert.Contains(t, out, "predicted peak reserved   2.76 GiB (2965372928 bytes)")
	assert.Contains(t, out, "rtx3080-10g (10GiB, less 512.00 MiB overhead: 9.50 GiB)", "the card less the overhead, as estimate counts it")
	assert.Regexp(t, `largest batch that fits: \d+ \(batch \d+ runs out of memory`, out)
}

func TestScaleErrors(t *testing.T) {
	b2, b4 := batches+"bert_b2.trace.gz@2", batches+"bert_b4.trace.gz@4"
	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"--probe", b2, "--batch", "8"}, 2, "at least two --probe"},
		{[]string{"--probe", b2, "--probe", b4}, 2, "--batch"},
		{[]string{"--probe", b2, "--probe", "x.trace", "--batch", "8"}, 2, `--probe "x.trace": want FILE@BATCH`},
		{[]string{"--probe", b2, "--probe", "x@0", "--batch", "8"}, 2, "the batch must be"},
		{[]string{"--probe", b2, "--probe", b4, "--batch", "8", "--capacity", "1GiB", "--card", "a100-80g"}, 2, "not both"},
		{[]string{"--probe", b2, "--probe", b4, "--batch", "8", "--card", "nope"}, 2, `unknown card "nope"`},
		{[]string{"--probe", b2, "--probe", b4, "--batch", "8", "--write", "-"}, 2, "--write -"},
		{[]string{"--probe", b2, "--probe", b2, "--batch", "8"}, 1, "same batch 2"},
		{[]string{"--probe", b2, "--probe", "testdata/small.trace.gz@4", "--batch", "8"}, 1, "the probes do not fit one program: op "},
		{[]string{"--probe", b2, "--probe", b4, "--batch", "8", "extra"}, 2, "unexpected argument"},
	} {
		_, errOut, code := runCmd(t, append([]string{"scale"}, c.args...)...)
		assert.Equal(t, c.code, code, "%v: %s", c.args, errOut)
		assert.Contains(t, errOut, c.want, "%v", c.args)
		assert.Equal(t, 1, strings.Count(dropConfLine(errOut), "\n"), "one line: %q", errOut)
	}
}

func TestTune(t *testing.T) {
	path := filepath.Join(t.TempDir(), "nm.trace")
	writeFile(t, path, nonMonotoneTrace)
	out, errOut, code := runCmd(t, "tune", "--json", "--capacity", "1GiB", path)
	require.Equal(t, 0, code, errOut)
	var r struct {
		BestConf string `json:"best_conf"`
		Bound    uint64 `json:"bound_bytes"`
		Planned  uint64 `json:"planned_bytes"`
		Results  []struct {
			Conf         string `json:"conf"`
			MinCapacity  uint64 `json:"min_capacity_bytes"`
			PeakReserved int64  `json:"peak_reserved_bytes"`
			DeviceAllocs *int64 `json:"device_allocs"`
		} `json:"results"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &r), out)
	require.NotEmpty(t, r.Results)
	assert.Equal(t, r.Results[0].Conf, r.BestConf)
	assert.Positive(t, r.Bound)
	assert.GreaterOrEqual(t, r.Planned, r.Bound)
	best := r.Results[0]
	found := 0
	for _, res := range r.Results {
		assert.NotNil(t, res.DeviceAllocs)
		if res.Conf == "" || res.Conf == "expandable_segments:True" {
			found++
			assert.LessOrEqual(t, best.MinCapacity, res.MinCapacity, "never worse than %q", res.Conf)
			if best.MinCapacity == res.MinCapacity {
				assert.LessOrEqual(t, best.PeakReserved, res.PeakReserved, "never worse than %q", res.Conf)
			}
			// Its figures are those of fit and replay.
			fit, _, code := runCmd(t, "fit", "--json", "--conf", res.Conf, path)
			require.Equal(t, 0, code)
			assert.Contains(t, fit, fmt.Sprintf(`"min_capacity_bytes":%d,`, res.MinCapacity))
			at := runJSON(t, "replay", "--conf", res.Conf, "--capacity", "1GiB", path)
			assert.EqualValues(t, res.PeakReserved, at["peak_reserved_bytes"])
		}
	}
	assert.Equal(t, 2, found, "the sweep holds the default and expandable_segments alone")

	t.Setenv("GPUMEM_ALLOC_CONF", "max_split_size_mb:1024")
	out, errOut, code = runCmd(t, "tune", "--jobs", "1", path)
	require.Equal(t, 0, code, errOut)
	assert.Contains(t, out, "recommended:\n")
	assert.Regexp(t, `\noffline best: .*\n\nrank  min capacity  vs offline `, out)
	assert.Regexp(t, `\n1 +\d+ MiB +\d\.\d{3} x `, out)
	assert.Contains(t, out, "(PyTorch cannot take the best, gpumem_policy:low_fragmentation; its best is rank 2, on 62 MiB)\n  PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True\n", "PyTorch's line names what PyTorch takes")
	assert.Contains(t, out, "  GPUMEM_ALLOC_CONF=gpumem_policy:low_fragmentation")
	assert.Contains(t, out, "default (PyTorch's default)")
	assert.Contains(t, out, "  max_split_size_mb:1024", "the configuration in the environment is tried too")
	assert.Contains(t, out, "(non-monotone: fails on 70 MiB, runs from 72 MiB)")
	assert.Empty(t, dropConfLine(errOut), "no progress bar when not on a terminal")

	_, errOut, code = runCmd(t, "tune", "--jobs", "0", "x")
	assert.Equal(t, 2, code)
	assert.Contains(t, errOut, "--jobs 0")
}

func TestEveryCommandReadsEveryFormat(t *testing.T) {
	dir := t.TempDir()
	for _, in := range []string{snapshotGz, "../../trace/pytorch/testdata/edge.pickle", "testdata/rmm_log.csv"} {
		for _, args := range [][]string{
			{"replay", "--json", in},
			{"compare", "--json", in},
			{"viz", "-o", filepath.Join(dir, "x.svg"), in},
			{"fit", "--json", "--conf", "", in},
			{"scale", "--json", "--probe", in + "@1", "--probe", in + "@2", "--batch", "3"},
		} {
			_, errOut, code := runCmd(t, args...)
			assert.Equal(t, 0, code, "%v: %s", args, errOut)
		}
	}
	// gpumem replay snapshot.pickle once failed with "control character in line".
	r := runJSON(t, "replay", snapshotGz)
	assert.EqualValues(t, 3900, r["ops"])
}

func TestConfFromEnvironment(t *testing.T) {
	label := func() any {
		out, errOut, code := runCmd(t, "compare", "--json", "testdata/small.trace.gz")
		require.Equal(t, 0, code, errOut)
		var c compareJSON
		require.NoError(t, json.Unmarshal([]byte(out), &c))
		return c.Results[1].Conf
	}
	t.Setenv("GPUMEM_ALLOC_CONF", "")
	t.Setenv("PYTORCH_CUDA_ALLOC_CONF", "")
	assert.Equal(t, "", label())
	t.Setenv("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:64")
	assert.Equal(t, "max_split_size_mb:64", label())
	t.Setenv("GPUMEM_ALLOC_CONF", "expandable_segments:True")
	assert.Equal(t, "expandable_segments:True", label(), "gpumem's variable first")

	out, errOut, code := runCmd(t, "demo", "--steps", "1", "--layers", "1")
	require.Equal(t, 0, code, errOut)
	assert.Contains(t, out, "configuration: expandable_segments:True")
	out, errOut, code = runCmd(t, "demo", "--steps", "1", "--layers", "1", "--conf", "")
	require.Equal(t, 0, code, errOut)
	assert.NotContains(t, out, "configuration:", "--conf wins over the environment")

	for _, v := range []string{"GPUMEM_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF"} {
		t.Setenv("GPUMEM_ALLOC_CONF", "")
		t.Setenv(v, "max_split_size_mb:5")
		for _, cmd := range [][]string{
			{"replay", "testdata/small.trace.gz"}, {"demo"}, {"compare", "testdata/small.trace.gz"}, {"viz", "testdata/small.trace.gz"},
			{"fit", "testdata/small.trace.gz"}, {"tune", "testdata/rmm_log.csv"}, {"estimate", "--model", "gpt2"},
			{"scale", "--probe", batches + "bert_b2.trace.gz@2", "--probe", batches + "bert_b4.trace.gz@4", "--batch", "8"},
		} {
			_, errOut, code := runCmd(t, cmd...)
			assert.Equal(t, 2, code, "%v", cmd)
			assert.Contains(t, errOut, v+": ", "%v names the variable", cmd)
			assert.Equal(t, 1, strings.Count(dropConfLine(errOut), "\n"), "one line: %q", errOut)
		}
	}
}

func TestReplayFirstOOM(t *testing.T) {
	out, errOut, code := runCmd(t, "replay", "--capacity", "4GiB", "testdata/small.trace.gz")
	require.Equal(t, 0, code, errOut)
	assert.Regexp(t, `first out of memory, at allocation \d+: gpumem: out of memory\. Tried to allocate .* or call EmptyCache between phases\.\n`, out)
	assert.Regexp(t, `and \d+ more allocations ran out of memory`, out)

	_, errOut, code = runCmd(t, "replay", "--fail-on-oom", "--capacity", "4GiB", "testdata/small.trace.gz")
	assert.Equal(t, 3, code)
	assert.Regexp(t, `^gpumem replay: \d+ allocations ran out of memory \(--fail-on-oom\)\n$`, dropConfLine(errOut))
	_, _, code = runCmd(t, "replay", "--fail-on-oom", "testdata/small.trace.gz")
	assert.Equal(t, 0, code, "no out of memory, status 0")

	r := runJSON(t, "replay", "--capacity", "4GiB", "testdata/small.trace.gz")
	assert.Contains(t, r["first_oom"], "gpumem: out of memory. Tried to allocate")
	assert.Positive(t, r["first_oom_alloc"])
	r = runJSON(t, "replay", "testdata/small.trace.gz")
	assert.NotContains(t, r, "first_oom")
}

func TestCompareJSONAndWidth(t *testing.T) {
	long := "max_split_size_mb:128,roundup_power2_divisions:[256:1,512:2,1024:4,>:8],garbage_collection_threshold:0.6,per_process_memory_fraction:0.9"
	out, errOut, code := runCmd(t, "compare", "--conf", "", "--conf", long, "--conf", "expandable_segments:True", "--capacity", "10GiB", "testdata/small.trace.gz")
	require.Equal(t, 0, code, errOut)
	assert.Contains(t, out, "4: first out of memory", "the trace needs 10.47 GiB: every configuration runs out, and its note fits the width")
	for _, line := range strings.Split(out, "\n") {
		assert.LessOrEqual(t, len([]rune(line)), 100, "%q", line)
	}
	out, errOut, code = runCmd(t, "compare", "--conf", "", "--conf", long, "--conf", "expandable_segments:True", "--capacity", "4GiB", "testdata/small.trace.gz")
	require.Equal(t, 0, code, errOut)
	for _, line := range strings.Split(out, "\n") {
		assert.LessOrEqual(t, len([]rune(line)), 100, "%q", line)
	}
	assert.Contains(t, out, "peak reserved")
	assert.Contains(t, out, "  1  baseline (no cache)")
	assert.Contains(t, out, "\noffline best: ")
	assert.Contains(t, out, "vs offline")

	out, errOut, code = runCmd(t, "compare", "--json", "--conf", "", "--conf", "expandable_segments:True", "testdata/small.trace.gz")
	require.Equal(t, 0, code, errOut)
	var c compareJSON
	require.NoError(t, json.Unmarshal([]byte(out), &c))
	require.Len(t, c.Results, 3)
	assert.True(t, c.Results[0].Baseline)
	assert.Equal(t, "default", c.Results[1].Label)
	assert.Equal(t, "expandable_segments:True", c.Results[2].Conf)
	assert.EqualValues(t, 80<<30, c.CapacityBytes)
	assert.Positive(t, c.Results[2].PeakReserved)
	require.NotNil(t, c.BoundBytes)
	require.NotNil(t, c.PlannedBytes)
	assert.Positive(t, *c.BoundBytes)
	assert.GreaterOrEqual(t, *c.PlannedBytes, *c.BoundBytes)
	assert.GreaterOrEqual(t, uint64(c.Results[2].PeakReserved), *c.BoundBytes, "no allocator beats the bound")
}

func TestVersion(t *testing.T) {
	// A build with a profile (default.pgo, as go test builds this package
	// unless told -pgo=off) says so.
	pgo := false
	if info, ok := debug.ReadBuildInfo(); ok {
		for _, s := range info.Settings {
			pgo = pgo || s.Key == "-pgo" && s.Value != ""
		}
	}
	for _, args := range [][]string{{"version"}, {"--version"}} {
		out, errOut, code := runCmd(t, args...)
		require.Equal(t, 0, code, errOut)
		assert.Regexp(t, `^gpumem \S+.*, go\d`, out)
		assert.Equal(t, pgo, strings.Contains(out, ", profile-guided"), out)
	}
	_, _, code := runCmd(t, "version", "x")
	assert.Equal(t, 2, code)
}

// TestHelpSpellsFlagsAsUsage checks that each command's synopsis and its
// flag help name the same flags the same way.
func TestHelpSpellsFlagsAsUsage(t *testing.T) {
	for name := range commands {
		if name == "version" {
			continue
		}
		_, errOut, code := runCmd(t, name, "--help")
		require.Equal(t, 0, code, name)
		lines := strings.Split(errOut, "\n")
		require.True(t, strings.HasPrefix(lines[0], "Usage: gpumem "+name), name)
		synopsis := map[string]bool{}
		for _, f := range strings.Fields(strings.NewReplacer("[", " ", "]", " ", "|", " ").Replace(lines[0])) {
			if strings.HasPrefix(f, "-") {
				synopsis[f] = true
			}
		}
		help := map[string]bool{}
		for _, l := range lines[1:] {
			if strings.HasPrefix(l, "  -") {
				help[strings.Fields(l)[0]] = true
			}
		}
		for f := range help {
			if name == "estimate" {
				continue // its synopsis lists model flags with "..."
			}
			assert.True(t, synopsis[f], "%s: %s in the help, not in the synopsis", name, f)
		}
		for f := range synopsis {
			assert.True(t, help[f], "%s: %s in the synopsis, not in the help", name, f)
		}
		assert.NotRegexp(t, `(?m)^  -[a-z][a-z]`, errOut, "%s: a long flag with one dash", name)
	}
}

// TestCompareWithoutOfflineBest compares a trace the offline packing
// refuses (its sizes sum past 2^64 - 1 bytes; a replay counts that
// allocation as out of memory): the comparison runs as before, and says
// why there is no offline best.
func TestCompareWithoutOfflineBest(t *testing.T) {
	path := filepath.Join(t.TempDir(), "huge.trace")
	writeFile(t, path, "a 1 18446744073709551615\na 2 100\nf 2\n")
	out, errOut, code := runCmd(t, "compare", "--conf", "", path)
	require.Equal(t, 0, code, errOut)
	assert.Contains(t, out, "\noffline best: none: offline: op 1 (a 1 18446744073709551615 0): the trace's sizes sum past 2^64 - 1 bytes\n")
	assert.Regexp(t, `\n +2 +1 .* - +`, out, "no multiple of the offline best")
	out, errOut, code = runCmd(t, "compare", "--json", "--conf", "", path)
	require.Equal(t, 0, code, errOut)
	assert.NotContains(t, out, "bound_bytes")
	assert.NotContains(t, out, "planned_bytes")
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

// The time columns of compare's table keep their widths however slow the
// run was, so that a loaded machine cannot push a row past 100 columns.
func TestCompareTimeColumnsKeepTheirWidth(t *testing.T) {
	for _, ns := range []float64{0, 12.4, 99999.4, 99999.5, 123456, 1e9, 99999e3, 99999.6e3, 1e15} {
		assert.LessOrEqual(t, len(shortNs(ns)), len("ns/op"), "%v", ns)
	}
	assert.Equal(t, "99999", shortNs(99999.4))
	assert.Equal(t, "123k", shortNs(123456))
	for _, s := range []float64{0, 1e-7, 0.000999999, 0.0123456, 0.999999, 1.5, 59.99, 3600} {
		assert.LessOrEqual(t, len([]rune(shortDuration(s))), len("device time"), "%v", s)
	}
}
