// This file holds Reader, the streaming memtrace parser (plain or gzip).

package trace

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
)

// Reader reads the ops of a memtrace one at a time, in bounded memory: it
// holds one buffered line, never the trace. Gzip input is recognised by
// its magic bytes and decompressed on the fly, as gzip(1) does (see
// GzipReader): garbage after the compressed data ends the trace with a
// warning (Warnings), not an error. A UTF-8 byte order mark at the start
// of the text is skipped.
//
// A Reader is not safe for concurrent use.
type Reader struct {
	br     *bufio.Reader
	gz     *GzipReader // nil for plain input
	file   *os.File    // set by Open; closed by Close
	p      parser
	line   int      // number of the last line read
	header []string // the leading comment block, without "#" (bounded: see Header)

	headerBytes int // bytes in header

	pending    bool // the first op line was read (and parsed) by NewReader
	pendingOp  Op
	pendingErr error

	err error // sticky: once set, Next returns it forever
}

// isMarkComment reports whether a comment line is a step mark, which the
// Reader returns as a Mark op.
func isMarkComment(line []byte) bool {
	_, ok := markComment(line)
	return ok
}

// gzipMagic opens every gzip stream.
var gzipMagic = [2]byte{0x1f, 0x8b}

// utf8BOM is the byte order mark that some editors put at the start of a
// UTF-8 text.
var utf8BOM = []byte{0xef, 0xbb, 0xbf}

// NewReader returns a Reader of the memtrace in r, plain or gzip. It reads
// the leading comment block at once, so that Header is ready; it fails
// only if r cannot be read or its gzip header is damaged.
func NewReader(r io.Reader) (*Reader, error) {
	rd := &Reader{br: bufio.NewReaderSize(r, MaxLineLength)}
	if magic, _ := rd.br.Peek(2); IsGzip(magic) {
		gz, err := NewGzipReader(rd.br)
		if err != nil {
			return nil, fmt.Errorf("memtrace: %w", err)
		}
		rd.gz = gz
		rd.br = bufio.NewReaderSize(gz, MaxLineLength)
	}
	if bom, _ := rd.br.Peek(len(utf8BOM)); bytes.Equal(bom, utf8BOM) {
		rd.br.Discard(len(utf8BOM))
	}
	// Collect the leading comments; keep the first op line's outcome for Next.
	for {
		text, err := rd.readLine()
		if err == io.EOF {
			return rd, nil
		}
		if err != nil {
			if se := (*SyntaxError)(nil); errors.As(err, &se) {
				rd.pending, rd.pendingErr = true, err
				return rd, nil
			}
			return nil, err
		}
		if len(text) == 0 {
			continue
		}
		if text[0] == '#' && !isMarkComment(text) {
			c := text[1:]
			if len(c) > 0 && c[0] == ' ' {
				c = c[1:]
			}
			if len(rd.header) < maxHeaderLines && rd.headerBytes+len(c) <= MaxLineLength {
				rd.header = append(rd.header, string(c))
				rd.headerBytes += len(c)
			}
			continue
		}
		rd.pending = true
		op, msg := rd.p.parse(text)
		if msg != "" {
			rd.pendingErr = newSyntaxError(rd.line, text, msg)
		}
		rd.pendingOp = op
		return rd, nil
	}
}

// Open opens the memtrace file at path (plain or gzip). Close the Reader
// when done.
func Open(path string) (*Reader, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	rd, err := NewReader(f)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	rd.file = f
	return rd, nil
}

// Close releases what the Reader holds: the gzip decompressor and, for a
// Reader from Open, the file. It does not close an io.Reader given to
// NewReader.
func (r *Reader) Close() error {
	var err error
	if r.gz != nil {
		err = r.gz.Close()
	}
	if r.file != nil {
		if cerr := r.file.Close(); err == nil {
			err = cerr
		}
		r.file = nil
	}
	return err
}

// maxHeaderLines bounds the comment lines that Header keeps.
const maxHeaderLines = 256

// Header returns the trace's leading comment block: the comment lines
// before the first op, each without its "#" and one space after it. By
// convention the first says where the trace came from ("memtrace v1 ...").
// A "# mark NAME" comment is an op (a Mark), so it ends the header. So
// that a trace of nothing but comments is read in bounded memory too,
// Header keeps the first 256 lines, and no more than MaxLineLength bytes
// of them; the rest of the block is skipped.
func (r *Reader) Header() []string {
	return append([]string(nil), r.header...)
}

// Line returns the number of the last line read: after Next, the line of
// the op (or of the error) it returned.
func (r *Reader) Line() int { return r.line }

// Warnings returns what the Reader accepted but the caller should hear
// about: today, garbage after the gzip data, which ends the trace (as
// gzip(1) ignores it). It is complete once Next has returned io.EOF.
func (r *Reader) Warnings() []string {
	if r.gz != nil && r.gz.Warning() != "" {
		return []string{"memtrace: " + r.gz.Warning()}
	}
	return nil
}

// Next returns the next op. At the end of the trace it returns io.EOF.
// Comments and blank lines are skipped, except a comment that is exactly
// "# mark NAME", which is returned as a Mark op. A malformed line gives a
// *SyntaxError naming the line; errors are final, so every later call
// returns the same error.
func (r *Reader) Next() (Op, error) {
	if r.err != nil {
		return Op{}, r.err
	}
	if r.pending {
		r.pending = false
		if r.pendingErr != nil {
			r.err = r.pendingErr
			return Op{}, r.err
		}
		return r.pendingOp, nil
	}
	for {
		text, err := r.readLine()
		if err != nil {
			r.err = err
			return Op{}, err
		}
		if op, ok := parseFast(text); ok {
			return op, nil
		}
		if len(text) == 0 || text[0] == '#' && !isMarkComment(text) {
			continue
		}
		op, msg := r.p.parseFields(text)
		if msg != "" {
			r.err = newSyntaxError(r.line, text, msg)
			return Op{}, r.err
		}
		return op, nil
	}
}

// readLine returns the next line without its "\n" (or "\r\n"). The slice
// is valid until the next read.
func (r *Reader) readLine() ([]byte, error) {
	b, err := r.br.ReadSlice('\n')
	switch {
	case err == nil:
	case errors.Is(err, bufio.ErrBufferFull):
		r.line++
		return nil, newSyntaxError(r.line, b, fmt.Sprintf("line longer than %d bytes", MaxLineLength))
	case err == io.EOF:
		if len(b) == 0 {
			return nil, io.EOF
		}
	default:
		return nil, fmt.Errorf("memtrace: reading line %d: %w", r.line+1, err)
	}
	r.line++
	if n := len(b); n > 0 && b[n-1] == '\n' {
		b = b[:n-1]
		if n := len(b); n > 0 && b[n-1] == '\r' {
			b = b[:n-1]
		}
	}
	return b, nil
}

// ReadAll reads every op of the memtrace in r. It holds the whole trace in
// memory; use a Reader to stream a long one.
func ReadAll(r io.Reader) ([]Op, error) {
	rd, err := NewReader(r)
	if err != nil {
		return nil, err
	}
	defer rd.Close()
	return rd.rest()
}

// ReadFile reads every op of the memtrace file at path, plain or gzip
// (see Open). It holds the whole trace in memory.
func ReadFile(path string) ([]Op, error) {
	rd, err := Open(path)
	if err != nil {
		return nil, err
	}
	defer rd.Close()
	return rd.rest()
}

// rest reads the ops left in rd, up to the end or the first error; with
// an error, the ops before it.
func (rd *Reader) rest() ([]Op, error) {
	var ops []Op
	for {
		op, err := rd.Next()
		if err == io.EOF {
			return ops, nil
		}
		if err != nil {
			return ops, err
		}
		ops = append(ops, op)
	}
}

// OpReader is a source of ops, one at a time: a *Reader, or SliceReader of
// ops held in memory. Replay and conversion take an OpReader.
type OpReader interface {
	// Next returns the next op, or io.EOF at the end.
	Next() (Op, error)
	// Line returns the line number of the op Next returned last.
	Line() int
}

// SliceReader returns an OpReader of ops; op i is "line" i+1.
func SliceReader(ops []Op) OpReader { return &sliceReader{ops: ops} }

type sliceReader struct {
	ops []Op
	i   int
}

func (s *sliceReader) Next() (Op, error) {
	if s.i >= len(s.ops) {
		return Op{}, io.EOF
	}
	s.i++
	return s.ops[s.i-1], nil
}

func (s *sliceReader) Line() int { return s.i }
