// This file holds the reading of traces in any format the project knows:
// memtrace, PyTorch memory snapshots and RMM logs, told apart by content.

package main

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"os"
	"sync/atomic"

	"github.com/gpumem/gpumem/trace"
	"github.com/gpumem/gpumem/trace/convert"
	"github.com/gpumem/gpumem/trace/pytorch"
	"github.com/gpumem/gpumem/trace/rmm"
)

// input is an open trace.
type input struct {
	name   string // the path, clipped for messages
	format convert.Format
	ops    trace.OpReader
	// For a memtrace, which is streamed: the file's size and the bytes read
	// so far, for a progress bar. size is 0 for an import, read whole.
	size int64
	read *atomic.Int64
	// imported holds an import's ops.
	imported []trace.Op
	close    func() error
}

// Close releases the file.
func (in *input) Close() error { return in.close() }

// openInput opens the trace at path: a memtrace (plain or gzip) is
// streamed, a PyTorch snapshot (device 0) or an RMM log is imported
// whole.
func openInput(path string) (*input, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fileError(err)
	}
	in := &input{name: clip(path), read: new(atomic.Int64), close: f.Close}
	if fi, err := f.Stat(); err == nil && fi.Mode().IsRegular() {
		in.size = fi.Size()
	}
	br := bufio.NewReaderSize(&countingReader{r: f, n: in.read}, 64<<10)
	head, _ := br.Peek(64 << 10)
	gz := len(head) >= 2 && head[0] == 0x1f && head[1] == 0x8b
	if gz {
		// Detect by the first decompressed bytes; the readers below
		// decompress the stream themselves.
		zr, err := gzip.NewReader(bytes.NewReader(head))
		if err != nil {
			f.Close()
			return nil, fmt.Errorf("%s: gzip: %w", in.name, err)
		}
		head, _ = io.ReadAll(io.LimitReader(zr, 512))
	}
	in.format = convert.Detect(head)
	var im *trace.Import
	switch in.format {
	case convert.PyTorchSnapshot:
		im, err = pytorch.ReadSnapshot(br, pytorch.SnapshotOptions{})
	case convert.RMMLog:
		var body io.Reader = br
		if gz {
			zr, zerr := gzip.NewReader(br)
			if zerr != nil {
				f.Close()
				return nil, fmt.Errorf("%s: gzip: %w", in.name, zerr)
			}
			body = zr
		}
		im, err = rmm.ReadLog(body)
	default:
		r, err := trace.NewReader(br)
		if err != nil {
			f.Close()
			return nil, fmt.Errorf("%s: %w", in.name, err)
		}
		in.ops = r
		in.close = func() error {
			r.Close()
			return f.Close()
		}
		return in, nil
	}
	f.Close()
	in.close = func() error { return nil }
	if err != nil {
		return nil, fmt.Errorf("%s: %w", in.name, err)
	}
	in.size = 0
	in.imported = im.Ops
	in.ops = trace.SliceReader(im.Ops)
	return in, nil
}

// loadOps reads every op of the trace at path into memory, for the
// commands that replay a trace many times (about 64 bytes an op).
func loadOps(path string) ([]trace.Op, error) {
	in, err := openInput(path)
	if err != nil {
		return nil, err
	}
	defer in.Close()
	if in.imported != nil {
		return in.imported, nil
	}
	var ops []trace.Op
	for {
		op, err := in.ops.Next()
		if err == io.EOF {
			return ops, nil
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", in.name, err)
		}
		ops = append(ops, op)
	}
}
