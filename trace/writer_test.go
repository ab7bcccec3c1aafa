// Tests of Writer: round trips (property-based), headers, gzip, files.

package trace

import (
	"bytes"
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

// opGen draws any op that Check accepts.
func opGen() *rapid.Generator[Op] {
	tag := rapid.StringMatching(`[A-Za-z0-9_.:/\-]{1,12}|ü[a-z]{0,3}`)
	num := rapid.OneOf(rapid.Uint64Range(0, 10), rapid.Uint64())
	return rapid.Custom(func(t *rapid.T) Op {
		switch rapid.SampledFrom([]Kind{Alloc, Free, RecordStream, SyncStream, SyncDevice, EmptyCache, Tag, Mark}).Draw(t, "kind") {
		case Alloc:
			return Op{Kind: Alloc, ID: num.Draw(t, "id"), Size: num.Draw(t, "size"), Stream: num.Draw(t, "stream")}
		case Free:
			return Op{Kind: Free, ID: num.Draw(t, "id")}
		case RecordStream:
			return Op{Kind: RecordStream, ID: num.Draw(t, "id"), Stream: num.Draw(t, "stream")}
		case SyncStream:
			return Op{Kind: SyncStream, Stream: num.Draw(t, "stream")}
		case SyncDevice:
			return Op{Kind: SyncDevice}
		case EmptyCache:
			return Op{Kind: EmptyCache}
		case Mark:
			return Op{Kind: Mark, Name: tag.Draw(t, "name")}
		default:
			if rapid.Bool().Draw(t, "clear") {
				return Op{Kind: Tag}
			}
			return Op{Kind: Tag, Tag: tag.Draw(t, "tag")}
		}
	})
}

func TestRoundTripProperty(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		ops := rapid.SliceOfN(opGen(), 0, 200).Draw(t, "ops")
		header := rapid.SliceOfN(rapid.OneOf(rapid.StringMatching(`[ -~]{0,30}`), rapid.StringMatching(`mark [a-z ]{1,5}`)), 0, 3).Draw(t, "header")
		zip := rapid.Bool().Draw(t, "gzip")
		var buf bytes.Buffer
		w := NewWriter(&buf, header...)
		if zip {
			w = NewGzipWriter(&buf, header...)
		}
		for _, op := range ops {
			if err := w.Write(op); err != nil {
				t.Fatalf("Write(%v): %v", op, err)
			}
		}
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		rd, err := NewReader(&buf)
		if err != nil {
			t.Fatal(err)
		}
		var back []Op
		for {
			op, err := rd.Next()
			if err != nil {
				break
			}
			back = append(back, op)
		}
		if len(ops) == 0 {
			ops = nil
		}
		if !assert.ObjectsAreEqual(ops, back) {
			t.Fatalf("round trip changed the ops:\n%v\n%v", ops, back)
		}
		h := rd.Header()
		if len(h) == 0 || !strings.HasPrefix(h[0], Version) {
			t.Fatalf("header %q does not start with %q", h, Version)
		}
		if len(header) > 1 && !assert.ObjectsAreEqual(header[1:], h[1:]) {
			t.Fatalf("header %q read back as %q", header, h)
		}
	})
}

func TestWriterHeader(t *testing.T) {
	cases := []struct {
		header []string
		want   string
	}{
		{nil, "# memtrace v1\n"},
		{[]string{"source=x"}, "# memtrace v1 source=x\n"},
		{[]string{"memtrace v1 source=y", "two"}, "# memtrace v1 source=y\n# two\n"},
		{[]string{"", "a\nb", ""}, "# memtrace v1\n# a\n# b\n#\n"},
	}
	for _, c := range cases {
		var buf bytes.Buffer
		w := NewWriter(&buf, c.header...)
		require.NoError(t, w.Flush())
		assert.Equal(t, c.want, buf.String(), "%q", c.header)
	}
}

func TestWriterCommentAndOps(t *testing.T) {
	var buf bytes.Buffer
	w := NewWriter(&buf, "test")
	require.NoError(t, w.Write(Op{Kind: Alloc, ID: 1, Size: 512}))
	require.NoError(t, w.Comment("middle"))
	require.NoError(t, w.Write(Op{Kind: Free, ID: 1}))
	require.NoError(t, w.Close())
	assert.Equal(t, "# memtrace v1 test\na 1 512 0\n# middle\nf 1\n", buf.String())
	rd, err := NewReader(&buf)
	require.NoError(t, err)
	assert.Equal(t, []string{"memtrace v1 test"}, rd.Header(), "a comment after the first op is not header")
}

// A Mark op is written as an m line; a comment that would read as a mark
// is written so that it stays a comment.
func TestWriterMarks(t *testing.T) {
	var buf bytes.Buffer
	w := NewWriter(&buf, "test", "mark header")
	require.NoError(t, w.Write(Op{Kind: Mark, Name: "step0"}))
	require.NoError(t, w.Comment("mark step1"))
	require.NoError(t, w.Write(Op{Kind: Alloc, ID: 1, Size: 512}))
	require.NoError(t, w.Close())
	text := buf.String()
	assert.Equal(t, "# memtrace v1 test\n#mark header\nm step0\n#mark step1\na 1 512 0\n", text)
	rd, err := NewReader(strings.NewReader(text))
	require.NoError(t, err)
	assert.Equal(t, []string{"memtrace v1 test", "mark header"}, rd.Header())
	ops, err := ReadAll(strings.NewReader(text))
	require.NoError(t, err)
	assert.Equal(t, []Op{{Kind: Mark, Name: "step0"}, {Kind: Alloc, ID: 1, Size: 512}}, ops)
}

func TestWriterRejectsBadOpAndGoesOn(t *testing.T) {
	var buf bytes.Buffer
	w := NewWriter(&buf)
	assert.Error(t, w.Write(Op{Kind: 'x'}))
	assert.Error(t, w.Write(Op{Kind: Tag, Tag: "a b"}))
	require.NoError(t, w.Write(Op{Kind: SyncDevice}))
	require.NoError(t, w.Close())
	assert.Equal(t, "# memtrace v1\nS\n", buf.String())
}

type failWriter struct{ n int }

func (f *failWriter) Write(p []byte) (int, error) {
	if f.n <= 0 {
		return 0, errors.New("disk full")
	}
	f.n--
	return len(p), nil
}

func TestWriterStickyError(t *testing.T) {
	w := NewWriter(&failWriter{})
	for i := 0; i < 10000; i++ {
		if err := w.Write(Op{Kind: Alloc, ID: uint64(i), Size: 1}); err != nil {
			assert.ErrorContains(t, err, "disk full")
			break
		}
	}
	assert.ErrorContains(t, w.Flush(), "disk full")
	assert.ErrorContains(t, w.Close(), "disk full")
}

func TestWriterCloseTwiceAndWriteAfterClose(t *testing.T) {
	var buf bytes.Buffer
	w := NewGzipWriter(&buf)
	require.NoError(t, w.Write(Op{Kind: EmptyCache}))
	require.NoError(t, w.Close())
	require.NoError(t, w.Close())
	assert.Error(t, w.Write(Op{Kind: EmptyCache}))
	ops, err := ReadAll(&buf)
	require.NoError(t, err)
	assert.Equal(t, []Op{{Kind: EmptyCache}}, ops)
}

func TestCreateGzipByName(t *testing.T) {
	dir := t.TempDir()
	for _, name := range []string{"t.trace", "t.trace.gz"} {
		path := filepath.Join(dir, name)
		w, err := Create(path, "file test")
		require.NoError(t, err)
		require.NoError(t, w.Write(Op{Kind: Alloc, ID: 7, Size: 9, Stream: 1}))
		require.NoError(t, w.Close())
		rd, err := Open(path)
		require.NoError(t, err)
		assert.Equal(t, rd.gz != nil, strings.HasSuffix(name, ".gz"), name)
		op, err := rd.Next()
		require.NoError(t, err)
		assert.Equal(t, Op{Kind: Alloc, ID: 7, Size: 9, Stream: 1}, op)
		require.NoError(t, rd.Close())
	}
	_, err := Create(filepath.Join(dir, "missing", "x.trace"))
	assert.Error(t, err)
}

func BenchmarkWriter(b *testing.B) {
	ops := []Op{{Kind: Alloc, ID: 123456, Size: 25165824}, {Kind: Free, ID: 123456}, {Kind: RecordStream, ID: 1, Stream: 2}}
	w := NewWriter(discard{})
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		if err := w.Write(ops[i%len(ops)]); err != nil {
			b.Fatal(err)
		}
	}
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }
