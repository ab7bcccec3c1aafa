// Tests of ReadLog.

package rmm

import (
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpumem/gpumem/trace"
	"github.com/gpumem/gpumem/trace/internal/tracetest"
)

func TestRMMLog(t *testing.T) {
	f, err := os.Open("testdata/rmm_log.csv")
	require.NoError(t, err)
	defer f.Close()
	im, err := ReadLog(f)
	require.NoError(t, err)
	want := []trace.Op{
		// Freed in the log but allocated before it, by address.
		{Kind: trace.Alloc, ID: 0, Size: 512, Stream: 1},
		{Kind: trace.Alloc, ID: 1, Size: 4096, Stream: 0},
		// The log.
		{Kind: trace.Alloc, ID: 2, Size: 1024, Stream: 0},
		{Kind: trace.Free, ID: 1},
		{Kind: trace.Alloc, ID: 3, Size: 2048, Stream: 2},
		{Kind: trace.Free, ID: 2},
		{Kind: trace.Free, ID: 0},
		{Kind: trace.Alloc, ID: 4, Size: 256, Stream: 1},
		{Kind: trace.Free, ID: 4},
		// Alive at the end.
		{Kind: trace.Free, ID: 3},
	}
	assert.Equal(t, want, im.Ops)
	assert.Equal(t, 2, im.WindowStart)
	assert.Equal(t, 9, im.WindowEnd)
	assert.Equal(t, 10, im.Events)
	assert.Equal(t, 2, im.PreWindowFreed)
	assert.Equal(t, map[string]int{"allocate failure": 1, "zero-byte null allocate": 1, "zero-byte null free": 1}, im.Ignored)
	notes := strings.Join(im.Notes, "\n")
	assert.Contains(t, notes, "0x5581b0c0->1 0x5581a0c0->2")
	assert.Zero(t, tracetest.Live(t, im.Ops), "an import ends with nothing live")
}

func TestRMMLogColumnsInAnyOrderAndDecimalStreams(t *testing.T) {
	in := "Size,Pointer,Action,Stream\n10,7f0000,allocate,12\n10,7f0000,free,12\n"
	im, err := ReadLog(strings.NewReader(in))
	require.NoError(t, err)
	assert.Equal(t, []trace.Op{{Kind: trace.Alloc, ID: 0, Size: 10, Stream: 1}, {Kind: trace.Free, ID: 0}}, im.Ops)
}

func TestRMMLogErrors(t *testing.T) {
	const head = "Thread,Time,Action,Pointer,Size,Stream\n"
	cases := []struct {
		in, msg string
	}{
		{"", "empty input"},
		{"Thread,Time,Action,Pointer,Size\n", "no Stream column"},
		{head + "1,t,allocate,0x10,5,0x0\n1,t,allocate,0x10,5,0x0\n", "line 3"},
		{head + "1,t,allocate,0x10,5,0x0\n1,t,allocate,0x10,5,0x0\n", "which is live (allocated on line 2)"},
		{head + "1,t,allocate,0x10,5,0x0\n1,t,free,0x10,6,0x0\n", "with size 6; line 2 allocated it with size 5"},
		{head + "1,t,allocate,0x10,5,0x0\n1,t,free,0x10,5,0x0\n1,t,free,0x10,5,0x0\n", "not live (line 3 freed it)"},
		{head + "1,t,free,0x10,5,0x0\n1,t,free,0x10,5,0x0\n", "not live"},
		{head + "1,t,allocate,zz,5,0x0\n", "pointer is not a hexadecimal address"},
		{head + "1,t,allocate,0x10,-5,0x0\n", "size is not a non-negative integer"},
		{head + "1,t,allocate,0x10,5,0x\n", "stream is not an integer"},
		{head + "1,t,allocate,(nil),5,0x0\n", "null pointer for 5 bytes"},
		{head + "1,t,reallocate,0x10,5,0x0\n", `unknown action "reallocate"`},
		{head + "1,t,allocate,0x10,5\n", "wrong number of fields"},
	}
	for _, c := range cases {
		_, err := ReadLog(strings.NewReader(c.in))
		require.Error(t, err, c.in)
		assert.Contains(t, err.Error(), c.msg, c.in)
	}
}
