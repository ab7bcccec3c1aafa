// Tests of History: the snapshots it writes, read back by this package
// and by Python, their ring buffer, and the call stacks and phases they
// carry.

package pytorch

import (
	"bytes"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/nlpodyssey/gopickle/types"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpumem/gpumem/allocator"
	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/device/sim"
	"github.com/gpumem/gpumem/gpumemtest"
	"github.com/gpumem/gpumem/trace"
	"github.com/gpumem/gpumem/trace/internal/tracetest"
	"github.com/gpumem/gpumem/trace/replay"
)

// historyRun allocates and frees through an allocator with a History
// attached and returns the snapshot it writes.
func historyRun(t *testing.T, maxEntries int) (*History, []byte, *allocator.Allocator) {
	t.Helper()
	a := gpumemtest.New(t, gpumemtest.WithConfig(allocator.Config{MaxSplitSize: 64 << 20}), gpumemtest.AllowLeaks())
	h := NewHistory(maxEntries)
	defer a.Attach(h)()
	var live []device.Ptr
	for i := range 40 {
		p, err := a.Alloc(uint64(i+1)*300_000, 0)
		require.NoError(t, err)
		live = append(live, p)
		if i%3 == 2 {
			require.NoError(t, a.Free(live[0]))
			live = live[1:]
		}
	}
	var buf bytes.Buffer
	require.NoError(t, h.WriteSnapshot(&buf, a))
	return h, buf.Bytes(), a
}

func TestHistorySnapshotReadsBack(t *testing.T) {
	_, data, a := historyRun(t, 0)
	require.NoError(t, scanPickle(data), "only plain-data opcodes")
	im, err := ReadSnapshot(bytes.NewReader(data), SnapshotOptions{})
	require.NoError(t, err)
	// Replaying the imported trace must build the same allocated state.
	b := gpumemtest.New(t, gpumemtest.WithConfig(allocator.Config{MaxSplitSize: 64 << 20}), gpumemtest.AllowLeaks())
	var allocs int
	for _, op := range im.Ops {
		if op.Kind == trace.Alloc {
			allocs++
		}
	}
	assert.Equal(t, 40, allocs)
	_, err = replay.Run(trace.SliceReader(im.Ops), b, b.Device().(*sim.Device), replay.Options{})
	require.NoError(t, err)
	assert.Equal(t, a.Stats().RequestedBytes[0].Peak, b.Stats().RequestedBytes[0].Peak)
}

func TestHistoryRingBuffer(t *testing.T) {
	h, data, _ := historyRun(t, 10)
	assert.Equal(t, 10, h.Entries())
	v, err := loadPickle(data)
	require.NoError(t, err)
	top := v.(*types.Dict)
	tv, ok := dictGet(top, "device_traces")
	require.True(t, ok)
	traces, ok := asList(tv)
	require.True(t, ok)
	require.Len(t, traces, 1)
	entries, ok := asList(traces[0])
	require.True(t, ok)
	require.Len(t, entries, 10, "only the last 10 entries are kept")
	var last uint64
	for _, e := range entries {
		ts, err := dictUint(e.(*types.Dict), "time_us")
		require.NoError(t, err)
		assert.GreaterOrEqual(t, ts, last, "oldest first")
		last = ts
	}
}

// TestHistorySnapshotLoadsInPython checks the pickle with Python's own
// unpickler, when Python is installed.
func TestHistorySnapshotLoadsInPython(t *testing.T) {
	_, data, a := historyRun(t, 0)
	out := runPythonOn(t, `
import pickle, sys
d = pickle.load(open(sys.argv[1], "rb"))
segs = d["segments"]
print(len(segs), sum(s["total_size"] for s in segs), len(d["device_traces"][0]), d["allocator_settings"]["max_split_size"], segs[0]["segment_pool_id"])
`, data)
	var reserved uint64
	segs := a.Snapshot()
	for _, s := range segs {
		reserved += s.Size
	}
	assert.Contains(t, out, " "+strconv.FormatUint(reserved, 10)+" ")
	assert.Contains(t, out, "67108864 (0, 0)")
}

func TestPickleEncoderIntegers(t *testing.T) {
	for _, v := range []any{0, 1, -1, 255, 256, int64(1) << 31, int64(-1) << 31, int64(-1)<<31 - 1, int64(1<<63 - 1), int64(-1 << 63), uint64(1<<64 - 1), 3.5, "héllo", true, false, nil} {
		data, err := encodePickle(v)
		require.NoError(t, err)
		require.NoError(t, scanPickle(data))
		got, err := loadPickle(data)
		require.NoError(t, err, "%v", v)
		switch x := v.(type) {
		case int, int64:
			want := fmt.Sprint(x)
			assert.Equal(t, want, fmt.Sprint(got), "%v", v)
		case uint64:
			assert.Equal(t, "18446744073709551615", fmt.Sprint(got))
		default:
			assert.Equal(t, v, got)
		}
	}
	_, err := encodePickle(struct{}{})
	assert.Error(t, err)
}

//go:noinline
func allocateForward(t *testing.T, a *allocator.Allocator, n int) []device.Ptr {
	var ps []device.Ptr
	for range n {
		p, err := a.Alloc(3<<20, 0)
		require.NoError(t, err)
		ps = append(ps, p)
	}
	return ps
}

//go:noinline
func allocateBackward(t *testing.T, a *allocator.Allocator) device.Ptr {
	p, err := a.Alloc(4096, 0)
	require.NoError(t, err)
	return p
}

// stacksRun allocates in two phases with a History attached and returns
// its snapshot.
func stacksRun(t *testing.T, opt HistoryOptions, phases bool, forward int) []byte {
	t.Helper()
	a := gpumemtest.New(t, gpumemtest.AllowLeaks())
	h := NewHistoryWith(opt)
	defer a.Attach(h)()
	if phases {
		a.SetPhase("forward")
	}
	fwd := allocateForward(t, a, forward)
	if phases {
		a.SetPhase("backward")
	}
	allocateBackward(t, a)
	require.NoError(t, a.Free(fwd[0]))
	var buf bytes.Buffer
	require.NoError(t, h.WriteSnapshot(&buf, a))
	require.NoError(t, scanPickle(buf.Bytes()), "only plain-data opcodes")
	return buf.Bytes()
}

func dictList(t *testing.T, d *types.Dict, key string) []any {
	t.Helper()
	v, ok := dictGet(d, key)
	require.True(t, ok, key)
	l, ok := asList(v)
	require.True(t, ok, key)
	return l
}

func frameNames(t *testing.T, frames []any) []string {
	t.Helper()
	var names []string
	for _, f := range frames {
		fd := f.(*types.Dict)
		name, err := dictString(fd, "name")
		require.NoError(t, err)
		file, err := dictString(fd, "filename")
		require.NoError(t, err)
		line, err := dictUint(fd, "line")
		require.NoError(t, err)
		assert.NotZero(t, line)
		names = append(names, name+"@"+filepath.Base(file))
	}
	return names
}

func TestHistoryStacksBecomeFrames(t *testing.T) {
	v, err := loadPickle(stacksRun(t, HistoryOptions{Stacks: true}, true, 3))
	require.NoError(t, err)
	top := v.(*types.Dict)
	entries, ok := asList(dictList(t, top, "device_traces")[0])
	require.True(t, ok)
	allocFrames := map[uint64][]string{}
	sawSegment := false
	for _, ev := range entries {
		e := ev.(*types.Dict)
		action, err := dictString(e, "action")
		require.NoError(t, err)
		names := frameNames(t, dictList(t, e, "frames"))
		if action == "snapshot" {
			assert.Empty(t, names, "PyTorch records the snapshot entry without a context")
			continue
		}
		require.NotEmpty(t, names, action)
		for _, n := range names {
			assert.NotContains(t, n, "gpumem/allocator.", "the allocator's own frames are left out")
			assert.NotContains(t, n, "(*History).Observe")
		}
		switch action {
		case "alloc":
			addr, err := dictUint(e, "addr")
			require.NoError(t, err)
			allocFrames[addr] = names
			size, err := dictUint(e, "size")
			require.NoError(t, err)
			want := "allocateForward@history_test.go"
			if size == 4096 {
				want = "allocateBackward@history_test.go"
			}
			assert.Contains(t, names[0], want, "the innermost frame is the caller's")
			assert.Contains(t, strings.Join(names, " "), "stacksRun@history_test.go")
		case "segment_alloc":
			sawSegment = true
			assert.Contains(t, names[0], "allocate")
		case "free_requested", "free_completed":
			assert.Contains(t, names[0], "stacksRun@history_test.go", "a free's stack is the free's")
		}
	}
	assert.True(t, sawSegment)

	active := 0
	for _, sv := range dictList(t, top, "segments") {
		s := sv.(*types.Dict)
		assert.NotEmpty(t, dictList(t, s, "frames"), "a segment has the stack of its device allocation")
		for _, bv := range dictList(t, s, "blocks") {
			b := bv.(*types.Dict)
			state, err := dictString(b, "state")
			require.NoError(t, err)
			names := frameNames(t, dictList(t, b, "frames"))
			if state == "inactive" {
				assert.Empty(t, names)
				continue
			}
			active++
			addr, err := dictUint(b, "address")
			require.NoError(t, err)
			assert.Equal(t, allocFrames[addr], names, "an active block has the stack of its allocation")
		}
	}
	assert.Equal(t, 3, active)
}

func TestHistoryPhasesAsCategories(t *testing.T) {
	v, err := loadPickle(stacksRun(t, HistoryOptions{}, true, 2))
	require.NoError(t, err)
	entries, ok := asList(dictList(t, v.(*types.Dict), "device_traces")[0])
	require.True(t, ok)
	got := map[string]string{}
	for _, ev := range entries {
		e := ev.(*types.Dict)
		action, _ := dictString(e, "action")
		meta, err := dictString(e, "user_metadata")
		require.NoError(t, err)
		cat, err := dictString(e, "category")
		require.NoError(t, err)
		size, _ := dictUint(e, "size")
		if (action == "alloc" && size == 4096) || (action == "segment_alloc" && size == 2<<20) {
			assert.Equal(t, "backward", meta)
			assert.Equal(t, "backward", cat)
		} else if action == "alloc" || action == "free_completed" || action == "segment_alloc" {
			assert.Equal(t, "forward", meta, action)
			assert.Equal(t, "forward", cat, action)
		}
		assert.Empty(t, frameNames(t, dictList(t, e, "frames")), "no stacks asked for")
		got[action] = cat
	}
	assert.Equal(t, unknownCategory, got["snapshot"], "the visualizer needs the unknown category")
	assert.Equal(t, "backward", entries[len(entries)-1].(*types.Dict).MustGet("user_metadata"), "the snapshot entry has the current phase")

	// Without phases there are no categories, and the visualizer colors
	// each allocation apart, as for PyTorch's own snapshots.
	v, err = loadPickle(stacksRun(t, HistoryOptions{}, false, 2))
	require.NoError(t, err)
	entries, _ = asList(dictList(t, v.(*types.Dict), "device_traces")[0])
	for _, ev := range entries {
		_, ok := dictGet(ev.(*types.Dict), "category")
		assert.False(t, ok)
	}
}

// Equal stacks and frames are written once: a thousand allocations from
// one call site cost a few bytes each for their frames.
func TestHistoryFramesAreShared(t *testing.T) {
	plain := stacksRun(t, HistoryOptions{}, false, 1000)
	stacks := stacksRun(t, HistoryOptions{Stacks: true}, false, 1000)
	perEntry := float64(len(stacks)-len(plain)) / 3000 // alloc, free_requested, free_completed and segment entries
	assert.Less(t, perEntry, 4.0, "frames cost %.1f bytes per entry", perEntry)
}

// Python's unpickler reads the frames as shared objects, and the
// visualizer's categories include "unknown".
func TestHistoryFramesLoadInPython(t *testing.T) {
	out := runPythonOn(t, `
import pickle, sys
d = pickle.load(open(sys.argv[1], "rb"))
allocs = [e for e in d["device_traces"][0] if e["action"] == "alloc"]
blocks = {b["address"]: b for s in d["segments"] for b in s["blocks"] if b["state"] == "active_allocated"}
f = allocs[1]["frames"]
print(f[0]["name"].rsplit(".", 1)[1], f is allocs[2]["frames"], f is blocks[allocs[1]["addr"]]["frames"])
print(sorted({e.get("category") for e in d["device_traces"][0]}))
`, stacksRun(t, HistoryOptions{Stacks: true}, true, 5))
	assert.Equal(t, "allocateForward True True\n['backward', 'forward', 'unknown']\n", out)
}

// The two-pass snapshot at the peak: the snapshot written after replaying
// up to Result.PeakOp holds exactly the peak's allocated bytes in its
// allocated blocks, as torch.cuda.max_memory_allocated counts them.
func TestSnapshotAtPeak(t *testing.T) {
	ops := tracetest.ReadFile(t, "testdata/pub_cs336_MAGMA27_lm_fwdbwd.trace.gz")
	replayOn := func(opt replay.Options, h *History) (*replay.Result, *allocator.Allocator) {
		a := gpumemtest.New(t, gpumemtest.AllowLeaks())
		dev := a.Device().(*sim.Device)
		if h != nil {
			defer a.Attach(h)()
		}
		res, err := replay.Run(trace.SliceReader(ops), a, dev, opt)
		require.NoError(t, err)
		return res, a
	}
	full, end := replayOn(replay.Options{Peak: true}, nil)
	require.Positive(t, full.PeakOp)
	require.Less(t, full.PeakOp, full.Ops)
	assert.Zero(t, end.Stats().AllocatedBytes[0].Current, "the trace ends with everything freed")

	h := NewHistory(0)
	at, a := replayOn(replay.Options{StopAfter: full.PeakOp}, h)
	assert.Equal(t, full.PeakOp, at.Ops)
	var buf bytes.Buffer
	require.NoError(t, h.WriteSnapshot(&buf, a))
	v, err := loadPickle(buf.Bytes())
	require.NoError(t, err)
	var allocated, blocks uint64
	for _, sv := range dictList(t, v.(*types.Dict), "segments") {
		for _, bv := range dictList(t, sv.(*types.Dict), "blocks") {
			b := bv.(*types.Dict)
			if state, _ := dictString(b, "state"); state == "active_allocated" {
				size, err := dictUint(b, "size")
				require.NoError(t, err)
				allocated += size
				blocks++
			}
		}
	}
	assert.EqualValues(t, full.PeakAllocated, allocated, "the snapshot is taken at the peak")
	assert.Positive(t, blocks)
}

// Snapshots can be written while other goroutines allocate.
func TestHistoryConcurrentSnapshots(t *testing.T) {
	a := gpumemtest.New(t, gpumemtest.AllowLeaks())
	h := NewHistoryWith(HistoryOptions{MaxEntries: 500, Stacks: true})
	defer a.Attach(h)()
	done := make(chan struct{})
	for g := range 4 {
		go func() {
			defer func() { done <- struct{}{} }()
			for i := range 300 {
				p, err := a.Alloc(uint64(g*1000+i+1)*512, 0)
				if err != nil {
					return
				}
				if err := a.Free(p); err != nil {
					return
				}
			}
		}()
	}
	for range 5 {
		var buf bytes.Buffer
		require.NoError(t, h.WriteSnapshot(&buf, a))
		_, err := loadPickle(buf.Bytes())
		require.NoError(t, err)
	}
	for range 4 {
		<-done
	}
	assert.Equal(t, 500, h.Entries())
}

func TestHistorySnapshotCarriesPoolIDs(t *testing.T) {
	a := gpumemtest.New(t, gpumemtest.AllowLeaks())
	p, err := a.NewPool("kv", allocator.PoolOptions{})
	require.NoError(t, err)
	_, err = a.Alloc(4096, 0)
	require.NoError(t, err)
	require.NoError(t, a.UsePool(p, 0))
	_, err = a.Alloc(30<<20, 0)
	require.NoError(t, err)
	require.NoError(t, a.UseDefaultPool(0))
	var buf bytes.Buffer
	require.NoError(t, NewHistory(0).WriteSnapshot(&buf, a))
	out := runPythonOn(t, `
import pickle, sys
d = pickle.load(open(sys.argv[1], "rb"))
print(sorted((s["total_size"], s["segment_pool_id"]) for s in d["segments"]))
`, buf.Bytes())
	assert.Equal(t, "[(2097152, (0, 0)), (31457280, (0, 1))]\n", out)
}
