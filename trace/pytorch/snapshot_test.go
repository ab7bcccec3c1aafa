// Tests of ReadSnapshot and the safe pickle loader.

package pytorch

import (
	"bytes"
	"compress/gzip"
	"io"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpumem/gpumem/trace"
	"github.com/gpumem/gpumem/trace/internal/tracetest"
)

func readSnapshotFile(t *testing.T, path string, opt SnapshotOptions) (*trace.Import, error) {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	return ReadSnapshot(f, opt)
}

// The importer reproduces, op by op, the shared trace that was converted
// from the same snapshot (here without its stack frames, to keep it small).
func TestSnapshotMatchesSharedTrace(t *testing.T) {
	im, err := readSnapshotFile(t, "testdata/cs336_MAGMA27_lm_fwdbwd.noframes.pickle.gz", SnapshotOptions{})
	require.NoError(t, err)
	want := tracetest.ReadFile(t, "testdata/pub_cs336_MAGMA27_lm_fwdbwd.trace.gz")
	require.Len(t, im.Ops, len(want))
	for i := range want {
		if im.Ops[i] != want[i] {
			t.Fatalf("op %d: got %v, want %v", i, im.Ops[i], want[i])
		}
	}
	assert.Equal(t, 229, im.WindowStart)
	assert.Equal(t, 2, im.PreWindowFreed)
	assert.Equal(t, 227, im.PreWindowLive)
	assert.Equal(t, 5163, im.Events)
	assert.Equal(t, len(want)-229, im.WindowEnd)
	assert.Equal(t, map[string]int{"free_requested": 1721}, im.Ignored)
	assert.Contains(t, strings.Join(im.Notes, "\n"), "'expandable_segments': False")
}

func TestSnapshotEoRValidates(t *testing.T) {
	im, err := readSnapshotFile(t, "testdata/EoR_NN_cnn_counterfactuals.noframes.pickle.gz", SnapshotOptions{})
	require.NoError(t, err)
	assert.Zero(t, tracetest.Live(t, im.Ops), "an import ends with nothing live")
	assert.Equal(t, 5803, im.Events)
	assert.Equal(t, 31, im.WindowStart, "31 blocks active at the end were never allocated in the window")
	assert.Equal(t, 0, im.PreWindowFreed)
	assert.Equal(t, 40, len(im.Ops)-im.WindowEnd, "40 active blocks at the snapshot")
	assert.Equal(t, map[string]int{"free_requested": 1926, "segment_alloc": 7, "snapshot": 9}, im.Ignored)
}

func TestSnapshotEdgeCases(t *testing.T) {
	im, err := readSnapshotFile(t, "testdata/edge.pickle", SnapshotOptions{})
	require.NoError(t, err)
	want := []trace.Op{
		// Up front, by address: the never-seen active block at 0x1000000 and
		// the block freed in the window at 0x3000000 (on a second stream).
		{Kind: trace.Alloc, ID: 0, Size: 500, Stream: 0},
		{Kind: trace.Alloc, ID: 1, Size: 300, Stream: 1},
		// The window.
		{Kind: trace.Alloc, ID: 2, Size: 700, Stream: 0},
		{Kind: trace.Free, ID: 1},
		{Kind: trace.Alloc, ID: 3, Size: 2000, Stream: 2},
		{Kind: trace.Alloc, ID: 4, Size: 4096, Stream: 2},
		{Kind: trace.Free, ID: 2},
		{Kind: trace.Alloc, ID: 5, Size: 100, Stream: 0},
		{Kind: trace.Free, ID: 5},
		// Survivors, by ID: 4 had free_requested without free_completed.
		{Kind: trace.Free, ID: 0},
		{Kind: trace.Free, ID: 3},
		{Kind: trace.Free, ID: 4},
	}
	assert.Equal(t, want, im.Ops)
	assert.Equal(t, 2, im.WindowStart)
	assert.Equal(t, 9, im.WindowEnd)
	assert.Equal(t, 1, im.PreWindowFreed)
	assert.Equal(t, 1, im.PreWindowLive)
	assert.Equal(t, map[string]int{"free_requested": 4, "oom": 1, "segment_alloc": 1,
		"segment_free": 1, "snapshot": 1, "some_future_action": 1}, im.Ignored)
	notes := strings.Join(im.Notes, "\n")
	assert.Contains(t, notes, "1 blocks had free_requested without free_completed")
	assert.Contains(t, notes, "1 out-of-memory events")
	assert.Contains(t, notes, "0x7f0000002000->1 0x7f0000001000->2")
	assert.Zero(t, tracetest.Live(t, im.Ops), "an import ends with nothing live")

	// Device 1 has its own trace and segments.
	im, err = readSnapshotFile(t, "testdata/edge.pickle", SnapshotOptions{Device: 1})
	require.NoError(t, err)
	assert.Equal(t, []trace.Op{{Kind: trace.Alloc, ID: 0, Size: 64}, {Kind: trace.Free, ID: 0}}, im.Ops)
	assert.Equal(t, 0, im.WindowStart)

	_, err = readSnapshotFile(t, "testdata/edge.pickle", SnapshotOptions{Device: 2})
	assert.ErrorContains(t, err, "device 2")
	_, err = readSnapshotFile(t, "testdata/edge.pickle", SnapshotOptions{Device: -1})
	assert.ErrorContains(t, err, "device -1: not a device number")
}

func TestSnapshotEmpty(t *testing.T) {
	im, err := readSnapshotFile(t, "testdata/empty.pickle", SnapshotOptions{})
	require.NoError(t, err)
	assert.Empty(t, im.Ops)
	assert.Zero(t, im.WindowStart)
	assert.Zero(t, im.WindowEnd)
}

func TestSnapshotErrors(t *testing.T) {
	// Neither a trace nor segments: nothing to import.
	_, err := readSnapshotFile(t, "testdata/notrace.pickle", SnapshotOptions{})
	assert.ErrorContains(t, err, "device 0: the snapshot has no device_traces and no segments of that device: nothing to import")
	_, err = readSnapshotFile(t, "testdata/double_alloc.pickle", SnapshotOptions{})
	assert.ErrorContains(t, err, "alloc at 0x1000400, which is live")
}

// A pickle that would run a shell command in Python is refused before
// anything is decoded.
func TestSnapshotRefusesCode(t *testing.T) {
	_, err := readSnapshotFile(t, "testdata/evil.pickle", SnapshotOptions{})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "would build a Python object")
}

func TestLoadPickleHostile(t *testing.T) {
	cases := map[string][]byte{
		"GLOBAL protocol 0":       []byte("cos\nsystem\n(S'echo hi'\ntR."),
		"STACK_GLOBAL":            {0x80, 4, 0x8c, 2, 'o', 's', 0x8c, 6, 's', 'y', 's', 't', 'e', 'm', 0x93, '.'},
		"BINUNICODE past the end": {0x80, 2, 'X', 0xff, 0xff, 0xff, 0x7f, 'a', '.'},
		"BINBYTES8 huge":          {0x80, 4, 0x8e, 0, 0, 0, 0, 0, 0, 0, 0x10, '.'},
		"FRAME past the end":      {0x80, 4, 0x95, 0xff, 0, 0, 0, 0, 0, 0, 0, '.'},
		"LONG4 negative":          {0x80, 2, 0x8b, 0xff, 0xff, 0xff, 0xff, '.'},
		"no STOP":                 {0x80, 2, ']'},
		"unknown opcode":          {0x80, 2, 0xfe, '.'},
		"text without newline":    []byte("I12"),
		"PERSID":                  []byte("P1\n."),
		"empty":                   {},
		// Well-formed opcodes on the wrong stack.
		"APPEND without list":    {0x80, 2, 'K', 1, 'a', '.'},
		"SETITEM on empty stack": {0x80, 2, 's', '.'},
		"GET of unknown memo":    {0x80, 2, 'h', 9, '.'},
		"self-referencing list":  {0x80, 2, ']', 'q', 0, 'h', 0, 'a', '.'},
	}
	for name, data := range cases {
		t.Run(name, func(t *testing.T) {
			v, err := loadPickle(data)
			if name == "self-referencing list" {
				// Plain data after all: the walk visits the list once.
				require.NoError(t, err)
				assert.Equal(t, "list", pyTypeName(v))
				return
			}
			assert.Error(t, err)
		})
	}
}

func TestSnapshotNotADict(t *testing.T) {
	// pickle.dumps([1, 2], protocol=2)
	_, err := ReadSnapshot(bytes.NewReader([]byte{0x80, 2, ']', 'q', 0, '(', 'K', 1, 'K', 2, 'e', '.'}), SnapshotOptions{})
	assert.ErrorContains(t, err, "holds a list whose item 0 is a int: neither a snapshot dict nor a list of segments")
	// pickle.dumps(7, protocol=2)
	_, err = ReadSnapshot(bytes.NewReader([]byte{0x80, 2, 'K', 7, '.'}), SnapshotOptions{})
	assert.ErrorContains(t, err, "holds a int, not a snapshot dict")
}

func FuzzLoadPickle(f *testing.F) {
	for _, name := range []string{"edge.pickle", "empty.pickle", "evil.pickle", "current.pickle.gz"} {
		data, err := os.ReadFile("testdata/" + name)
		require.NoError(f, err)
		if trace.IsGzip(data) {
			zr, err := gzip.NewReader(bytes.NewReader(data))
			require.NoError(f, err)
			data, err = io.ReadAll(zr) // the protocol-5 pickle itself
			require.NoError(f, err)
		}
		f.Add(data)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		// Never panics; whatever it accepts is plain data.
		_, _ = ReadSnapshot(bytes.NewReader(data), SnapshotOptions{})
	})
}

func BenchmarkReadSnapshot(b *testing.B) {
	data, err := os.ReadFile("testdata/cs336_MAGMA27_lm_fwdbwd.noframes.pickle.gz")
	require.NoError(b, err)
	b.ReportAllocs()
	b.ResetTimer()
	var ops int
	for i := 0; i < b.N; i++ {
		im, err := ReadSnapshot(bytes.NewReader(data), SnapshotOptions{})
		if err != nil {
			b.Fatal(err)
		}
		ops = len(im.Ops)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*ops), "ns/trace-op")
}

// loadPickle decodes a pickle held in memory under the default limits.
func loadPickle(data []byte) (any, error) {
	return decodePickle(bytes.NewReader(data), SnapshotOptions{}.limits())
}

// scanPickle checks that data is a pickle of plain data only.
func scanPickle(data []byte) error {
	_, err := loadPickle(data)
	return err
}
