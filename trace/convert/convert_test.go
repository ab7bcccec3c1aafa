// Tests of Convert and Detect.

package convert

import (
	"bytes"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpumem/gpumem/device/sim"
	"github.com/gpumem/gpumem/gpumemtest"
	"github.com/gpumem/gpumem/trace"
	"github.com/gpumem/gpumem/trace/internal/tracetest"
	"github.com/gpumem/gpumem/trace/replay"
)

func TestDetect(t *testing.T) {
	assert.Equal(t, PyTorchSnapshot, Detect([]byte{0x80, 4, 0x95}))
	assert.Equal(t, RMMLog, Detect([]byte("Thread,Time,Action,Pointer,Size,Stream\n1,2")))
	assert.Equal(t, Memtrace, Detect([]byte("# memtrace v1\na 1 2 0\n")))
	assert.Equal(t, Memtrace, Detect(nil))
	assert.Equal(t, "pytorch-snapshot", PyTorchSnapshot.String())
	assert.Equal(t, "Format(9)", Format(9).String())
}

func convertFile(t *testing.T, path string, opt Options) (Format, string, error) {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	var out bytes.Buffer
	format, err := Convert(&out, f, "input", opt)
	return format, out.String(), err
}

func TestConvertSnapshot(t *testing.T) {
	format, out, err := convertFile(t, "testdata/cs336_MAGMA27_lm_fwdbwd.noframes.pickle.gz", Options{})
	require.NoError(t, err)
	assert.Equal(t, PyTorchSnapshot, format)
	rd, err := trace.NewReader(strings.NewReader(out))
	require.NoError(t, err)
	h := rd.Header()
	require.NotEmpty(t, h)
	assert.Equal(t, "memtrace v1 source=input format=pytorch-snapshot", h[0])
	joined := strings.Join(h, "\n")
	assert.Contains(t, joined, "229 blocks from before the window allocated up front (2 seen freed in it, 227 still active at the snapshot)")
	// The same figures as the shared trace's header.
	assert.Contains(t, joined, "stats: ops=3900 allocs=1950 peak_live_bytes=13923997700 streams=1")
	assert.Contains(t, out, "\n# history window starts\na 229 25165824 0\n")
	assert.Contains(t, out, "\n# end of history window: 229 blocks still alive, freed below\nf 0\n")

	ops, err := trace.ReadAll(strings.NewReader(out))
	require.NoError(t, err)
	assert.Equal(t, tracetest.ReadFile(t, "testdata/pub_cs336_MAGMA27_lm_fwdbwd.trace.gz"), ops)
}

func TestConvertRMMGzipOutput(t *testing.T) {
	format, out, err := convertFile(t, "testdata/rmm_log.csv", Options{Gzip: true})
	require.NoError(t, err)
	assert.Equal(t, RMMLog, format)
	assert.Equal(t, []byte{0x1f, 0x8b}, []byte(out[:2]))
	rd, err := trace.NewReader(strings.NewReader(out))
	require.NoError(t, err)
	assert.Equal(t, "memtrace v1 source=input format=rmm-csv", rd.Header()[0])
	ops, err := trace.ReadAll(strings.NewReader(out))
	require.NoError(t, err)
	assert.Len(t, ops, 10)
}

func TestConvertMemtrace(t *testing.T) {
	// Gzip memtrace in, canonical plain memtrace out, header kept.
	in := tracetest.Gzip(t, "# memtrace v1 original\n# more\na 1 5\n# dropped\nf 1\n")
	var out bytes.Buffer
	_, err := Convert(&out, bytes.NewReader(in), "old.trace.gz", Options{})
	require.NoError(t, err)
	assert.Equal(t, "# memtrace v1 source=old.trace.gz format=memtrace\n# memtrace v1 original\n# more\na 1 5 0\nf 1\n", out.String())

	// Step marks written as comments come out as m lines.
	out.Reset()
	_, err = Convert(&out, strings.NewReader("# memtrace v1 old\n# mark s0\na 1 5\n# mark s1\nf 1\n"), "old", Options{})
	require.NoError(t, err)
	assert.Equal(t, "# memtrace v1 source=old format=memtrace\n# memtrace v1 old\nm s0\na 1 5 0\nm s1\nf 1\n", out.String())

	// A memtrace that breaks the live-ID rules is refused with its line.
	out.Reset()
	_, err = Convert(&out, strings.NewReader("a 1 5\nf 2\n"), "bad", Options{})
	assert.EqualError(t, err, `convert bad: memtrace line 2: "f 2": ID 2 is not live`)
	_, err = Convert(&out, strings.NewReader("a 1 5\nzzz\n"), "bad", Options{})
	assert.ErrorContains(t, err, `memtrace line 2: "zzz"`)
}

func TestConvertErrorsWriteNothing(t *testing.T) {
	for _, path := range []string{"testdata/evil.pickle", "testdata/double_alloc.pickle"} {
		_, out, err := convertFile(t, path, Options{})
		assert.Error(t, err, path)
		assert.Empty(t, out, path)
	}
	_, _, err := convertFile(t, "testdata/edge.pickle", Options{Device: 5})
	assert.ErrorContains(t, err, "device 5")
	var out bytes.Buffer
	_, err = Convert(&out, bytes.NewReader([]byte{0x1f, 0x8b, 1}), "x", Options{})
	assert.Error(t, err)
}

func TestConvertEoRValidates(t *testing.T) {
	_, out, err := convertFile(t, "testdata/EoR_NN_cnn_counterfactuals.noframes.pickle.gz", Options{})
	require.NoError(t, err)
	ops, err := trace.ReadAll(strings.NewReader(out))
	require.NoError(t, err)
	assert.Zero(t, tracetest.Live(t, ops), "a conversion ends with nothing live")
	assert.Contains(t, out, "entries without an op: free_requested=1926 segment_alloc=7 snapshot=9")
}

// TestSnapshotsConvertAndReplay converts both real PyTorch snapshots of
// the test data to memtrace and replays the result through the caching
// allocator: blocks from before the window must not break the replay.
func TestSnapshotsConvertAndReplay(t *testing.T) {
	for _, name := range []string{"EoR_NN_cnn_counterfactuals", "cs336_MAGMA27_lm_fwdbwd"} {
		t.Run(name, func(t *testing.T) {
			f, err := os.Open("testdata/" + name + ".noframes.pickle.gz")
			require.NoError(t, err)
			defer f.Close()
			var buf bytes.Buffer
			_, err = Convert(&buf, f, name, Options{})
			require.NoError(t, err)
			r, err := trace.NewReader(&buf)
			require.NoError(t, err)
			a := gpumemtest.New(t)
			res, err := replay.Run(r, a, a.Device().(*sim.Device), replay.Options{})
			require.NoError(t, err)
			require.NoError(t, a.CheckInvariants())
			assert.Positive(t, res.Alloc)
			assert.Zero(t, res.OOMs)
			assert.EqualValues(t, 0, res.Stats["allocation.all.current"], "the converted trace frees every block it allocates")
		})
	}
}
