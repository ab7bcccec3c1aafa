// This file holds Convert: format detection and conversion of any
// supported log to memtrace.

package trace

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
)

// Format is a kind of input that Convert understands.
type Format int

// The formats Convert reads.
const (
	FormatMemtrace Format = iota + 1 // memtrace v1 (this package's format)
	FormatSnapshot                   // PyTorch memory snapshot pickle
	FormatRMM                        // RMM logging_resource_adaptor CSV
)

// String names the format as Convert's header does ("pytorch-snapshot").
func (f Format) String() string {
	switch f {
	case FormatMemtrace:
		return "memtrace"
	case FormatSnapshot:
		return "pytorch-snapshot"
	case FormatRMM:
		return "rmm-csv"
	}
	return fmt.Sprintf("Format(%d)", int(f))
}

// DetectFormat guesses the format of an input from its first bytes
// (already decompressed): a pickle starts with the PROTO opcode 0x80
// (protocol 2 and later, as PyTorch writes), an RMM log with a CSV header
// row naming Action and Pointer columns, and anything else is taken to be
// memtrace, whose reader then rejects what it cannot parse.
func DetectFormat(head []byte) Format {
	if len(head) > 0 && head[0] == 0x80 {
		return FormatSnapshot
	}
	line := head
	if i := bytes.IndexByte(line, '\n'); i >= 0 {
		line = line[:i]
	}
	if bytes.Contains(line, []byte(",")) && bytes.Contains(line, []byte("Action")) && bytes.Contains(line, []byte("Pointer")) {
		return FormatRMM
	}
	return FormatMemtrace
}

// Converter converts logs to memtrace. The zero Converter writes plain
// memtrace and reads device 0 of a snapshot.
type Converter struct {
	// Device selects the device of a PyTorch snapshot (SnapshotOptions.Device).
	Device int
	// Gzip compresses the output.
	Gzip bool
}

// Convert reads a log from r, in any format DetectFormat knows, plain or
// gzip, and writes it to w as memtrace. name says where the input came
// from (a file name, say); it goes into the first header line with the
// format. Snapshots and RMM logs go through ReadSnapshot and ReadRMMLog
// (see them for how blocks from before the log are handled), and their
// notes and a line of figures follow in the header. A memtrace input is
// streamed through a Reader and a Validator, in bounded memory, and
// rewritten in canonical form with its header kept; its other comments are
// dropped. Nothing is written unless the input converts cleanly, except
// for memtrace, which is streamed: an error there leaves w holding the ops
// before the bad line.
func (c Converter) Convert(w io.Writer, r io.Reader, name string) (Format, error) {
	br := bufio.NewReaderSize(r, 64<<10)
	head, _ := br.Peek(512)
	var in io.Reader = br
	if len(head) >= 2 && head[0] == gzipMagic[0] && head[1] == gzipMagic[1] {
		zr, err := gzip.NewReader(br)
		if err != nil {
			return 0, fmt.Errorf("convert %s: gzip: %w", name, err)
		}
		defer zr.Close()
		zb := bufio.NewReaderSize(zr, 64<<10)
		head, _ = zb.Peek(512)
		in = zb
	}
	format := DetectFormat(head)
	first := fmt.Sprintf("%s source=%s format=%s", Version, name, format)

	var im *Import
	var err error
	switch format {
	case FormatSnapshot:
		im, err = ReadSnapshot(in, SnapshotOptions{Device: c.Device})
	case FormatRMM:
		im, err = ReadRMMLog(in)
	default:
		return format, c.copyMemtrace(w, in, first, name)
	}
	if err != nil {
		return format, fmt.Errorf("convert %s: %w", name, err)
	}
	v := NewValidator()
	for i, op := range im.Ops {
		if _, err := v.Check(op, 0); err != nil {
			return format, fmt.Errorf("convert %s: op %d of the import breaks the format (a bug in the importer): %w", name, i, err)
		}
	}
	header := append([]string{first}, im.Notes...)
	header = append(header, opStats(im.Ops))
	tw := c.newWriter(w, header)
	if err := im.WriteOps(tw); err != nil {
		tw.Close()
		return format, fmt.Errorf("convert %s: %w", name, err)
	}
	if err := tw.Close(); err != nil {
		return format, fmt.Errorf("convert %s: %w", name, err)
	}
	return format, nil
}

// Convert is Converter{}.Convert without the format: it converts the log
// in r (PyTorch snapshot, RMM CSV or memtrace, plain or gzip) to plain
// memtrace on w.
func Convert(w io.Writer, r io.Reader, name string) error {
	_, err := Converter{}.Convert(w, r, name)
	return err
}

func (c Converter) newWriter(w io.Writer, header []string) *Writer {
	if c.Gzip {
		return NewGzipWriter(w, header...)
	}
	return NewWriter(w, header...)
}

func (c Converter) copyMemtrace(w io.Writer, in io.Reader, first, name string) error {
	rd, err := NewReader(in)
	if err != nil {
		return fmt.Errorf("convert %s: %w", name, err)
	}
	defer rd.Close()
	tw := c.newWriter(w, append([]string{first}, rd.Header()...))
	v := NewValidator()
	for {
		op, err := rd.Next()
		if err == io.EOF {
			break
		}
		if err == nil {
			_, err = v.Check(op, rd.Line())
		}
		if err == nil {
			err = tw.Write(op)
		}
		if err != nil {
			tw.Close()
			return fmt.Errorf("convert %s: %w", name, err)
		}
	}
	if err := tw.Close(); err != nil {
		return fmt.Errorf("convert %s: %w", name, err)
	}
	return nil
}

// opStats summarises ops as a header line.
func opStats(ops []Op) string {
	var allocs, live, peak uint64
	sizes := map[uint64]uint64{}
	streams := map[uint64]bool{0: true}
	for _, op := range ops {
		switch op.Kind {
		case Alloc:
			allocs++
			sizes[op.ID] = op.Size
			live += op.Size
			peak = max(peak, live)
			streams[op.Stream] = true
		case Free:
			live -= sizes[op.ID]
			delete(sizes, op.ID)
		}
	}
	return fmt.Sprintf("stats: ops=%d allocs=%d peak_live_bytes=%d streams=%d", len(ops), allocs, peak, len(streams))
}
