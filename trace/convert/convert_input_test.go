// Tests of Convert at the edges of its input: gzip with trailing bytes,
// byte order marks, logs whose notes could grow without bound, and the
// size of error messages.

package convert

import (
	"bytes"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpumem/gpumem/trace"
	"github.com/gpumem/gpumem/trace/internal/tracetest"
)

const rmmHead = "Thread,Time,Action,Pointer,Size,Stream\n"

// Trailing garbage after gzip input is ignored with a warning through
// Options.Warn, as gzip(1) does, for memtrace and RMM logs alike.
func TestConvertGzipTrailingGarbage(t *testing.T) {
	for name, in := range map[string]string{
		"memtrace": "# memtrace v1\na 1 5\nf 1\n",
		"rmm":      rmmHead + "1,t,allocate,0x10,5,0x0\n1,t,free,0x10,5,0x0\n",
	} {
		t.Run(name, func(t *testing.T) {
			var warnings []string
			var out bytes.Buffer
			data := append(tracetest.Gzip(t, in), "not gzip"...)
			_, err := Convert(&out, bytes.NewReader(data), "in.gz", Options{Warn: func(m string) { warnings = append(warnings, m) }})
			require.NoError(t, err)
			ops, err := trace.ReadAll(&out)
			require.NoError(t, err)
			assert.Len(t, ops, 2)
			assert.Equal(t, []string{"convert in.gz: gzip: decompression OK, trailing garbage ignored"}, warnings)
		})
	}
}

// A UTF-8 byte order mark does not hide an RMM log's header, nor break a
// memtrace.
func TestConvertByteOrderMark(t *testing.T) {
	var out bytes.Buffer
	format, err := Convert(&out, strings.NewReader("\ufeff"+rmmHead+"1,t,allocate,0x10,5,0x0\n"), "bom.csv", Options{})
	require.NoError(t, err)
	assert.Equal(t, RMMLog, format)
	out.Reset()
	format, err = Convert(&out, strings.NewReader("\ufeff# memtrace v1\na 1 5\nf 1\n"), "bom.trace", Options{})
	require.NoError(t, err)
	assert.Equal(t, Memtrace, format)
	assert.Contains(t, out.String(), "\na 1 5 0\nf 1\n")
}

// A log with thousands of streams made a header line of one note per
// stream, longer than a memtrace line may be: the converted trace could
// not be read back. The notes now name the first few.
func TestConvertManyStreamsReadsBack(t *testing.T) {
	var in strings.Builder
	in.WriteString(rmmHead)
	for i := range 5000 {
		fmt.Fprintf(&in, "1,t,allocate,0x%x,512,0x%x\n", 0x10000+i*512, 0x7f000000+i)
	}
	var out bytes.Buffer
	_, err := Convert(&out, strings.NewReader(in.String()), "streams.csv", Options{})
	require.NoError(t, err)
	rd, err := trace.NewReader(&out)
	require.NoError(t, err)
	for _, h := range rd.Header() {
		assert.Less(t, len(h), 4096, "%.100s", h)
	}
	assert.Contains(t, strings.Join(rd.Header(), "\n"), "... (4968 more)")
	n := 0
	for {
		if _, err := rd.Next(); err != nil {
			assert.EqualError(t, err, "EOF")
			break
		}
		n++
	}
	assert.Equal(t, 10000, n)
}

// Every kind of input gives an error message that quotes at most about
// trace.MaxQuote bytes of it.
func TestConvertErrorsAreShort(t *testing.T) {
	long := strings.Repeat("x", 60_000)
	for name, in := range map[string]string{
		"memtrace line":     "a 1 5\n" + long + "\n",
		"memtrace tag":      "t " + long + "\x01\n",
		"rmm field":         rmmHead + "1,t," + long + ",0x10,5,0x0\n",
		"rmm row":           rmmHead + "1,t,allocate,0x10," + strings.Repeat("9", 1<<20) + ",0x0\n",
		"rmm pointer":       rmmHead + "1,t,allocate,0x" + long + ",5,0x0\n",
		"pickle int":        "\x80\x02I" + strings.Repeat("1", 5000) + "\n.",
		"pickle memo index": "\x80\x02Ng" + strings.Repeat("1", 30) + "x\n.",
	} {
		t.Run(name, func(t *testing.T) {
			_, err := Convert(&bytes.Buffer{}, strings.NewReader(in), "in", Options{})
			require.Error(t, err)
			assert.Less(t, len(err.Error()), 4*trace.MaxQuote+200, "%.300s", err)
			assert.NotContains(t, err.Error(), "\n")
		})
	}
}
