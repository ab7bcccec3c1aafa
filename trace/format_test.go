// Tests of Op, Kind and ParseOp.

package trace

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestOpString(t *testing.T) {
	cases := []struct {
		op   Op
		want string
	}{
		{Op{Kind: Alloc, ID: 3, Size: 512}, "a 3 512 0"},
		{Op{Kind: Alloc, ID: 18446744073709551615, Size: 1, Stream: 7}, "a 18446744073709551615 1 7"},
		{Op{Kind: Free, ID: 3}, "f 3"},
		{Op{Kind: RecordStream, ID: 3, Stream: 2}, "r 3 2"},
		{Op{Kind: SyncStream, Stream: 2}, "s 2"},
		{Op{Kind: SyncDevice}, "S"},
		{Op{Kind: EmptyCache}, "c"},
		{Op{Kind: Tag, Tag: "forward"}, "t forward"},
		{Op{Kind: Tag}, "t"},
	}
	for _, c := range cases {
		assert.Equal(t, c.want, c.op.String())
		back, err := ParseOp(c.want)
		require.NoError(t, err, c.want)
		assert.Equal(t, c.op, back, c.want)
	}
}

func TestOpCheck(t *testing.T) {
	bad := []Op{
		{Kind: 'x'},
		{Kind: 0},
		{Kind: Free, ID: 1, Size: 5},
		{Kind: Free, ID: 1, Stream: 5},
		{Kind: SyncStream, ID: 1},
		{Kind: SyncDevice, Stream: 1},
		{Kind: EmptyCache, Tag: "x"},
		{Kind: Alloc, Tag: "x"},
		{Kind: Tag, Tag: "two words"},
		{Kind: Tag, Tag: "tab\there"},
		{Kind: Tag, Tag: "new\nline"},
		{Kind: Tag, Tag: "\xff\xfe"},
	}
	for _, op := range bad {
		assert.Error(t, op.Check(), "%#v", op)
		_, err := op.AppendText(nil)
		assert.Error(t, err, "%#v", op)
		// String never produces something that reads as a valid line.
		_, err = ParseOp(op.String())
		assert.Error(t, err, "%#v", op)
	}
	assert.NoError(t, Op{Kind: Tag, Tag: "übung-1"}.Check())
}

func TestKindString(t *testing.T) {
	assert.Equal(t, "alloc", Alloc.String())
	assert.Equal(t, "record-stream", RecordStream.String())
	assert.Equal(t, "Kind(120)", Kind('x').String())
	assert.True(t, SyncDevice.Valid())
	assert.False(t, Kind('x').Valid())
}

func TestParseOpAllocDefaultsStream(t *testing.T) {
	op, err := ParseOp("a 1 2")
	require.NoError(t, err)
	assert.Equal(t, Op{Kind: Alloc, ID: 1, Size: 2}, op)
}

func TestParseUintEdges(t *testing.T) {
	cases := map[string]string{
		"0":                    "",
		"18446744073709551615": "",
		"18446744073709551616": "size is out of range (more than 2^64-1)",
		"99999999999999999999": "size is out of range (more than 2^64-1)",
		"007":                  "size has a leading zero",
		"-5":                   "size is not a non-negative integer",
		"+5":                   "size is not a non-negative integer",
		"0x10":                 "size is not a non-negative integer",
		"1e3":                  "size is not a non-negative integer",
		"":                     "size is not a non-negative integer",
	}
	for in, want := range cases {
		_, msg := parseUint([]byte(in), "size")
		assert.Equal(t, want, msg, in)
	}
}
