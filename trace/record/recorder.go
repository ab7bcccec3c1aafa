// This file holds Recorder, which writes what an allocator does as
// memtrace.

package record

import (
	"errors"
	"runtime"
	"strings"
	"sync"
	"unicode"

	"github.com/gpumem/gpumem/allocator"
	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/stats"
	"github.com/gpumem/gpumem/trace"
	"github.com/gpumem/gpumem/trace/internal/callsite"
)

// Recorder writes the requests an allocator serves as memtrace: each
// allocation becomes an a line with a fresh ID, each free an f line, each
// RecordStream an r line, each EmptyCache a c line. Attach it with
// Allocator.Attach; when done, detach it and call Close, which flushes and
// closes the trace.Writer (or Flush, to keep the Writer open). Tags (t
// lines) and stream synchronizations (s, S) are not visible to the
// allocator: write them with Tag, Mark, SyncStream and SyncDevice.
//
// With Options.Stacks, the Recorder also keeps the Go call stack of every
// live allocation (LiveBlocks, WriteProfile), and it is an
// allocator.SiteReporter: an out-of-memory error of the allocator it is
// attached to lists the call sites that hold the most memory.
//
// A Recorder is safe for concurrent use. Its first write error is kept
// and returned by Err, Flush and Close.
type Recorder struct {
	mu     sync.Mutex // guards everything below
	w      *trace.Writer
	nextID uint64
	ids    map[device.Ptr]uint64
	stacks map[device.Ptr]*LiveBlock
	keep   bool
	closed bool
	err    error
	sites  callsite.Cache
	steps  stats.StepCounts[siteKey] // with Stacks: live blocks by call site at each step boundary
}

// LiveBlock is an allocation that has not been freed, with the Go call
// stack that allocated it (program counters, for runtime.CallersFrames).
type LiveBlock struct {
	ID        uint64
	Ptr       device.Ptr
	Size      uint64 // bytes requested by the caller
	BlockSize uint64 // bytes of the block that serves them (Size rounded up)
	Stream    device.Stream
	Stack     []uintptr
}

// Options configures a Recorder.
type Options struct {
	// Stacks keeps the Go call stack of every live allocation, for
	// LiveBlocks and WriteProfile.
	Stacks bool
}

// New returns a Recorder that writes to w.
func New(w *trace.Writer, opt Options) *Recorder {
	r := &Recorder{w: w, ids: make(map[device.Ptr]uint64), keep: opt.Stacks}
	if opt.Stacks {
		r.stacks = make(map[device.Ptr]*LiveBlock)
	}
	return r
}

// Observe implements allocator.Observer.
func (r *Recorder) Observe(e allocator.Action) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return
	}
	switch e.Kind {
	case allocator.ActionAlloc:
		id := r.nextID
		r.nextID++
		r.ids[e.Ptr] = id
		r.write(trace.Op{Kind: trace.Alloc, ID: id, Size: e.Requested, Stream: uint64(e.Stream)})
		if r.keep {
			pcs := make([]uintptr, 32)
			n := runtime.Callers(3, pcs)
			r.stacks[e.Ptr] = &LiveBlock{ID: id, Ptr: e.Ptr, Size: e.Requested, BlockSize: e.Size, Stream: e.Stream, Stack: pcs[:n:n]}
		}
	case allocator.ActionFreeRequested:
		id, ok := r.ids[e.Ptr]
		if !ok {
			return // allocated before the recorder was attached
		}
		delete(r.ids, e.Ptr)
		delete(r.stacks, e.Ptr)
		r.write(trace.Op{Kind: trace.Free, ID: id})
	case allocator.ActionRecordStream:
		if id, ok := r.ids[e.Ptr]; ok {
			r.write(trace.Op{Kind: trace.RecordStream, ID: id, Stream: uint64(e.Stream)})
		}
	case allocator.ActionEmptyCache:
		r.write(trace.Op{Kind: trace.EmptyCache})
	case allocator.ActionPhase:
		r.write(trace.Op{Kind: trace.Tag, Tag: field(e.Phase)})
	case allocator.ActionStep:
		name := field(e.Step)
		if name == "" {
			name = "-" // a mark needs a name
		}
		r.write(trace.Op{Kind: trace.Mark, Name: name})
		if r.keep {
			r.countSitesLocked()
		}
	}
}

// field makes a phase or step name one memtrace field: white space and
// control characters become '_'; an empty step name becomes "-".
func field(name string) string {
	return strings.Map(func(r rune) rune {
		if unicode.IsSpace(r) || unicode.IsControl(r) {
			return '_'
		}
		return r
	}, name)
}

func (r *Recorder) write(op trace.Op) {
	if r.err == nil {
		r.err = r.w.Write(op)
	}
}

// Tag writes a t line: the allocations that follow belong to tag ("" clears
// it). A tag is one field: no spaces. A bad tag is an error that writes
// nothing and does not stop the Recorder.
func (r *Recorder) Tag(tag string) error {
	return r.writeChecked(trace.Op{Kind: trace.Tag, Tag: tag})
}

// writeChecked writes an op given by the program, refusing one that has no
// memtrace form without making the refusal the Recorder's sticky error.
func (r *Recorder) writeChecked(op trace.Op) error {
	if err := op.Check(); err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return errClosed
	}
	r.write(op)
	return r.err
}

// Mark writes an m line: a step boundary named name (the start of a
// training step or of a request). The name is one field: no spaces. A bad
// name is an error that writes nothing and does not stop the Recorder.
func (r *Recorder) Mark(name string) error {
	return r.writeChecked(trace.Op{Kind: trace.Mark, Name: name})
}

// SyncStream writes an s line: the work queued on s so far has finished.
func (r *Recorder) SyncStream(s device.Stream) error {
	return r.writeChecked(trace.Op{Kind: trace.SyncStream, Stream: uint64(s)})
}

// SyncDevice writes an S line: the whole device was synchronized.
func (r *Recorder) SyncDevice() error {
	return r.writeChecked(trace.Op{Kind: trace.SyncDevice})
}

// LiveBlocks returns the allocations not yet freed, with their stacks,
// when the Recorder was made with Options.Stacks (otherwise nil).
func (r *Recorder) LiveBlocks() []LiveBlock {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]LiveBlock, 0, len(r.stacks))
	for _, b := range r.stacks {
		out = append(out, *b)
	}
	return out
}

// Err returns the first write error.
func (r *Recorder) Err() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.err
}

// Flush flushes the underlying Writer.
func (r *Recorder) Flush() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.err != nil || r.closed {
		return r.err
	}
	return r.w.Flush()
}

// errClosed is the error of a write the program makes after Close.
var errClosed = errors.New("record: Recorder closed")

// Close ends the recording: it closes the trace.Writer the Recorder writes
// to (which flushes it, finishes a gzip stream, and closes the file of a
// Writer from trace.Create) and returns the first error of the recording
// or of the close. Detach the Recorder first: after Close it writes
// nothing, ignores the allocator's actions, and its Tag, Mark, SyncStream
// and SyncDevice fail. Closing twice is harmless. The Recorder owns the
// Writer from then on; to keep the Writer open, call Flush instead.
func (r *Recorder) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return r.err
	}
	r.closed = true
	if err := r.w.Close(); r.err == nil {
		r.err = err
	}
	return r.err
}
