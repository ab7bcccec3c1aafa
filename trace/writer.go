// This file holds Writer, which writes memtrace v1 (plain or gzip).

package trace

import (
	"bufio"
	"compress/gzip"
	"errors"
	"io"
	"os"
	"strings"
)

// Writer writes ops as memtrace lines. Output is buffered: call Flush, or
// Close, when done. The first error is kept and returned by every later
// call, as bufio.Writer does.
//
// A Writer is not safe for concurrent use.
type Writer struct {
	bw   *bufio.Writer
	gz   *gzip.Writer // nil for plain output
	file *os.File     // set by Create; closed by Close
	buf  []byte
	err  error
}

// NewWriter returns a Writer of plain memtrace to w and writes the header
// comment block at once. The first header line is "# memtrace v1", followed
// on the same line by header[0] unless header[0] already starts with
// "memtrace v1"; each other header string becomes a comment line of its
// own. A header string with newlines becomes several comment lines.
func NewWriter(w io.Writer, header ...string) *Writer {
	tw := &Writer{bw: bufio.NewWriterSize(w, 64<<10)}
	tw.writeHeader(header)
	return tw
}

// NewGzipWriter is NewWriter with gzip compression. Close it (which does
// not close w) to finish the gzip stream.
func NewGzipWriter(w io.Writer, header ...string) *Writer {
	gz := gzip.NewWriter(w)
	tw := &Writer{bw: bufio.NewWriterSize(gz, 64<<10), gz: gz}
	tw.writeHeader(header)
	return tw
}

// Create creates (or truncates) the file at path and returns a Writer to
// it, gzip-compressed when path ends in ".gz". Close the Writer to finish
// the file.
func Create(path string, header ...string) (*Writer, error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	var w *Writer
	if strings.HasSuffix(path, ".gz") {
		w = NewGzipWriter(f, header...)
	} else {
		w = NewWriter(f, header...)
	}
	w.file = f
	return w, nil
}

// Version is the first word pair of a memtrace header.
const Version = "memtrace v1"

func (w *Writer) writeHeader(header []string) {
	first := Version
	if len(header) > 0 {
		if strings.HasPrefix(header[0], Version) {
			first = header[0]
		} else if header[0] != "" {
			first = Version + " " + header[0]
		}
		header = header[1:]
	}
	w.comment(first)
	for _, h := range header {
		w.comment(h)
	}
}

// Comment writes text as comment lines ("# text"); text with newlines
// becomes several lines. Comments after the first op are not part of the
// header that Reader.Header returns. A comment always reads back as a
// comment: a line "mark NAME" is written "#mark NAME", since "# mark NAME"
// is a step mark; write a Mark op for that.
func (w *Writer) Comment(text string) error {
	w.comment(text)
	return w.err
}

func (w *Writer) comment(text string) {
	for _, line := range strings.Split(text, "\n") {
		line = strings.TrimSuffix(line, "\r")
		if w.err != nil {
			return
		}
		if line == "" {
			_, w.err = w.bw.WriteString("#\n")
			continue
		}
		w.buf = append(w.buf[:0], "# "...)
		w.buf = append(w.buf, line...)
		if _, ok := markComment(w.buf); ok {
			// "# mark NAME" would read back as a Mark op: keep it a
			// comment (Reader.Header gives the same text back).
			w.buf = append(w.buf[:1], line...)
		}
		w.buf = append(w.buf, '\n')
		_, w.err = w.bw.Write(w.buf)
	}
}

// Write writes op as one line. An op that Op.Check rejects is an error
// and writes nothing; it does not stop the Writer.
func (w *Writer) Write(op Op) error {
	if w.err != nil {
		return w.err
	}
	b, err := op.AppendText(w.buf[:0])
	if err != nil {
		return err
	}
	b = append(b, '\n')
	w.buf = b
	_, w.err = w.bw.Write(b)
	return w.err
}

// Flush writes buffered lines to the underlying writer (for gzip, as far
// as the compressor lets them go).
func (w *Writer) Flush() error {
	if w.err != nil {
		return w.err
	}
	if w.err = w.bw.Flush(); w.err != nil {
		return w.err
	}
	if w.gz != nil {
		w.err = w.gz.Flush()
	}
	return w.err
}

// errClosed is the Writer's error after a successful Close.
var errClosed = errors.New("memtrace: write to a closed Writer")

// Close flushes, finishes the gzip stream if any, and closes the file of a
// Writer from Create. It never closes an io.Writer given to NewWriter or
// NewGzipWriter. Closing twice is harmless.
func (w *Writer) Close() error {
	if w.err == errClosed {
		return nil
	}
	err := w.bw.Flush()
	if w.err == nil {
		w.err = err
	}
	if w.gz != nil {
		if err := w.gz.Close(); w.err == nil {
			w.err = err
		}
		w.gz = nil
	}
	if w.file != nil {
		if err := w.file.Close(); w.err == nil {
			w.err = err
		}
		w.file = nil
	}
	if w.err != nil {
		return w.err
	}
	w.err = errClosed
	return nil
}
