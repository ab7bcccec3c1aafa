package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// plantedLeak: weights loaded once, activations freed every step, and one
// 4 KiB block per step kept by a list that is never cleared.
const plantedLeak = `t load
a 1 8388608
m step1
t forward
a 10 6291456
a 100 4096
t backward
f 10
m step2
t forward
a 10 6291456
a 101 4096
t backward
f 10
m step3
t forward
a 10 6291456
a 102 4096
t backward
f 10
m step4
`

func writeTrace(t *testing.T, text string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "t.trace")
	require.NoError(t, os.WriteFile(path, []byte(text), 0o644))
	return path
}

func TestReplayPhasesAndLeaksJSON(t *testing.T) {
	path := writeTrace(t, plantedLeak)
	var out, errOut bytes.Buffer
	require.Zero(t, run([]string{"replay", "--json", "--phases", "--leaks", path}, &out, &errOut), errOut.String())
	var got struct {
		Phases map[string]struct {
			Peak   int64 `json:"peak_allocated_bytes"`
			Allocs int64 `json:"allocs"`
		} `json:"phases"`
		Leaks []struct {
			Phase string `json:"phase"`
			Size  uint64 `json:"size_bytes"`
			Count int64  `json:"count"`
		} `json:"leaks"`
	}
	require.NoError(t, json.Unmarshal(out.Bytes(), &got))
	assert.EqualValues(t, 8388608, got.Phases["load"].Peak)
	assert.EqualValues(t, 6291456+3*4096, got.Phases["forward"].Peak)
	assert.EqualValues(t, 6, got.Phases["forward"].Allocs)
	require.Len(t, got.Leaks, 1)
	assert.Equal(t, "forward", got.Leaks[0].Phase)
	assert.EqualValues(t, 4096, got.Leaks[0].Size)
	assert.EqualValues(t, 3, got.Leaks[0].Count)

	out.Reset()
	require.Zero(t, run([]string{"replay", "--json", path}, &out, &errOut))
	assert.NotContains(t, out.String(), `"phases"`, "only when asked")
	assert.NotContains(t, out.String(), `"leaks"`)

	out.Reset()
	require.Zero(t, run([]string{"replay", "--phases", "--leaks", "--summary", path}, &out, &errOut))
	assert.Contains(t, out.String(), `phase "forward": 3 blocks of 4096 bytes`)
	assert.Contains(t, out.String(), "Memory by phase")
	assert.Contains(t, out.String(), "possible leaks")
}

func TestReplayNoLeakIsAnEmptyList(t *testing.T) {
	var out, errOut bytes.Buffer
	require.Zero(t, run([]string{"replay", "--json", "--leaks", "testdata/bert_b2.trace.gz"}, &out, &errOut), errOut.String())
	assert.Contains(t, out.String(), `"leaks":[]`)
}

func TestReplayOOMNamesItsPhase(t *testing.T) {
	path := writeTrace(t, "t forward\na 1 104857600\nt backward\na 2 104857600\n")
	var out, errOut bytes.Buffer
	require.Zero(t, run([]string{"replay", "--capacity", "150MiB", path}, &out, &errOut), errOut.String())
	assert.Contains(t, out.String(), `failed in phase "backward"`)
}

func TestReplaySnapshotAtPeak(t *testing.T) {
	dir := t.TempDir()
	snap := filepath.Join(dir, "peak.pickle")
	var out, errOut bytes.Buffer
	require.Zero(t, run([]string{"replay", "--json", "--snapshot", snap, "--snapshot-at", "peak", "testdata/bert_b2.trace.gz"}, &out, &errOut), errOut.String())
	var res struct {
		PeakAllocated int64 `json:"peak_allocated_bytes"`
		PeakOp        int64 `json:"peak_op"`
	}
	require.NoError(t, json.Unmarshal(out.Bytes(), &res))
	require.Positive(t, res.PeakOp)
	// The snapshot's allocated blocks add up to the peak.
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("python3 is not installed: the snapshot is not read back")
	}
	sum, err := exec.Command(py, "-c", `import pickle,sys
d = pickle.load(open(sys.argv[1], "rb"))
print(sum(b["size"] for s in d["segments"] for b in s["blocks"] if b["state"] == "active_allocated"))`, snap).Output()
	require.NoError(t, err)
	assert.Equal(t, strconv.FormatInt(res.PeakAllocated, 10), strings.TrimSpace(string(sum)))

}

func TestReplaySnapshotAtBadUse(t *testing.T) {
	snap := filepath.Join(t.TempDir(), "peak.pickle")
	var out, errOut bytes.Buffer
	for _, args := range [][]string{
		{"replay", "--snapshot", snap, "--snapshot-at", "middle", "testdata/bert_b2.trace.gz"},
		{"replay", "--snapshot-at", "peak", "testdata/bert_b2.trace.gz"},
		{"replay", "--baseline", "--phases", "testdata/bert_b2.trace.gz"},
	} {
		errOut.Reset()
		assert.Equal(t, 2, run(args, &out, &errOut), args)
		assert.Equal(t, 1, strings.Count(errOut.String(), "\n"), errOut.String())
	}
}

// TestTrailingGarbageWarns: a gzip trace with garbage after its data is
// replayed (and converted) as gzip(1) reads it, with a warning on
// standard error.
func TestTrailingGarbageWarns(t *testing.T) {
	data, err := os.ReadFile("testdata/small.trace.gz")
	require.NoError(t, err)
	path := filepath.Join(t.TempDir(), "t.trace.gz")
	require.NoError(t, os.WriteFile(path, append(data, "garbage!"...), 0o644))
	for _, args := range [][]string{{"replay", path}, {"convert", path}} {
		var out, errOut bytes.Buffer
		require.Zero(t, run(args, &out, &errOut), errOut.String())
		assert.Contains(t, errOut.String(), "warning:", args)
		assert.Contains(t, errOut.String(), "trailing garbage ignored", args)
		assert.Equal(t, 1, strings.Count(dropConfLine(errOut.String()), "\n"), args)
	}
}

// TestReplayPhasesInOrderOfFirstUse: the phase list follows the trace,
// not the alphabet; the leak report says when its counts were taken.
func TestReplayPhasesInOrderOfFirstUse(t *testing.T) {
	path := filepath.Join(t.TempDir(), "p.trace")
	var b strings.Builder
	b.WriteString("# memtrace v1 source=test\n")
	id := 0
	for step := range 3 {
		fmt.Fprintf(&b, "m step%d\nt zeta\na %d 1048576\nt alpha\na %d 2048\nf %d\nt middle\na %d 4096\nf %d\n", step, id, id+1, id+1, id+2, id+2)
		id += 3
	}
	require.NoError(t, os.WriteFile(path, []byte(b.String()), 0o644))
	out, errOut, code := runCmd(t, "replay", "--phases", "--leaks", path)
	require.Equal(t, 0, code, errOut)
	assert.Regexp(t, `(?s)phases, in order of first use .*\n  zeta .*\n  alpha .*\n  middle `, out)
	assert.Contains(t, out, "counts at the last boundary, not at the end of the trace")
	assert.Contains(t, out, `phase "zeta": 2 blocks of 1048576 bytes alive at the last step boundary`)

	out, errOut, code = runCmd(t, "replay", "--json", "--phases", path)
	require.Equal(t, 0, code, errOut)
	var j struct {
		Order []string `json:"phase_order"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &j))
	assert.Equal(t, []string{"zeta", "alpha", "middle"}, j.Order)
}

// --history without --snapshot is refused: it was silently ignored.
func TestHistoryNeedsSnapshot(t *testing.T) {
	_, errOut, code := runCmd(t, "replay", "--history", "5", "testdata/small.trace.gz")
	assert.Equal(t, 2, code)
	assert.Contains(t, errOut, "--history needs --snapshot")
}
