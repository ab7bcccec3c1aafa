// This file holds Detect and Convert: format detection and conversion of
// any supported log to memtrace.

package convert

import (
	"bufio"
	"bytes"
	"fmt"
	"io"

	"github.com/gpumem/gpumem/trace"
	"github.com/gpumem/gpumem/trace/pytorch"
	"github.com/gpumem/gpumem/trace/rmm"
)

// Format is a kind of input that Convert understands.
type Format int

// The formats Convert reads.
const (
	Memtrace        Format = iota + 1 // memtrace v1 (package trace's format)
	PyTorchSnapshot                   // PyTorch memory snapshot pickle
	RMMLog                            // RMM logging_resource_adaptor CSV
)

// String names the format as Convert's header does ("pytorch-snapshot").
func (f Format) String() string {
	switch f {
	case Memtrace:
		return "memtrace"
	case PyTorchSnapshot:
		return "pytorch-snapshot"
	case RMMLog:
		return "rmm-csv"
	}
	return fmt.Sprintf("Format(%d)", int(f))
}

// Detect guesses the format of an input from its first bytes
// (already decompressed): a pickle starts with the PROTO opcode 0x80
// (protocol 2 and later, as PyTorch writes), an RMM log with a CSV header
// row naming Action and Pointer columns (after a UTF-8 byte order mark, if
// any), and anything else is taken to be memtrace, whose reader then
// rejects what it cannot parse.
func Detect(head []byte) Format {
	if len(head) > 0 && head[0] == 0x80 {
		return PyTorchSnapshot
	}
	line := bytes.TrimPrefix(head, []byte("\xef\xbb\xbf"))
	if i := bytes.IndexByte(line, '\n'); i >= 0 {
		line = line[:i]
	}
	if bytes.Contains(line, []byte(",")) && bytes.Contains(line, []byte("Action")) && bytes.Contains(line, []byte("Pointer")) {
		return RMMLog
	}
	return Memtrace
}

// Options configures Convert. The zero Options writes plain memtrace and
// reads device 0 of a snapshot.
type Options struct {
	// Device selects the device of a PyTorch snapshot
	// (pytorch.SnapshotOptions.Device).
	Device int
	// Gzip compresses the output.
	Gzip bool
	// Warn, if set, is called with what the conversion accepted but the
	// caller should hear about: garbage after gzip input, ignored as
	// gzip(1) ignores it (see trace.GzipReader). Convert never prints.
	Warn func(msg string)
}

// Convert reads a log from r, in any format Detect knows, plain or gzip,
// and writes it to w as memtrace; it returns the format it found. name
// says where the input came from (a file name, say); it goes into the
// first header line with the format. Snapshots and RMM logs go through
// pytorch.ReadSnapshot and rmm.ReadLog (see them for how blocks from
// before the log are handled), and their notes and a line of figures
// follow in the header. A memtrace input is streamed through a Reader and
// a Validator, in bounded memory, and rewritten in canonical form with its
// header kept: step marks written as "# mark NAME" comments become m
// lines, and its other comments are dropped. Nothing is written unless
// the input converts cleanly, except for memtrace, which is streamed: an
// error there leaves w holding the ops before the bad line.
func Convert(w io.Writer, r io.Reader, name string, opt Options) (Format, error) {
	br := bufio.NewReaderSize(r, 64<<10)
	head, _ := br.Peek(512)
	var in io.Reader = br
	if trace.IsGzip(head) {
		zr, err := trace.NewGzipReader(br)
		if err != nil {
			return 0, fmt.Errorf("convert %s: %w", name, err)
		}
		defer zr.Close()
		defer func() {
			if w := zr.Warning(); w != "" && opt.Warn != nil {
				opt.Warn(fmt.Sprintf("convert %s: %s", name, w))
			}
		}()
		zb := bufio.NewReaderSize(zr, 64<<10)
		head, _ = zb.Peek(512)
		in = zb
	}
	format := Detect(head)
	first := fmt.Sprintf("%s source=%s format=%s", trace.Version, name, format)

	var im *trace.Import
	var err error
	switch format {
	case PyTorchSnapshot:
		im, err = pytorch.ReadSnapshot(in, pytorch.SnapshotOptions{Device: opt.Device})
	case RMMLog:
		im, err = rmm.ReadLog(in)
	default:
		return format, copyMemtrace(w, in, first, name, opt)
	}
	if err != nil {
		return format, fmt.Errorf("convert %s: %w", name, err)
	}
	v := trace.NewValidator()
	for i, op := range im.Ops {
		if _, err := v.Check(op, 0); err != nil {
			return format, fmt.Errorf("convert %s: op %d of the import breaks the format (a bug in the importer): %w", name, i, err)
		}
	}
	header := append([]string{first}, im.Notes...)
	header = append(header, opStats(im.Ops))
	tw := newWriter(w, header, opt)
	if err := im.WriteOps(tw); err != nil {
		tw.Close()
		return format, fmt.Errorf("convert %s: %w", name, err)
	}
	if err := tw.Close(); err != nil {
		return format, fmt.Errorf("convert %s: %w", name, err)
	}
	return format, nil
}

func newWriter(w io.Writer, header []string, opt Options) *trace.Writer {
	if opt.Gzip {
		return trace.NewGzipWriter(w, header...)
	}
	return trace.NewWriter(w, header...)
}

func copyMemtrace(w io.Writer, in io.Reader, first, name string, opt Options) error {
	rd, err := trace.NewReader(in)
	if err != nil {
		return fmt.Errorf("convert %s: %w", name, err)
	}
	defer rd.Close()
	tw := newWriter(w, append([]string{first}, rd.Header()...), opt)
	v := trace.NewValidator()
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
func opStats(ops []trace.Op) string {
	var allocs, live, peak uint64
	sizes := map[uint64]uint64{}
	streams := map[uint64]bool{0: true}
	for _, op := range ops {
		switch op.Kind {
		case trace.Alloc:
			allocs++
			sizes[op.ID] = op.Size
			live += op.Size
			peak = max(peak, live)
			streams[op.Stream] = true
		case trace.Free:
			live -= sizes[op.ID]
			delete(sizes, op.ID)
		}
	}
	return fmt.Sprintf("stats: ops=%d allocs=%d peak_live_bytes=%d streams=%d", len(ops), allocs, peak, len(streams))
}
