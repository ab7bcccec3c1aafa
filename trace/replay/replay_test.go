package replay

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpumem/gpumem/allocator"
	"github.com/gpumem/gpumem/device/sim"
	"github.com/gpumem/gpumem/gpumemtest"
	"github.com/gpumem/gpumem/internal/ctxtest"
	"github.com/gpumem/gpumem/internal/simtest"
	"github.com/gpumem/gpumem/stats"
	"github.com/gpumem/gpumem/trace"
)

// counts are the counts of a replay that both PyTorch's expectations and
// gpumem's pinned figures hold.
type counts struct {
	Ops           int64 `json:"ops"`
	Allocs        int64 `json:"allocs"`
	OOMs          int64 `json:"ooms"`
	PeakRequested int64 `json:"peak_requested_bytes"`
	PeakAllocated int64 `json:"peak_allocated_bytes"`
	PeakReserved  int64 `json:"peak_reserved_bytes"`
}

// countsOf returns a replay's counts.
func countsOf(res *Result) counts {
	return counts{res.Ops, res.Alloc, res.OOMs, res.PeakRequested, res.PeakAllocated, res.PeakReserved}
}

// expectation is what PyTorch 2.6.0's own caching allocator reported after
// replaying a trace on a simulated device with the same address rule as
// device/sim (testdata/pytorch/*.pytorch-2.6.json).
type expectation struct {
	Trace    string `json:"trace"`
	Conf     string `json:"conf"`
	Capacity uint64 `json:"capacity"`
	counts
	Stats map[string]int64 `json:"stats"`
}

// The simulated device holds streams, as the format's stream rule needs.
var _ StreamHolder = (*sim.Device)(nil)

// newAllocator returns an allocator with cfg on a fresh simulated device
// of capacity bytes (0: the default), from the project's fixture: its
// invariants are checked when the test ends. A replay may end with blocks
// allocated, so they are not reported.
func newAllocator(t gpumemtest.TB, capacity uint64, cfg allocator.Config) (*allocator.Allocator, *sim.Device) {
	t.Helper()
	a := gpumemtest.New(t, gpumemtest.WithCapacity(capacity), gpumemtest.WithConfig(cfg), gpumemtest.AllowLeaks())
	return a, a.Device().(*sim.Device)
}

func replayPath(t *testing.T, path string, target func(*sim.Device) Target, capacity uint64) *Result {
	t.Helper()
	r, err := trace.Open(path)
	require.NoError(t, err)
	defer r.Close()
	dev := simtest.New(t, simtest.Capacity(capacity))
	res, err := Run(r, target(dev), dev, Options{Name: filepath.Base(path)})
	require.NoError(t, err)
	return res
}

// replayConf replays the trace file at path on a fresh allocator with cfg
// over a simulated device of capacity bytes, and returns the result and
// the allocator.
func replayConf(t *testing.T, path string, cfg allocator.Config, capacity uint64) (*Result, *allocator.Allocator) {
	t.Helper()
	var a *allocator.Allocator
	res := replayPath(t, path, func(dev *sim.Device) Target {
		a = gpumemtest.NewOn(t, dev, gpumemtest.WithConfig(cfg), gpumemtest.AllowLeaks())
		return a
	}, capacity)
	return res, a
}

// TestFidelityWithPyTorch replays every trace that has a PyTorch 2.6
// expectation and requires every memory_stats key, the peaks and the OOM
// count to be equal. It also pins every allocation decision: a change that
// moves a segment or a device call shows up here.
func TestFidelityWithPyTorch(t *testing.T) {
	files, err := filepath.Glob("testdata/pytorch/*.pytorch-2.6.json")
	require.NoError(t, err)
	require.NotEmpty(t, files)
	for _, f := range files {
		t.Run(strings.TrimSuffix(filepath.Base(f), ".pytorch-2.6.json"), func(t *testing.T) {
			b, err := os.ReadFile(f)
			require.NoError(t, err)
			var exp expectation
			require.NoError(t, json.Unmarshal(b, &exp))
			name := strings.SplitN(filepath.Base(f), ".", 2)[0]
			path := filepath.Join("testdata/pytorch", name+".trace.gz")
			cfg, err := allocator.ParseConf(exp.Conf)
			require.NoError(t, err)
			res, a := replayConf(t, path, cfg, exp.Capacity)
			require.NoError(t, a.CheckInvariants())
			assert.Equal(t, exp.counts, countsOf(res))
			require.Len(t, res.Stats, len(exp.Stats))
			for k, v := range exp.Stats {
				assert.Equal(t, v, res.Stats[k], "stats[%s]", k)
			}
		})
	}
}

var updatePinned = flag.Bool("pinned.update", false, "rewrite testdata/pinned from the current code (after checking that a change of decisions is meant)")

// pinned is what TestDecisionsPinned compares: every count of a replay
// that an allocation decision moves. (JSON writes the embedded counts'
// fields first, in their order, as the files in testdata/pinned hold
// them.)
type pinned struct {
	counts
	DeviceAllocs int64            `json:"device_allocs"`
	DeviceFrees  int64            `json:"device_frees"`
	Stats        map[string]int64 `json:"stats"`
}

// TestDecisionsPinned pins gpumem's decisions where no PyTorch
// expectation does (TestFidelityWithPyTorch pins the default and
// max_split_size modes): expandable segments, with and without
// max_split_size, and the low_fragmentation policy, on four traces, with
// room to spare and on a device small enough that the out-of-memory
// ladder runs. The files in testdata/pinned were written by this code
// (-pinned.update) when the index of expandable segments moved from a
// B+ tree to size classes, after every stat of `gpumem replay` was found
// identical between the two on these traces and more; a change that
// moves a segment, a page or a device call in these modes shows up here.
func TestDecisionsPinned(t *testing.T) {
	traces := []string{
		"testdata/random_mixed_2000.trace.gz",
		"testdata/bert_b2.trace.gz",
		"testdata/EoR_NN_cnn_counterfactuals.trace.gz",
		"testdata/pytorch/pub_cs336_MAGMA27_lm_fwdbwd.trace.gz",
	}
	confs := []struct{ name, conf string }{
		{"expandable", "expandable_segments:True"},
		{"expandable_split128", "expandable_segments:True,max_split_size_mb:128"},
		{"policy", "gpumem_policy:low_fragmentation"},
	}
	capacities := []uint64{80 << 30, 1500 << 20}
	for _, path := range traces {
		for _, c := range confs {
			for _, capacity := range capacities {
				name := fmt.Sprintf("%s.%s.%dMiB", strings.SplitN(filepath.Base(path), ".", 2)[0], c.name, capacity>>20)
				t.Run(name, func(t *testing.T) {
					cfg, err := allocator.ParseConf(c.conf)
					require.NoError(t, err)
					res, a := replayConf(t, path, cfg, capacity)
					require.NoError(t, a.CheckInvariants())
					got := pinned{countsOf(res), res.DeviceAllocs, res.DeviceFrees, res.Stats}
					file := filepath.Join("testdata/pinned", name+".json")
					if *updatePinned {
						b, err := json.MarshalIndent(got, "", "\t")
						require.NoError(t, err)
						require.NoError(t, os.MkdirAll(filepath.Dir(file), 0o755))
						require.NoError(t, os.WriteFile(file, append(b, '\n'), 0o644))
						return
					}
					b, err := os.ReadFile(file)
					require.NoError(t, err, "no pinned figures: run with -pinned.update once the decisions are checked")
					var want pinned
					require.NoError(t, json.Unmarshal(b, &want))
					assert.Equal(t, want, got)
				})
			}
		}
	}
}

func replayString(t *testing.T, text string, capacity uint64, cfg allocator.Config) (*Result, *allocator.Allocator, *sim.Device, error) {
	t.Helper()
	r, err := trace.NewReader(strings.NewReader(text))
	require.NoError(t, err)
	a, dev := newAllocator(t, capacity, cfg)
	res, err := Run(r, a, dev, Options{})
	return res, a, dev, err
}

func TestReplayContinuesPastOutOfMemory(t *testing.T) {
	res, a, dev, err := replayString(t, `# memtrace v1
a 0 60000000
a 1 60000000
a 2 1000
f 1
f 0
f 2
a 1 1000
`, 100<<20, allocator.Config{})
	require.NoError(t, err)
	assert.EqualValues(t, 1, res.OOMs)
	assert.EqualValues(t, 4, res.Alloc)
	assert.EqualValues(t, 2, res.Frees, "f 0 and f 2; the free of the failed block is skipped")
	assert.EqualValues(t, 7, res.Ops)
	assert.EqualValues(t, 1, res.Stats["num_ooms"])
	assert.Zero(t, res.DeviceSeconds, "the device clock is the caller's to read")
	require.NoError(t, a.CheckInvariants())
	assert.EqualValues(t, 60<<20, dev.BytesInUse(), "a 58 MiB segment and a 2 MiB one")
}

// TestReplayReportsThePlan: under the planned policy, Result.Plan holds
// its figures: here a step of two allocations marked four times, the
// second repeating the first, planned at the third mark and the last two
// served from its arena. Under another policy, Plan is nil.
func TestReplayReportsThePlan(t *testing.T) {
	var b strings.Builder
	b.WriteString("# memtrace v1\n")
	for k := range 4 {
		fmt.Fprintf(&b, "m step\na %d 3000000\na %d 5000\nf %d\nf %d\n", 2*k, 2*k+1, 2*k, 2*k+1)
	}
	res, _, _, err := replayString(t, b.String(), 1<<30, allocator.Config{Policy: allocator.PolicyPlanned})
	require.NoError(t, err)
	require.NotNil(t, res.Plan)
	assert.EqualValues(t, 1, res.Plan.Plans)
	assert.EqualValues(t, 4, res.Plan.Served)
	assert.Zero(t, res.Plan.Departures)
	assert.NotZero(t, res.Plan.ArenaBytes)
	res, _, _, err = replayString(t, b.String(), 1<<30, allocator.Config{Policy: allocator.PolicyLowFragmentation})
	require.NoError(t, err)
	assert.Nil(t, res.Plan)
}

// TestReplayOOMOption: Options.OOM is called at each allocation that runs
// out of memory, with its number among the a lines, on run's fast path
// (stream 0, a small ID) and on apply's (another stream, an ID past the
// dense table).
func TestReplayOOMOption(t *testing.T) {
	r, err := trace.NewReader(strings.NewReader("a 0 60000000\na 1 60000000\na 2 1000\na 5000000 60000000 1\nf 1\nf 5000000\nf 0\nf 2\n"))
	require.NoError(t, err)
	a, dev := newAllocator(t, 100<<20, allocator.Config{})
	var seen []int64
	res, err := Run(r, a, dev, Options{OOM: func(err error, alloc int64) {
		var oom *allocator.OutOfMemoryError // the allocator's own error, which matches device.ErrOutOfMemory
		assert.ErrorAs(t, err, &oom)
		seen = append(seen, alloc)
	}})
	require.NoError(t, err)
	assert.Equal(t, []int64{2, 4}, seen)
	assert.EqualValues(t, 2, res.OOMs)
	assert.EqualValues(t, 2, res.Frees, "the frees of the failed blocks are skipped")
}

func TestReplayErrorsNameTheLine(t *testing.T) {
	for _, c := range []struct{ text, want string }{
		{"a 0 10\nf 1\n", `line 2: "f 1": ID 1 is not live`},
		{"a 0 10\na 0 10\n", `line 2: "a 0 10 0": ID 0 is already live`},
		{"a 0 10\nr 3 1\n", `line 2`},
		{"a 0 10\nx\n", `line 2`},
	} {
		_, _, _, err := replayString(t, c.text, 0, allocator.Config{})
		require.Error(t, err, c.text)
		assert.Contains(t, err.Error(), c.want)
	}
}

// TestReplayStreams checks memtrace's stream rules: work on a stream other
// than 0 is pending until an s line for it or an S line, so a block freed
// after an r line is reused only then.
func TestReplayStreams(t *testing.T) {
	trace := `a 0 12000000
r 0 1
f 0
a 1 12000000
s 1
a 2 12000000
f 1
f 2
a 3 100 2
r 3 0
f 3
S
a 4 100 2
f 4
`
	res, a, _, err := replayString(t, trace, 0, allocator.Config{})
	require.NoError(t, err)
	require.NoError(t, a.CheckInvariants())
	// Each 12000000-byte block fills a 12 MiB segment. a 1 cannot reuse
	// block 0 (stream 1 is busy): a second segment. After "s 1", a 2 reuses
	// block 0's segment. Stream 2's block freed after "r 3 0" (stream 0's
	// work completes at once) is reused by a 4.
	assert.EqualValues(t, 3, res.DeviceAllocs, "two large segments and one small segment on stream 2")
	assert.EqualValues(t, 2*(12<<20)+(2<<20), res.PeakReserved)
	res2, _, _, err := replayString(t, trace, 0, allocator.Config{})
	require.NoError(t, err)
	res.ReplaySeconds, res.NsPerOp, res2.ReplaySeconds, res2.NsPerOp = 0, 0, 0, 0
	assert.Equal(t, res, res2, "replays are deterministic")
}

// TestReplayStreamsAreLabels checks that a trace stream's number is only
// its name, below 64 (the replay's table of streams, which its loop reads
// through a mask) and above: trace streams 70 and 6 are two streams, as 7
// and 6 are. A block cached on one is not reused by the other, and a
// block recorded on the other and freed waits for it.
func TestReplayStreamsAreLabels(t *testing.T) {
	const text = `a 0 12000000 6
f 0
a 1 12000000 70
a 2 12000000 6
r 2 70
f 2
a 3 12000000 6
a 4 100 70
r 4 6
f 4
a 5 100 70
`
	res, a, _, err := replayString(t, text, 0, allocator.Config{})
	require.NoError(t, err)
	require.NoError(t, a.CheckInvariants())
	// Block 0's segment is cached on stream 6: a 1 on stream 70 makes
	// its own, a 2 reuses block 0's; freed after "r 2 70", block 2 waits
	// for stream 70, so a 3 makes a third. a 4 makes a small segment on
	// stream 70, and a 5 fits beside block 4, which waits for stream 6.
	// Stream 70's record taken for stream 6's would free block 2 at
	// once, for a 3 to reuse; its allocations taken for stream 6's would
	// change the stats, which the replay with stream 7 for 70 compares.
	assert.EqualValues(t, 4, res.DeviceAllocs)
	res7, _, _, err := replayString(t, strings.ReplaceAll(text, " 70", " 7"), 0, allocator.Config{})
	require.NoError(t, err)
	res.ReplaySeconds, res.NsPerOp, res7.ReplaySeconds, res7.NsPerOp = 0, 0, 0, 0
	assert.Equal(t, res7, res)
}

func TestReplayBaseline(t *testing.T) {
	var p *allocator.Passthrough
	res := replayPath(t, "testdata/random_mixed_2000.trace.gz", func(dev *sim.Device) Target {
		var err error
		p, err = allocator.NewPassthrough(dev)
		require.NoError(t, err)
		return p
	}, 0)
	assert.Equal(t, res.Alloc, res.DeviceAllocs, "every allocation is a device malloc")
	assert.Equal(t, res.Frees, res.DeviceFrees)
	cached, _ := replayConf(t, "testdata/random_mixed_2000.trace.gz", allocator.Config{}, 0)
	assert.Less(t, cached.DeviceAllocs, res.DeviceAllocs/5, "caching saves most device calls")
	assert.Equal(t, res.PeakRequested, cached.PeakRequested)
}

// TestReplayMarks replays a real capture of three training steps, whose
// steps are delimited by "# mark stepN" comments, and reads the allocator
// at each step boundary: the blocks live when a step starts are the same
// in the second and third steps.
func TestReplayMarks(t *testing.T) {
	r, err := trace.Open("testdata/bert_b2.trace.gz")
	require.NoError(t, err)
	defer r.Close()
	a, dev := newAllocator(t, 0, allocator.Config{})
	var marks []string
	opt := Options{Mark: func(name string) {
		st := a.Stats()
		marks = append(marks, fmt.Sprintf("%s: %d live", name, st.Allocation[stats.All].Current))
	}}
	res, err := Run(r, a, dev, opt)
	require.NoError(t, err)
	assert.Equal(t, []string{"step0: 153 live", "step1: 612 live", "step2: 612 live"}, marks)
	assert.EqualValues(t, 7251, res.Ops, "3,624 a, 3,624 f and three marks")

	// Without the callback the marks are skipped and nothing else changes.
	r2, err := trace.Open("testdata/bert_b2.trace.gz")
	require.NoError(t, err)
	defer r2.Close()
	a2, dev2 := newAllocator(t, 0, allocator.Config{})
	res2, err := Run(r2, a2, dev2, Options{})
	require.NoError(t, err)
	assert.Equal(t, res.Stats, res2.Stats)
}

// A replay stops by its context: after the check that sees it done, or
// before the first op.
func TestRunContextStops(t *testing.T) {
	ops, err := trace.ReadFile("testdata/bert_b2.trace.gz")
	require.NoError(t, err)
	require.Greater(t, len(ops), 4*replayBatch)

	a, dev := newAllocator(t, 0, allocator.Config{})
	// A Ctrl-C after the third check.
	res, err := RunContext(ctxtest.NewCountdown(3), trace.SliceReader(ops), a, dev, Options{})
	assert.Nil(t, res)
	require.ErrorIs(t, err, context.Canceled)
	assert.EqualError(t, err, "replay stopped after 3072 ops: context canceled", "three batches, then the check that stops")

	// A context done before the start replays nothing.
	a, dev = newAllocator(t, 0, allocator.Config{})
	done, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = RunContext(done, trace.SliceReader(ops), a, dev, Options{})
	require.ErrorIs(t, err, context.Canceled)
	assert.Zero(t, a.Stats().AllocatedBytes[stats.All].Peak, "nothing replayed")

	// Run is RunContext with a context never done.
	a, dev = newAllocator(t, 0, allocator.Config{})
	full, err := Run(trace.SliceReader(ops), a, dev, Options{})
	require.NoError(t, err)
	assert.Equal(t, int64(len(ops)), full.Ops)
}
