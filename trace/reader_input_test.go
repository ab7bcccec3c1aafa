// Tests of what Reader accepts at the edges of its input: gzip files with
// trailing bytes or several members, byte order marks, and the size of its
// error messages.

package trace

import (
	"bytes"
	"io"
	"runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// readAllWarnings reads every op of data and returns them with the
// Reader's warnings.
func readAllWarnings(t *testing.T, data []byte) ([]Op, []string, error) {
	t.Helper()
	rd, err := NewReader(bytes.NewReader(data))
	if err != nil {
		return nil, nil, err
	}
	defer rd.Close()
	var ops []Op
	for {
		op, err := rd.Next()
		if err == io.EOF {
			return ops, rd.Warnings(), nil
		}
		if err != nil {
			return ops, rd.Warnings(), err
		}
		ops = append(ops, op)
	}
}

const fourOps = "# memtrace v1\na 1 512\nf 1\na 2 1024\nf 2\n"

// Garbage after the gzip data is ignored with a warning, as gzip(1) does;
// the trace is whatever decoded. It used to fail at "line 6: unexpected
// EOF" (or "invalid header").
func TestReaderGzipTrailingGarbage(t *testing.T) {
	for name, tail := range map[string]string{
		"short":  "garbage!",
		"long":   strings.Repeat("this is no gzip header\n", 10),
		"magic1": "\x1f",
	} {
		t.Run(name, func(t *testing.T) {
			ops, warnings, err := readAllWarnings(t, append(gzipBytes(t, fourOps), tail...))
			require.NoError(t, err)
			assert.Len(t, ops, 4)
			require.Len(t, warnings, 1)
			assert.Contains(t, warnings[0], "trailing garbage ignored")
		})
	}
	// Zero padding is silent, as in gzip(1).
	ops, warnings, err := readAllWarnings(t, append(gzipBytes(t, fourOps), 0, 0, 0, 0))
	require.NoError(t, err)
	assert.Len(t, ops, 4)
	assert.Empty(t, warnings)
}

func TestReaderGzipMembers(t *testing.T) {
	data := append(gzipBytes(t, fourOps), gzipBytes(t, "a 3 5\nf 3\n")...)
	ops, warnings, err := readAllWarnings(t, data)
	require.NoError(t, err)
	assert.Len(t, ops, 6)
	assert.Empty(t, warnings)

	// A damaged second member is an error, not garbage.
	second := gzipBytes(t, "a 3 5\nf 3\n")
	second[len(second)-8] ^= 0xff // its checksum
	_, _, err = readAllWarnings(t, append(gzipBytes(t, fourOps), second...))
	assert.ErrorContains(t, err, "checksum")
}

func TestReaderGzipCutShort(t *testing.T) {
	data := gzipBytes(t, fourOps)
	ops, _, err := readAllWarnings(t, data[:len(data)-5])
	assert.ErrorContains(t, err, "cut short")
	assert.Len(t, ops, 4, "the ops before the cut were read")
}

// A UTF-8 byte order mark at the start of a trace, plain or gzip, is
// skipped; it used to make the first line an unknown op.
func TestReaderByteOrderMark(t *testing.T) {
	bom := "\xef\xbb\xbf"
	for _, data := range [][]byte{
		[]byte(bom + fourOps),
		[]byte(bom + "a 1 512\nf 1\na 2 1024\nf 2\n"),
		gzipBytes(t, bom+fourOps),
	} {
		rd, err := NewReader(bytes.NewReader(data))
		require.NoError(t, err)
		ops, _, err := readAllWarnings(t, data)
		require.NoError(t, err)
		assert.Len(t, ops, 4)
		if data[0] != 0x1f && strings.HasPrefix(string(data[3:]), "#") {
			assert.Equal(t, []string{"memtrace v1"}, rd.Header())
		}
	}
	// Only at the start: elsewhere it is a bad line.
	_, err := readString(t, "a 1 512\n"+bom+"f 1\n")
	assert.ErrorContains(t, err, "line 2")
}

// No error message repeats more than about MaxQuote bytes of the input,
// however long the bad line.
func TestReaderErrorsAreShort(t *testing.T) {
	long := strings.Repeat("x", MaxLineLength-10)
	for _, in := range []string{
		long + "\n",                              // an unknown op of 64 KiB
		"a 1 " + long + "\n",                     // a bad size
		"t " + long + "\x01\n",                   // a control character in a tag
		"t " + long + "x" + long + "\n",          // longer than a line may be
		"a 1 2\nf 3\n",                           // a state error (short anyway)
		"m " + strings.Repeat("é", 30000) + "\n", // valid but long
	} {
		_, err := readString(t, in)
		if err == nil {
			continue
		}
		assert.Less(t, len(err.Error()), 4*MaxQuote+200, "%.80s...", err)
	}
	err := Op{Kind: Tag, Tag: strings.Repeat("y", 1<<20) + " "}.Check()
	require.Error(t, err)
	assert.Less(t, len(err.Error()), 4*MaxQuote+200)
	v := NewValidator()
	_, err = v.Check(Op{Kind: Mark, Name: strings.Repeat("z", 1<<20) + "\n"}, 1)
	require.Error(t, err)
	assert.Less(t, len(err.Error()), 4*MaxQuote+200)
}

// A trace of nothing but comments was read into Header whole (347 MB of
// memory for 158 MB of comments); Header keeps the first lines only.
func TestReaderLongHeaderIsBounded(t *testing.T) {
	var b strings.Builder
	b.WriteString("# memtrace v1\n")
	for range 200_000 {
		b.WriteString("# a comment line of some length, repeated many times\n")
	}
	b.WriteString("a 1 5\nf 1\n")
	in := b.String()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	rd, err := NewReader(strings.NewReader(in))
	require.NoError(t, err)
	runtime.ReadMemStats(&after)
	assert.Less(t, after.TotalAlloc-before.TotalAlloc, uint64(1<<20), "the header is not held whole")
	h := rd.Header()
	assert.Len(t, h, 256)
	assert.Equal(t, "memtrace v1", h[0])
	ops, _, err := readAllWarnings(t, []byte(in))
	require.NoError(t, err)
	assert.Len(t, ops, 2)
}
