// Tests of Op, Kind and ParseOp.

package trace

import (
	"os"
	"strconv"
	"strings"
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
		{Op{Kind: Mark, Name: "step3"}, "m step3"},
		{Op{Kind: MakePool, Name: "kv"}, "P kv"},
		{Op{Kind: MakePool, Name: "kv", Flags: NoSplit}, "P kv no_split"},
		{Op{Kind: MakePool, Name: "kv", Flags: UseOnOOM}, "P kv use_on_oom"},
		{Op{Kind: MakePool, Name: "kv", Flags: NoSplit | UseOnOOM}, "P kv no_split use_on_oom"},
		{Op{Kind: UsePool, Name: "kv", Stream: 3}, "u kv 3"},
		{Op{Kind: UsePool, Name: DefaultPool, Stream: 3}, "u - 3"},
		{Op{Kind: BeginCapture, Name: "graph0", Stream: 1}, "g graph0 1"},
		{Op{Kind: EndCapture, Stream: 1}, "e 1"},
		{Op{Kind: PausePool, Name: "kv"}, "z kv"},
		{Op{Kind: ResumePool, Name: "kv"}, "w kv"},
		{Op{Kind: DropPool, Name: "kv"}, "d kv"},
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
		{Kind: Mark},
		{Kind: Mark, Name: "two words"},
		{Kind: Mark, Name: "x", Tag: "y"},
		{Kind: Tag, Name: "x"},
		{Kind: Alloc, Name: "x"},
		{Kind: MakePool},
		{Kind: MakePool, Name: "-"},
		{Kind: MakePool, Name: "a b"},
		{Kind: MakePool, Name: "p", Flags: 4},
		{Kind: MakePool, Name: "p", Stream: 1},
		{Kind: UsePool, Stream: 1},
		{Kind: BeginCapture, Name: "-", Stream: 1},
		{Kind: EndCapture, Name: "p", Stream: 1},
		{Kind: EndCapture, Stream: 1, Flags: NoSplit},
		{Kind: PausePool, Name: "-"},
		{Kind: ResumePool, Name: "p", ID: 1},
		{Kind: DropPool},
		{Kind: Alloc, ID: 1, Size: 1, Flags: NoSplit},
		{Kind: Mark, Name: "x", Flags: UseOnOOM},
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
	assert.Equal(t, "mark", Mark.String())
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

// A step mark is an m line, or a comment that is exactly "# mark NAME".
func TestParseOpMark(t *testing.T) {
	for _, line := range []string{"m step1", "# mark step1"} {
		op, err := ParseOp(line)
		require.NoError(t, err, line)
		assert.Equal(t, Op{Kind: Mark, Name: "step1"}, op, line)
	}
	for _, line := range []string{"m", "m a b", "m \xff", "# a comment", "# mark", "# mark ", "# mark a b", "#mark a", "#  mark a"} {
		_, err := ParseOp(line)
		assert.Error(t, err, line)
	}
}

// The example in FORMAT.md reads and follows the live-ID rules.
func TestFormatSpecExample(t *testing.T) {
	spec, err := os.ReadFile("FORMAT.md")
	require.NoError(t, err)
	_, rest, ok := strings.Cut(string(spec), "## Example\n\n```\n")
	require.True(t, ok, "FORMAT.md has an example")
	example, _, ok := strings.Cut(rest, "```")
	require.True(t, ok)
	rd, err := NewReader(strings.NewReader(example))
	require.NoError(t, err)
	assert.Equal(t, "memtrace v1 source=example", rd.Header()[0])
	ops, lines := readLines(t, rd)
	v := validated(t, ops, lines)
	var marks []string
	for _, op := range ops {
		if op.Kind == Mark {
			marks = append(marks, op.Name)
		}
	}
	assert.Equal(t, []string{"step0", "step1"}, marks)
	assert.Zero(t, v.Live())
}

// TestParseFastAgrees: the one-pass parser of a and f lines takes only
// lines that the field-by-field parser reads the same way, whatever bytes
// follow the line in its buffer.
func TestParseFastAgrees(t *testing.T) {
	lines := []string{
		"a 0 0", "a 1 2 3", "a 12 4096 0", "f 7", "f 0", "a 9999999999999999999 1",
		"a 18446744073709551615 1", "a 18446744073709551616 1", "a 01 2", "a 1 02", "f 00",
		"a 1 2 3 4", "a 1", "f", "f 1 2", "a 1  2", "a 1 2 ", " a 1 2", "a1 2", "a 1 2\t",
		"a -1 2", "a 1 2x", "a 1 2 x", "r 1 2", "s 1", "S", "c", "t x", "m x", "# mark x",
		"b 1 2", "f 1\x00", "a 1 2 0", "a 1 2 00", "a 12345678 123456789 1", "f 1234567812345678",
		"a 1/ 2", "a 1: 2", "f 9\xff", "a 100000000 99999999 7",
	}
	for _, l := range lines {
		checkParseFast(t, l)
	}
}

// checkParseFast compares parseFast with parseFields on l alone and with
// bytes after it, as a Reader's buffer has.
func checkParseFast(t testing.TB, l string) {
	var p parser
	want, wantMsg := p.parseFields([]byte(l))
	for _, after := range []string{"", "\n", "\n12345678901234567890", "99999999999999999999", " 1", "\xff\x00a"} {
		buf := []byte(l + after)
		got, ok := parseFast(buf[:len(l)])
		if ok && (wantMsg != "" || got != want) {
			t.Errorf("%q followed by %q: fast %+v, fields %+v %q", l, after, got, want, wantMsg)
		}
	}
}

// TestDecimal: decimal agrees with strconv on every length of number.
func TestDecimal(t *testing.T) {
	for n := 1; n <= 20; n++ {
		for _, d := range "19" {
			num := strings.Repeat(string(d), n)
			x, end := decimal([]byte(" "+num+" 5"), 1)
			want, err := strconv.ParseUint(num, 10, 64)
			if n > 19 {
				if end != -1 {
					t.Fatalf("%q: took %d digits", num, n)
				}
				continue
			}
			if err != nil || end != n+1 || x != want {
				t.Fatalf("%q: %d (end %d), want %d", num, x, end, want)
			}
		}
	}
}

func FuzzParseFast(f *testing.F) {
	for _, s := range []string{"a 1 2 3", "f 1", "a 01 2", "a 1 2 ", "a 18446744073709551616 1", "a 12345678 87654321 0"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, l string) { checkParseFast(t, l) })
}
