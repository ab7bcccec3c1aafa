// Tests of Convert and DetectFormat.

package trace

import (
	"bytes"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestDetectFormat(t *testing.T) {
	assert.Equal(t, FormatSnapshot, DetectFormat([]byte{0x80, 4, 0x95}))
	assert.Equal(t, FormatRMM, DetectFormat([]byte("Thread,Time,Action,Pointer,Size,Stream\n1,2")))
	assert.Equal(t, FormatMemtrace, DetectFormat([]byte("# memtrace v1\na 1 2 0\n")))
	assert.Equal(t, FormatMemtrace, DetectFormat(nil))
	assert.Equal(t, "pytorch-snapshot", FormatSnapshot.String())
	assert.Equal(t, "Format(9)", Format(9).String())
}

func convertFile(t *testing.T, path string, c Converter) (Format, string, error) {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	var out bytes.Buffer
	format, err := c.Convert(&out, f, "input")
	return format, out.String(), err
}

func TestConvertSnapshot(t *testing.T) {
	format, out, err := convertFile(t, "testdata/cs336_MAGMA27_lm_fwdbwd.noframes.pickle.gz", Converter{})
	require.NoError(t, err)
	assert.Equal(t, FormatSnapshot, format)
	rd, err := NewReader(strings.NewReader(out))
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

	ops, err := ReadAll(strings.NewReader(out))
	require.NoError(t, err)
	assert.Equal(t, readTraceFile(t, "testdata/pub_cs336_MAGMA27_lm_fwdbwd.trace.gz"), ops)
}

func TestConvertRMMGzipOutput(t *testing.T) {
	format, out, err := convertFile(t, "testdata/rmm_log.csv", Converter{Gzip: true})
	require.NoError(t, err)
	assert.Equal(t, FormatRMM, format)
	assert.Equal(t, []byte{0x1f, 0x8b}, []byte(out[:2]))
	rd, err := NewReader(strings.NewReader(out))
	require.NoError(t, err)
	assert.Equal(t, "memtrace v1 source=input format=rmm-csv", rd.Header()[0])
	ops, err := ReadAll(strings.NewReader(out))
	require.NoError(t, err)
	assert.Len(t, ops, 10)
}

func TestConvertMemtrace(t *testing.T) {
	// Gzip memtrace in, canonical plain memtrace out, header kept.
	in := gzipBytes(t, "# memtrace v1 original\n# more\na 1 5\n# dropped\nf 1\n")
	var out bytes.Buffer
	require.NoError(t, Convert(&out, bytes.NewReader(in), "old.trace.gz"))
	assert.Equal(t, "# memtrace v1 source=old.trace.gz format=memtrace\n# memtrace v1 original\n# more\na 1 5 0\nf 1\n", out.String())

	// A memtrace that breaks the live-ID rules is refused with its line.
	out.Reset()
	err := Convert(&out, strings.NewReader("a 1 5\nf 2\n"), "bad")
	assert.EqualError(t, err, `convert bad: memtrace line 2: "f 2": ID 2 is not live`)
	err = Convert(&out, strings.NewReader("a 1 5\nzzz\n"), "bad")
	assert.ErrorContains(t, err, `memtrace line 2: "zzz"`)
}

func TestConvertErrorsWriteNothing(t *testing.T) {
	for _, path := range []string{"testdata/evil.pickle", "testdata/double_alloc.pickle"} {
		_, out, err := convertFile(t, path, Converter{})
		assert.Error(t, err, path)
		assert.Empty(t, out, path)
	}
	_, _, err := convertFile(t, "testdata/edge.pickle", Converter{Device: 5})
	assert.ErrorContains(t, err, "device 5")
	var out bytes.Buffer
	assert.Error(t, Convert(&out, bytes.NewReader([]byte{0x1f, 0x8b, 1}), "x"))
}

func TestConvertEoRValidates(t *testing.T) {
	_, out, err := convertFile(t, "testdata/EoR_NN_cnn_counterfactuals.noframes.pickle.gz", Converter{})
	require.NoError(t, err)
	ops, err := ReadAll(strings.NewReader(out))
	require.NoError(t, err)
	validateOps(t, ops)
	assert.Contains(t, out, "entries without an op: free_requested=1926 segment_alloc=7 snapshot=9")
}
