// Tests and benchmarks of Reader: malformed lines, headers, gzip, the
// shared traces in testdata, and FuzzReader.

package trace

import (
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// readLines reads rd to io.EOF, failing the test at any other error, and
// returns the ops with the line each was read from.
func readLines(t *testing.T, rd *Reader) (ops []Op, lines []int) {
	t.Helper()
	for {
		op, err := rd.Next()
		if err == io.EOF {
			return ops, lines
		}
		require.NoError(t, err)
		ops = append(ops, op)
		lines = append(lines, rd.Line())
	}
}

// validated checks ops, read from the given lines, with a new Validator,
// failing the test at the first it refuses, and returns the validator.
func validated(t *testing.T, ops []Op, lines []int) *Validator {
	t.Helper()
	v := NewValidator()
	for i, op := range ops {
		_, err := v.Check(op, lines[i])
		require.NoError(t, err)
	}
	return v
}

func readString(t *testing.T, s string) ([]Op, error) {
	t.Helper()
	return ReadAll(strings.NewReader(s))
}

func TestReaderMalformedLines(t *testing.T) {
	cases := []struct {
		line string
		msg  string
	}{
		{"a 3 -5", "size is not a non-negative integer"},
		{"a 3", "wrong number of fields"},
		{"a", "wrong number of fields"},
		{"a 1 2 3 4", "wrong number of fields"},
		{"a 1 2 3 4 5", "too many fields"},
		{"a x 2", "ID is not a non-negative integer"},
		{"a 1 2 -1", "stream is not a non-negative integer"},
		{"a 1 18446744073709551616", "size is out of range"},
		{"a 01 2", "ID has a leading zero"},
		{"a  1 2", "empty field"},
		{"a 1 2 ", "trailing space"},
		{" a 1 2", "empty field"},
		{"a\t1 2", "control character"},
		{"a 1\t2", "control character"},
		{"f", "wrong number of fields"},
		{"f 1 2", "wrong number of fields"},
		{"r 1", "wrong number of fields"},
		{"r 1 2 3", "wrong number of fields"},
		{"s", "wrong number of fields"},
		{"s 1 2", "wrong number of fields"},
		{"S 1", "wrong number of fields"},
		{"c 0", "wrong number of fields"},
		{"t a b", "too many fields"},
		{"t \xff", "valid UTF-8"},
		{"m", "wrong number of fields (want m NAME"},
		{"m a b", "wrong number of fields"},
		{"m a\x01", "control character"},
		{"x 1", "unknown op"},
		{"alloc 1 2", "unknown op"},
		{"A 1 2", "unknown op"},
		{"   ", "empty field"},
		{"a 1\r2", "control character"},
		{"P", "wrong number of fields (want P NAME [no_split] [use_on_oom]"},
		{"P - no_split", "default pool"},
		{"P kv no_split no_split", "unknown or repeated pool option"},
		{"P kv use_on_oom no_split", "unknown or repeated pool option"},
		{"P kv big", "unknown or repeated pool option"},
		{"P kv no_split use_on_oom x", "wrong number of fields"},
		{"P kv\x01", "control character"},
		{"u kv", "wrong number of fields (want u NAME STREAM"},
		{"u kv x", "stream is not a non-negative integer"},
		{"u kv 1 2", "wrong number of fields"},
		{"g - 1", "default pool"},
		{"g kv", "wrong number of fields (want g NAME STREAM"},
		{"e", "wrong number of fields (want e STREAM"},
		{"e kv", "stream is not a non-negative integer"},
		{"z", "wrong number of fields (want z NAME"},
		{"w -", "default pool"},
		{"d a b", "wrong number of fields"},
		{"d \xff", "valid UTF-8"},
		{"p kv", "unknown op"},
	}
	for _, c := range cases {
		t.Run(c.line, func(t *testing.T) {
			// The bad line is the 4th: after a header, a good op, a blank line.
			in := "# memtrace v1 test\na 0 1 0\n\n" + c.line + "\nf 0\n"
			rd, err := NewReader(strings.NewReader(in))
			require.NoError(t, err)
			op, err := rd.Next()
			require.NoError(t, err)
			assert.Equal(t, Op{Kind: Alloc, ID: 0, Size: 1}, op)
			_, err = rd.Next()
			var se *SyntaxError
			require.ErrorAs(t, err, &se)
			assert.Equal(t, 4, se.Line)
			assert.Equal(t, c.line, se.Text)
			assert.Contains(t, se.Msg, c.msg)
			assert.Contains(t, err.Error(), fmt.Sprintf("memtrace line 4: %q: ", c.line))
			assert.Equal(t, 4, rd.Line())
			// Errors are final.
			_, err2 := rd.Next()
			assert.Equal(t, err, err2)
		})
	}
}

func TestReaderErrorMessageExample(t *testing.T) {
	in := strings.Repeat("# c\n", 11) + "a 3 -5\n"
	_, err := readString(t, in)
	assert.EqualError(t, err, `memtrace line 12: "a 3 -5": size is not a non-negative integer`)
}

func TestReaderFirstOpLineBad(t *testing.T) {
	rd, err := NewReader(strings.NewReader("# h\nbogus\n"))
	require.NoError(t, err)
	assert.Equal(t, []string{"h"}, rd.Header())
	_, err = rd.Next()
	var se *SyntaxError
	require.ErrorAs(t, err, &se)
	assert.Equal(t, 2, se.Line)
	assert.Equal(t, 2, rd.Line())
}

func TestReaderHeaderCommentsBlanksCRLF(t *testing.T) {
	in := "# memtrace v1 made by hand\r\n#second\r\n\r\n#  third\n" +
		"a 1 10\r\n# not header\n\nt fwd\nr 1 2\ns 2\nS\nc\nt\nf 1" // no final newline
	rd, err := NewReader(strings.NewReader(in))
	require.NoError(t, err)
	assert.Equal(t, []string{"memtrace v1 made by hand", "second", " third"}, rd.Header())
	ops, lines := readLines(t, rd)
	assert.Equal(t, []Op{
		{Kind: Alloc, ID: 1, Size: 10},
		{Kind: Tag, Tag: "fwd"},
		{Kind: RecordStream, ID: 1, Stream: 2},
		{Kind: SyncStream, Stream: 2},
		{Kind: SyncDevice},
		{Kind: EmptyCache},
		{Kind: Tag},
		{Kind: Free, ID: 1},
	}, ops)
	assert.Equal(t, []int{5, 8, 9, 10, 11, 12, 13, 14}, lines)
	// EOF is final too.
	_, err = rd.Next()
	assert.Equal(t, io.EOF, err)
}

func TestReaderEmptyAndCommentOnly(t *testing.T) {
	for _, in := range []string{"", "\n\n", "# only\n# comments"} {
		rd, err := NewReader(strings.NewReader(in))
		require.NoError(t, err)
		_, err = rd.Next()
		assert.Equal(t, io.EOF, err, "%q", in)
	}
}

func TestReaderLongLine(t *testing.T) {
	in := "a 1 2\nt " + strings.Repeat("x", MaxLineLength) + "\n"
	ops, err := readString(t, in)
	assert.Len(t, ops, 1)
	var se *SyntaxError
	require.ErrorAs(t, err, &se)
	assert.Equal(t, 2, se.Line)
	assert.Contains(t, se.Msg, "longer than")
	assert.Less(t, len(se.Text), 300, "the error keeps only the start of a long line")
	// A long comment is as bad: the reader keeps one line in memory.
	_, err = readString(t, "#"+strings.Repeat("x", MaxLineLength+10)+"\n")
	require.ErrorAs(t, err, &se)
	assert.Equal(t, 1, se.Line)
}

// gzipBytes compresses s.
func gzipBytes(t testing.TB, s string) []byte {
	t.Helper()
	var b bytes.Buffer
	zw := gzip.NewWriter(&b)
	_, err := zw.Write([]byte(s))
	require.NoError(t, err)
	require.NoError(t, zw.Close())
	return b.Bytes()
}

func TestReaderGzip(t *testing.T) {
	plain := "# memtrace v1 g\na 0 100 0\nf 0\n"
	ops, err := ReadAll(bytes.NewReader(gzipBytes(t, plain)))
	require.NoError(t, err)
	assert.Equal(t, []Op{{Kind: Alloc, Size: 100}, {Kind: Free}}, ops)

	// A truncated gzip stream is an I/O error, not a silent end.
	z := gzipBytes(t, plain+strings.Repeat("a 1 2 0\nf 1\n", 1000))
	_, err = ReadAll(bytes.NewReader(z[:len(z)/2]))
	require.Error(t, err)
	assert.True(t, errors.Is(err, io.ErrUnexpectedEOF), "%v", err)

	// A damaged gzip header fails at once.
	_, err = NewReader(bytes.NewReader([]byte{0x1f, 0x8b, 0, 0}))
	assert.Error(t, err)
}

func TestReaderTagsShareStrings(t *testing.T) {
	ops, err := readString(t, "t fwd\nt fwd\nt bwd\n")
	require.NoError(t, err)
	require.Len(t, ops, 3)
	assert.Equal(t, "fwd", ops[0].Tag)
	assert.Equal(t, "fwd", ops[1].Tag)
	assert.Equal(t, "bwd", ops[2].Tag)
}

// Both shared traces in testdata read, validate and have the figures
// their headers promise.
func TestReaderTestdataTraces(t *testing.T) {
	cases := []struct {
		file           string
		ops, allocs    int
		headerContains string
	}{
		{"testdata/pub_cs336_MAGMA27_lm_fwdbwd.trace.gz", 3900, 1950, "stats: ops=3900 allocs=1950"},
		{"testdata/random_mixed_2000.trace.gz", 3118, 1559, "random-mixed seed=44"},
		// 7,248 a and f lines and three "# mark stepN" comments.
		{"testdata/bert_b2.trace.gz", 7251, 3624, "source=bert batch=2"},
	}
	for _, c := range cases {
		t.Run(c.file, func(t *testing.T) {
			rd, err := Open(c.file)
			require.NoError(t, err)
			defer rd.Close()
			assert.Contains(t, strings.Join(rd.Header(), "\n"), c.headerContains)
			assert.True(t, strings.HasPrefix(rd.Header()[0], "memtrace v1"))
			ops, lines := readLines(t, rd)
			v := validated(t, ops, lines)
			allocs := 0
			for _, op := range ops {
				if op.Kind == Alloc {
					allocs++
				}
			}
			assert.Equal(t, c.ops, len(ops))
			assert.Equal(t, c.allocs, allocs)
			assert.Zero(t, v.Live(), "the trace frees every block")
		})
	}
}

// Step marks: m lines, and comments that are exactly "# mark NAME" (as
// older captures write them), are Mark ops; other comments are skipped. A
// mark comment is an op, so it ends the header.
func TestReaderMarks(t *testing.T) {
	in := "# memtrace v1 marks\n# mark setup\na 0 10\n# mark  spaced\n#mark glued\n# mark two words\nm step1\nf 0\n# mark step2\n"
	rd, err := NewReader(strings.NewReader(in))
	require.NoError(t, err)
	assert.Equal(t, []string{"memtrace v1 marks"}, rd.Header())
	ops, lines := readLines(t, rd)
	var got []string
	for i, op := range ops {
		got = append(got, fmt.Sprintf("%d:%v", lines[i], op))
	}
	assert.Equal(t, []string{"2:m setup", "3:a 0 10 0", "7:m step1", "8:f 0", "9:m step2"}, got)
}

// The marks of a real capture: three training steps of a BERT encoder.
func TestReaderMarksInCapture(t *testing.T) {
	rd, err := Open("testdata/bert_b2.trace.gz")
	require.NoError(t, err)
	defer rd.Close()
	ops, lines := readLines(t, rd)
	var marks []string
	live := 0
	for i, op := range ops {
		switch op.Kind {
		case Alloc:
			live++
		case Free:
			live--
		case Mark:
			marks = append(marks, fmt.Sprintf("%s@%d live=%d", op.Name, lines[i], live))
		}
	}
	assert.Equal(t, []string{"step0@155 live=153", "step1@2623 live=612", "step2@4632 live=612"}, marks)
}

func TestOpenMissing(t *testing.T) {
	_, err := Open("testdata/no-such-file.trace")
	assert.True(t, errors.Is(err, os.ErrNotExist))
}

// FuzzReader: the reader never panics, and whatever it accepts is written
// back and read again to the same ops.
func FuzzReader(f *testing.F) {
	f.Add([]byte("# memtrace v1\na 0 512 0\nr 0 1\ns 1\nf 0\nS\nc\nt fwd\nt\n"))
	f.Add([]byte("a 1 2\r\n\r\n#x\nf 1"))
	f.Add([]byte("a 18446744073709551615 18446744073709551615 18446744073709551615\n"))
	f.Add([]byte("a  1 2\n"))
	f.Add([]byte("t \xc3\xbc\n"))
	f.Add([]byte("# mark s0\na 0 1\nm s1\n#mark x\n# mark a b\nf 0\n"))
	f.Add(gzipBytes(f, "a 0 1\nf 0\n"))
	f.Add([]byte("P kv no_split use_on_oom\nu kv 1\na 0 512 1\nu - 1\ng kv 2\ne 2\nz kv\nw kv\nf 0\nd kv\nP - x\nu -\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		rd, err := NewReader(bytes.NewReader(data))
		if err != nil {
			return
		}
		var ops []Op
		for {
			op, err := rd.Next()
			if err != nil {
				break
			}
			require.NoError(t, op.Check(), "the reader returned an op that cannot be written")
			ops = append(ops, op)
		}
		var buf bytes.Buffer
		w := NewWriter(&buf, rd.Header()...)
		for _, op := range ops {
			require.NoError(t, w.Write(op))
		}
		require.NoError(t, w.Close())
		back, err := ReadAll(&buf)
		require.NoError(t, err)
		if len(ops) == 0 {
			assert.Empty(t, back)
		} else {
			assert.Equal(t, ops, back)
		}
	})
}

// genTrace writes n ops of a plausible trace: allocations and frees over
// about 1000 live blocks, a few tags and stream ops.
func genTrace(n int) []byte {
	var b bytes.Buffer
	b.WriteString("# memtrace v1 generated for benchmarks\n")
	live := make([]uint64, 0, 1024)
	next := uint64(0)
	x := uint64(88172645463325252)
	rnd := func() uint64 { x ^= x << 13; x ^= x >> 7; x ^= x << 17; return x }
	for i := 0; i < n; i++ {
		r := rnd()
		switch {
		case r%97 == 0:
			fmt.Fprintf(&b, "t phase%d\n", r%4)
		case r%89 == 0 && len(live) > 0:
			fmt.Fprintf(&b, "r %d %d\n", live[int(r>>8)%len(live)], 1+r%3)
		case len(live) > 0 && (len(live) >= 1000 || r%2 == 0):
			j := int(r>>8) % len(live)
			fmt.Fprintf(&b, "f %d\n", live[j])
			live[j] = live[len(live)-1]
			live = live[:len(live)-1]
		default:
			fmt.Fprintf(&b, "a %d %d %d\n", next, 512+(r>>20)%(64<<20), r%2)
			live = append(live, next)
			next++
		}
	}
	return b.Bytes()
}

func benchmarkReader(b *testing.B, data []byte, lines int) {
	b.ReportAllocs()
	b.SetBytes(int64(len(data)))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		rd, err := NewReader(bytes.NewReader(data))
		if err != nil {
			b.Fatal(err)
		}
		n := 0
		for {
			_, err := rd.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				b.Fatal(err)
			}
			n++
		}
		if n != lines {
			b.Fatalf("read %d ops, want %d", n, lines)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*lines), "ns/line")
}

func BenchmarkReader(b *testing.B) {
	const lines = 200_000
	data := genTrace(lines)
	b.Run("plain", func(b *testing.B) { benchmarkReader(b, data, lines) })
	b.Run("gzip", func(b *testing.B) { benchmarkReader(b, gzipBytes(b, string(data)), lines) })
}
