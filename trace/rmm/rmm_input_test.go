// Tests of what ReadLog accepts at the edges of its input: line breaks in
// fields, byte order marks, and long rows and fields.

package rmm

import (
	"runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpumem/gpumem/trace"
)

const head = "Thread,Time,Action,Pointer,Size,Stream\n"

// A quoted field with a line break was accepted: "allocate\n" trimmed to
// allocate, so one row spanned two lines. RMM writes one row a line.
func TestRMMLogLineBreakInField(t *testing.T) {
	for _, in := range []string{
		head + "1,t,\"allocate\n\",0x10,5,0x0\n",
		head + "1,t,\"\nfree\",0x10,5,0x0\n",
		head + "1,t,allocate,\"0x10\r\n\",5,0x0\n",
		head + "1,\"12:00\n:01\",allocate,0x10,5,0x0\n",
		"Thread,Time,\"Action\n\",Pointer,Size,Stream\n1,t,allocate,0x10,5,0x0\n",
	} {
		_, err := ReadLog(strings.NewReader(in))
		require.Error(t, err, "%q", in)
		assert.Contains(t, err.Error(), "line break", "%q", in)
		assert.NotContains(t, err.Error(), "\n", "a one-line message")
	}
	_, err := ReadLog(strings.NewReader(head + "1,t,\"allocate\n\",0x10,5,0x0\n"))
	assert.ErrorContains(t, err, "the Action field holds a line break")
}

// A UTF-8 byte order mark before the header is skipped (spreadsheets
// write one), even when the first column is one the reader needs.
func TestRMMLogByteOrderMark(t *testing.T) {
	in := "\ufeffAction,Pointer,Size,Stream\nallocate,0x10,5,0x0\nfree,0x10,5,0x0\n"
	im, err := ReadLog(strings.NewReader(in))
	require.NoError(t, err)
	assert.Len(t, im.Ops, 2)
}

// A 10 MB field used to come back whole in the error; now the message
// quotes at most trace.MaxQuote bytes of the row, and a line longer than
// trace.MaxLineLength is refused before the CSV reader holds it.
func TestRMMLogLongInput(t *testing.T) {
	for _, in := range []string{
		head + "1,t,allocate," + strings.Repeat("z", 60_000) + ",5,0x0\n",
		head + "1,t," + strings.Repeat("q", 60_000) + ",0x10,5,0x0\n",
		head + "1,t,allocate,0x10," + strings.Repeat("9", 10<<20) + ",0x0\n",
		strings.Repeat("H", 10<<20) + "\n",
	} {
		var err error
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		_, err = ReadLog(strings.NewReader(in))
		runtime.ReadMemStats(&after)
		require.Error(t, err)
		assert.Less(t, len(err.Error()), 4*trace.MaxQuote+200, "%.200s", err)
		assert.Less(t, after.TotalAlloc-before.TotalAlloc, uint64(2<<20), "a long row is not held whole")
	}
	_, err := ReadLog(strings.NewReader(head + "1,t,allocate,0x10," + strings.Repeat("9", 10<<20) + ",0x0\n"))
	assert.ErrorContains(t, err, "line 2 is longer than 65536 bytes")
}
