// Tests of the pickle reader on hostile input: decompression bombs, floods
// of one opcode, huge lengths and integers. Each must fail fast, with a
// clear error, in memory bounded by the limits rather than by the input.

package pytorch

import (
	"bytes"
	"compress/gzip"
	"io"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpumem/gpumem/internal/pickletest"
	"github.com/gpumem/gpumem/trace"
)

// repeatReader yields head, then body repeated until n bytes in all, made
// on the fly so that the test holds none of it.
type repeatReader struct {
	head, body []byte
	n, off     int64
}

func (r *repeatReader) Read(p []byte) (int, error) {
	if r.off >= r.n {
		return 0, io.EOF
	}
	p = p[:min(int64(len(p)), r.n-r.off)]
	if r.off < int64(len(r.head)) {
		n := copy(p, r.head[r.off:])
		r.off += int64(n)
		return n, nil
	}
	for i := range p {
		p[i] = r.body[(r.off+int64(i)-int64(len(r.head)))%int64(len(r.body))]
	}
	r.off += int64(len(p))
	return len(p), nil
}

// gzipBomb returns a gzip file that decompresses to head followed by
// mib MiB of body repeated: one member of head, then one member of 1 MiB
// compressed once and repeated, as concatenated gzip files may be.
func gzipBomb(t testing.TB, head, body []byte, mib int) []byte {
	t.Helper()
	member := func(data io.Reader) []byte {
		var b bytes.Buffer
		zw, err := gzip.NewWriterLevel(&b, gzip.BestCompression)
		require.NoError(t, err)
		_, err = io.Copy(zw, data)
		require.NoError(t, err)
		require.NoError(t, zw.Close())
		return b.Bytes()
	}
	out := member(bytes.NewReader(head))
	mb := member(&repeatReader{body: body, n: 1 << 20})
	for range mib {
		out = append(out, mb...)
	}
	return out
}

// allocated runs f and returns the bytes it allocated on the Go heap.
func allocated(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// hostile runs ReadSnapshot on r under opt and checks that it fails with
// want, allocating less than maxAlloc and within a few seconds (a
// generous bound: the failures below take milliseconds).
func hostile(t *testing.T, r io.Reader, opt SnapshotOptions, want string, maxAlloc uint64) {
	t.Helper()
	var err error
	start := time.Now()
	n := allocated(func() { _, err = ReadSnapshot(r, opt) })
	require.Error(t, err)
	assert.Contains(t, err.Error(), want)
	assert.Less(t, n, maxAlloc, "allocated %d bytes", n)
	assert.Less(t, time.Since(start), 10*time.Second)
	assert.Less(t, len(err.Error()), 400, "a one-line message of bounded length")
	assert.NotContains(t, err.Error(), "\n")
}

const mib = 1 << 20

// A 256 KiB gzip file that decompresses to 256 MiB of zeros after a valid
// start is refused at the first zero, not decompressed whole (it used to
// be read into memory, twice, before parsing).
func TestPickleDecompressionBomb(t *testing.T) {
	bomb := gzipBomb(t, []byte{0x80, 2, ']'}, []byte{0}, 256)
	require.Less(t, len(bomb), 512<<10)
	hostile(t, bytes.NewReader(bomb), SnapshotOptions{}, "unknown opcode 0x00 at byte 3", 4*mib)
}

// A flood of MARK opcodes took 2.18 GB for 10 MB of input; marks are
// bounded by the nesting limit now.
func TestPickleMarkFlood(t *testing.T) {
	in := &repeatReader{head: []byte{0x80, 2}, body: []byte{'('}, n: 10 * mib}
	hostile(t, in, SnapshotOptions{}, "more than 64 marks open", 4*mib)
}

// A LONG of 4 million digits took 23 s to parse (quadratic); Python's own
// limit of 4,300 digits applies.
func TestPickleHugeLong(t *testing.T) {
	digits := strings.Repeat("7", 4_000_000)
	in := strings.NewReader("\x80\x02L" + digits + "L\n.")
	hostile(t, in, SnapshotOptions{}, "more than 4300 digits", 8*mib)
	in = strings.NewReader("\x80\x02I" + digits[:5000] + "\n.")
	hostile(t, in, SnapshotOptions{}, "more than 4300 digits", 4*mib)
	long4 := []byte{0x80, 2, 0x8b, 0, 0, 0x10, 0} // LONG4 of 1 MiB
	hostile(t, bytes.NewReader(append(long4, make([]byte, mib)...)), SnapshotOptions{}, "an integer of 1048576 bytes", 4*mib)
}

// Lengths are checked against the size limit and data is read as it
// arrives: a ten-byte pickle cannot make the reader allocate a terabyte,
// nor a gigabyte.
func TestPickleHugeLengths(t *testing.T) {
	tera := []byte{0x80, 4, 0x8e, 0, 0, 0, 0, 0, 1, 0, 0, 'x', '.'} // BINBYTES8 of 2^40 bytes
	hostile(t, bytes.NewReader(tera), SnapshotOptions{}, "runs past the limit of the pickle's size", mib)
	giga := []byte{0x80, 4, 0x8d, 0, 0, 0, 0x18, 0, 0, 0, 0, 'x', '.'} // BINUNICODE8 of 384 MiB
	hostile(t, bytes.NewReader(giga), SnapshotOptions{}, "the data is cut short", mib)
}

// Floods that build values stop at the memory limit (here 16 MiB) and
// allocate about that much; a flood that builds nothing stops at the size
// limit (here 4 MiB) having allocated almost nothing.
func TestPickleFloodsWithinLimits(t *testing.T) {
	small := SnapshotOptions{MaxMemory: 16 * mib, MaxSize: 4 * mib}
	cases := []struct {
		name       string
		head, body []byte
		want       string
		alloc      uint64
	}{
		{"append None to a list", []byte{0x80, 2, ']'}, []byte("Na"), "more than 16777216 bytes of memory", 40 * mib},
		{"append one list to itself", []byte{0x80, 2, ']', 'q', 0}, []byte("h\x00a"), "more than 16777216 bytes of memory", 40 * mib},
		{"memoize one value", []byte{0x80, 4, 'N'}, []byte{0x94}, "more than 16777216 bytes of memory", 40 * mib},
		{"dict items", []byte{0x80, 2, '}'}, []byte("NNs"), "more than 16777216 bytes of memory", 40 * mib},
		{"push and pop", []byte{0x80, 2}, []byte("N0"), "larger than 4194304 bytes", 2 * mib},
		{"loose values", []byte{0x80, 2}, []byte("N"), "more than 1048576 values on the stack", 64 * mib},
		{"short strings", []byte{0x80, 2, ']'}, []byte("U\x08abcdefgha"), "more than 16777216 bytes of memory", 40 * mib},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			in := &repeatReader{head: c.head, body: c.body, n: 64 * mib}
			hostile(t, in, small, c.want, c.alloc)
		})
	}
	// The same through gzip: the limits count decompressed bytes.
	bomb := gzipBomb(t, []byte{0x80, 2, ']'}, []byte("Na"), 64)
	hostile(t, bytes.NewReader(bomb), small, "more than 16777216 bytes of memory", 40*mib)
}

// The repr of the settings checks its length before each element, not
// only on entry: a list holding itself a million times (2 MB of pickle)
// made a 325 MB note and 1.38 GB of memory; now the note stays within
// the repr's limit and the import allocates about what the list takes.
func TestPickleSelfReferentialSettings(t *testing.T) {
	data := pickletest.SelfRefSettings(1_000_000)
	require.Less(t, len(data), 3*mib)
	var im *trace.Import
	var err error
	n := allocated(func() { im, err = ReadSnapshot(bytes.NewReader(data), SnapshotOptions{}) })
	require.NoError(t, err)
	var settings string
	for _, note := range im.Notes {
		if strings.HasPrefix(note, "allocator_settings=") {
			settings = note
		}
	}
	require.NotEmpty(t, settings)
	assert.True(t, strings.HasPrefix(settings, "allocator_settings=[[[["), settings[:min(len(settings), 40)])
	assert.LessOrEqual(t, len(settings), maxReprLen+len("allocator_settings=")+maxPickleDepth*8, "the note is bounded")
	assert.Less(t, n, uint64(64*mib), "allocated %d bytes", n)
}

// The memory limit holds after the import expands memo references: 2 MB
// of pickle that names one alloc dict and one free dict a million times
// made a million ops (2.3 GB of memory for 16 million). The import now
// counts what it will build against what decoding left of the limit,
// before building it.
func TestPickleMemoExpansionWithinLimit(t *testing.T) {
	data := pickletest.MemoTraces(1_000_000)
	require.Less(t, len(data), 3*mib)
	// The same file is a valid snapshot: under a roomy limit it imports.
	im, err := ReadSnapshot(bytes.NewReader(pickletest.MemoTraces(1000)), SnapshotOptions{})
	require.NoError(t, err)
	assert.Len(t, im.Ops, 1000)
	hostile(t, bytes.NewReader(data), SnapshotOptions{MaxMemory: 64 * mib},
		"importing the 1000000 entries of device_traces[0] needs more than", 72*mib)
}
