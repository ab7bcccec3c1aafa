package pytorch

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/nlpodyssey/gopickle/types"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpumem/gpumem/allocator"
	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/device/sim"
	"github.com/gpumem/gpumem/gpumemtest"
	"github.com/gpumem/gpumem/trace"
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
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("python3 not installed")
	}
	_, data, a := historyRun(t, 0)
	path := filepath.Join(t.TempDir(), "snapshot.pickle")
	require.NoError(t, os.WriteFile(path, data, 0o644))
	out, err := exec.Command(py, "-c", `
import pickle, sys
d = pickle.load(open(sys.argv[1], "rb"))
segs = d["segments"]
print(len(segs), sum(s["total_size"] for s in segs), len(d["device_traces"][0]), d["allocator_settings"]["max_split_size"], segs[0]["segment_pool_id"])
`, path).CombinedOutput()
	require.NoError(t, err, string(out))
	var reserved uint64
	segs := a.Snapshot()
	for _, s := range segs {
		reserved += s.Size
	}
	assert.Contains(t, string(out), " "+strconv.FormatUint(reserved, 10)+" ")
	assert.Contains(t, string(out), "67108864 (0, 0)")
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

func TestHistorySnapshotCarriesPoolIDs(t *testing.T) {
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("python3 not installed")
	}
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
	path := filepath.Join(t.TempDir(), "snapshot.pickle")
	require.NoError(t, os.WriteFile(path, buf.Bytes(), 0o644))
	out, err := exec.Command(py, "-c", `
import pickle, sys
d = pickle.load(open(sys.argv[1], "rb"))
print(sorted((s["total_size"], s["segment_pool_id"]) for s in d["segments"]))
`, path).CombinedOutput()
	require.NoError(t, err, string(out))
	assert.Equal(t, "[(2097152, (0, 0)), (31457280, (0, 1))]\n", string(out))
}
