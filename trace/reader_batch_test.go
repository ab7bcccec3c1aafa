// Tests of Reader.NextBatch: it reads what Next reads, line numbers and
// errors included, whatever the batch sizes and the read buffer's edges.

package trace

import (
	"bytes"
	"io"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// readEach reads data with Next to the first error, checking each op
// with v's Check when v is not nil, and returns the ops, their lines and
// the error.
func readEach(t testing.TB, data []byte, v *Validator) (ops []Op, lines []int, err error) {
	rd, err := NewReader(bytes.NewReader(data))
	if err != nil {
		return nil, nil, err
	}
	for {
		op, err := rd.Next()
		if err != nil {
			return ops, lines, err
		}
		if v != nil {
			if _, err := v.Check(op, rd.Line()); err != nil {
				return ops, lines, err
			}
		}
		ops = append(ops, op)
		lines = append(lines, rd.Line())
	}
}

// readBatches reads r with NextBatch (or, with v, v.ReadBatch), in
// batches of the sizes in sizes (in turn), to the first error, and checks
// what each call returns: at least one op or an error, a batch cut short
// only after a mark or by an error, Line the line of the last op when
// there is no error.
func readBatches(t testing.TB, r io.Reader, sizes []int, v *Validator) (ops []Op, lines []int, err error) {
	rd, err := NewReader(r)
	if err != nil {
		return nil, nil, err
	}
	for call := 0; ; call++ {
		size := sizes[call%len(sizes)]
		// A used buffer, with tags and marks left in it, as a replay's is.
		bo := make([]Op, size)
		for i := range bo {
			bo[i] = Op{Kind: Tag, Tag: "old", Name: "old", ID: 9, Size: 9, Stream: 9}
		}
		bl := make([]int, size)
		var n int
		if v != nil {
			n, err = v.ReadBatch(rd, bo, bl)
		} else {
			n, err = rd.NextBatch(bo, bl)
		}
		require.LessOrEqual(t, n, size)
		if err == nil {
			require.Positive(t, n, "no op and no error")
			if n < size {
				require.Equal(t, Mark, bo[n-1].Kind, "a batch cut short but not at a mark")
			}
		}
		if n > 0 && err == nil {
			require.Equal(t, bl[n-1], rd.Line())
		}
		ops = append(ops, bo[:n]...)
		lines = append(lines, bl[:n]...)
		if err != nil {
			return ops, lines, err
		}
	}
}

// sameAsNext requires that reading data in batches of the sizes in
// sizes gives what Next gives, through a reader that returns all it can
// and through one that returns one byte at a time; and that reading it
// with a Validator's ReadBatch gives what Next and Check give, the live
// IDs at the end included.
func sameAsNext(t testing.TB, data []byte, sizes ...int) {
	for _, check := range []bool{false, true} {
		var want *Validator
		if check {
			want = NewValidator()
		}
		wantOps, wantLines, wantErr := readEach(t, data, want)
		for _, r := range []io.Reader{bytes.NewReader(data), iotest.OneByteReader(bytes.NewReader(data))} {
			var v *Validator
			if check {
				v = NewValidator()
			}
			ops, lines, err := readBatches(t, r, sizes, v)
			require.Equal(t, wantErr, err, "checked %v", check)
			require.Equal(t, len(wantOps), len(ops))
			if len(ops) > 0 {
				require.Equal(t, wantOps, ops)
				require.Equal(t, wantLines, lines)
			}
			if check {
				require.Equal(t, want.LiveIDs(), v.LiveIDs(), "a broken rule changes nothing")
			}
		}
	}
}

func TestNextBatchSameAsNext(t *testing.T) {
	long := genTrace(30_000) // several read buffers: lines cut at their edges
	cases := map[string]string{
		"empty":             "",
		"header only":       "# memtrace v1\n# x\n",
		"plain":             "# h\na 0 512 0\na 1 2\nf 0\nf 1\n",
		"no final newline":  "a 0 512 0\nf 0",
		"crlf":              "a 0 1\r\nf 0\r\n\r\na 1 2 3\r\n",
		"every kind":        "a 0 512 0\nr 0 1\ns 1\nf 0\nS\nc\nt fwd\nt\nm s1\n# mark s2\n# note\n\na 1 1 1\n",
		"marks":             "m a\nm b\na 0 1\nm c\n# mark d\nf 0\nm e\n",
		"first line bad":    "a 0\nf 0\n",
		"bad in the middle": "a 0 1\na 1 2\na 2 3\na 01 4\nf 0\n",
		"bad fields":        "a 0 1\nf 0 \na 1 2\n",
		"too many fields":   "a 0 1\na 1 2 3 4\n",
		"big numbers":       "a 18446744073709551615 18446744073709551615 18446744073709551615\nf 18446744073709551615\na 18446744073709551616 1\n",
		"19 digits":         "a 9999999999999999999 1 0\nf 9999999999999999999\n",
		"control":           "a 0 1\nf 0\x00\n",
		"long line":         "a 0 1\nt " + strings.Repeat("x", MaxLineLength) + "\na 1 2\n",
		"bom":               "\xef\xbb\xbfa 0 1\nf 0\n",
		"reused ID":         "a 0 1\na 1 1\na 0 2\nf 0\n",
		"free not live":     "a 0 1\nf 0\nf 2\na 3 3\n",
		"free twice":        "a 0 1\na 1 1\nf 0\nf 0\n",
		"record not live":   "a 0 1\nr 1 1\n",
		"reused big ID":     "a 18446744073709551615 1\na 18446744073709551615 1\n",
		"bad after broken":  "a 0 1\na 0 1\nx\n",
		"r and s":           "a 0 1 0\nr 0 1\ns 1\nr 0 18446744073709551615\ns 0\nf 0\ns 12345678901\n",
		"r and s bad":       "a 0 1\nr 0 01\ns 1\n",
		"s with two":        "s 1\ns 1 2\n",
		"r with one":        "a 0 1\nr 0\n",
		"r with three":      "a 0 1\nr 0 1 2\n",
		"s leading zero":    "s 0\ns 00\n",
		"20 digits":         "a 1 12345678901234567890 0\nf 1\n",
		"20 digit ID":       "a 10000000000000000000 1\n",
		"19 digit size":     "a 0 9999999999999999999 0\na 1 1000000000000000000\nf 0\n",
		"cut numbers":       "a 0 1 0\na 12",
		"leading zeros":     "a 0 1 0\na 1 01 0\na 2 1 00\nf 00\nf 0\n",
		"empty fields":      "a 0 1\nf \n",
		"two spaces":        "a 0  1\n",
		"zeros":             "a 0 0 0\nf 0\na 0 0\n",
		"dense table grows": "a 0 1\na 2000000 1\na 1 1\na 4194303 2\na 4194304 3\nf 2000000\nf 1\nf 4194303\nf 4194304\nf 0\nf 1\n",
		"one-digit streams": "a 0 1 5\na 1 1 9\na 2 1 x\n",
		"stream then space": "a 0 1 5 \n",
		"stream cut":        "a 0 1 5",
		"two-digit stream":  "a 0 1 12\na 1 1 05\n",
		"8 digits and more": "a 12345678 87654321 0\na 123456789 1 0\nf 12345678\nf 123456789\n",
	}
	for name, in := range cases {
		t.Run(name, func(t *testing.T) {
			sameAsNext(t, []byte(in), 1, 2, 3, 1024)
		})
	}
	t.Run("long", func(t *testing.T) { sameAsNext(t, long, 1024, 7, 4096, 1) })
	t.Run("gzip", func(t *testing.T) { sameAsNext(t, gzipBytes(t, string(long)), 1000) })
}

// TestNextBatchAfterError: errors are final, as with Next.
func TestNextBatchAfterError(t *testing.T) {
	rd, err := NewReader(strings.NewReader("a 0 1\nx\na 1 1\n"))
	require.NoError(t, err)
	ops := make([]Op, 8)
	lines := make([]int, 8)
	n, err := rd.NextBatch(ops, lines)
	assert.Equal(t, 1, n)
	var se *SyntaxError
	require.ErrorAs(t, err, &se)
	assert.Equal(t, 2, se.Line)
	n, err2 := rd.NextBatch(ops, lines)
	assert.Zero(t, n)
	assert.Equal(t, err, err2)
}

// FuzzNextBatch: NextBatch reads any input as Next does.
func FuzzNextBatch(f *testing.F) {
	f.Add([]byte("# memtrace v1\na 0 512 0\nr 0 1\ns 1\nf 0\nS\nc\nt fwd\nt\n"), uint8(3))
	f.Add([]byte("a 1 2\r\n\r\n#x\nf 1"), uint8(1))
	f.Add([]byte("a 1 2 3\na 2 3\nf 1\nf 2\nm x\na 3 4 5 6\n"), uint8(2))
	f.Add([]byte("a 18446744073709551615 18446744073709551615 18446744073709551615\n"), uint8(7))
	f.Add([]byte("a 01 2\nf 1\n"), uint8(5))
	f.Add(gzipBytes(f, "a 0 1\nf 0\n"), uint8(1))
	f.Fuzz(func(t *testing.T, data []byte, size uint8) {
		sameAsNext(t, data, int(size%16)+1)
	})
}

// TestNumberAsDecimal: where scanFast takes a number (a space or "\n"
// after it), number reads what decimal reads, and it takes every number
// decimal reads that is followed by one.
func TestNumberAsDecimal(t *testing.T) {
	for _, in := range []string{
		"", "x", " ", "\n", "0", "0 ", "00 ", "01\n", "1", "1 ", "9\n", "10 ", "1x",
		"12345678 ", "123456789\n", "1234567890123456789 ", "9999999999999999999\n",
		"18446744073709551615 ", "12345678901234567890 ", "99999999999999999999\n",
		"1234567890123456789", "123456789012345678901 ",
	} {
		sameNumber(t, []byte(in))
		sameNumber(t, []byte("a "+in)) // not at the start of the buffer
	}
}

// sameNumber requires number and decimal to agree on every start in buf,
// as scanFast uses number.
func sameNumber(t testing.TB, buf []byte) {
	for j := 0; j <= len(buf)+1; j++ {
		x, k := number(buf, j)
		wx, wk := decimal(buf, j)
		taken := func(k int) bool { return k >= 0 && k < len(buf) && (buf[k] == ' ' || buf[k] == '\n') }
		if taken(wk) || taken(k) {
			require.Equal(t, wk, k, "%q at %d", buf, j)
			require.Equal(t, wx, x, "%q at %d", buf, j)
		}
		if wk < 0 && j < len(buf) && (buf[j] < '0' || buf[j] > '9') {
			require.Equal(t, len(buf), k, "%q at %d: no digit", buf, j)
		}
	}
}

func FuzzNumber(f *testing.F) {
	f.Add([]byte("123 "))
	f.Add([]byte("0123\n"))
	f.Add([]byte("18446744073709551615 1"))
	f.Fuzz(func(t *testing.T, buf []byte) {
		// number reads at most 20 bytes; decimal reads every digit, so
		// sameNumber takes the square of a long run of them.
		sameNumber(t, buf[:min(len(buf), 64)])
	})
}

// TestBatchClearsOldOps: an op of the batch left from an earlier line
// (a pool's name and flags) is cleared when a plain line is read into it.
func TestBatchClearsOldOps(t *testing.T) {
	rd, err := NewReader(strings.NewReader("a 0 1\nf 0\n"))
	require.NoError(t, err)
	ops := []Op{{Kind: MakePool, Flags: NoSplit}, {Kind: MakePool, Name: "p", Flags: NoSplit, Size: 3}}
	n, err := NewValidator().ReadBatch(rd, ops, make([]int, 2))
	require.NoError(t, err)
	require.Equal(t, 2, n)
	assert.Equal(t, []Op{{Kind: Alloc, Size: 1}, {Kind: Free}}, ops)
}

// TestBatchShorterLines: the batch is as long as the shorter of ops and
// lines, and nothing panics.
func TestBatchShorterLines(t *testing.T) {
	rd, err := NewReader(strings.NewReader("a 0 1\na 1 1\nf 0\n"))
	require.NoError(t, err)
	ops := make([]Op, 8)
	n, err := rd.NextBatch(ops, make([]int, 2))
	require.NoError(t, err)
	assert.Equal(t, 2, n)
	n, err = rd.NextBatch(ops, nil)
	require.NoError(t, err)
	assert.Zero(t, n)
	n, err = NewValidator().CheckBatch(ops[:2], make([]int, 1))
	require.NoError(t, err)
	assert.Equal(t, 1, n)
}
