// This file holds Recorder, which writes what an allocator does as
// memtrace.

package record

import (
	"runtime"
	"sync"

	"github.com/gpumem/gpumem/allocator"
	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/trace"
)

// Recorder writes the requests an allocator serves as memtrace: each
// allocation becomes an a line with a fresh ID, each free an f line, each
// RecordStream an r line, each EmptyCache a c line. Attach it with
// Allocator.Attach; detach it and call Flush (or Close) when done. Tags
// (t lines) and stream synchronizations (s, S) are not visible to the
// allocator: write them with Tag, Mark, SyncStream and SyncDevice.
//
// With Options.Stacks, the Recorder also keeps the Go call stack of every
// live allocation (LiveBlocks), so that a report can say where memory
// was allocated.
//
// A Recorder is safe for concurrent use. Its first write error is kept
// and returned by Err and Flush.
type Recorder struct {
	mu     sync.Mutex // guards everything below
	w      *trace.Writer
	nextID uint64
	ids    map[device.Ptr]uint64
	stacks map[device.Ptr]*LiveBlock
	keep   bool
	err    error
}

// LiveBlock is an allocation that has not been freed, with the Go call
// stack that allocated it (program counters, for runtime.CallersFrames).
type LiveBlock struct {
	ID     uint64
	Ptr    device.Ptr
	Size   uint64
	Stream device.Stream
	Stack  []uintptr
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
	switch e.Kind {
	case allocator.ActionAlloc:
		id := r.nextID
		r.nextID++
		r.ids[e.Ptr] = id
		r.write(trace.Op{Kind: trace.Alloc, ID: id, Size: e.Requested, Stream: uint64(e.Stream)})
		if r.keep {
			pcs := make([]uintptr, 32)
			n := runtime.Callers(3, pcs)
			r.stacks[e.Ptr] = &LiveBlock{ID: id, Ptr: e.Ptr, Size: e.Requested, Stream: e.Stream, Stack: pcs[:n:n]}
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
	}
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
	r.mu.Lock()
	defer r.mu.Unlock()
	r.write(trace.Op{Kind: trace.SyncStream, Stream: uint64(s)})
	return r.err
}

// SyncDevice writes an S line: the whole device was synchronized.
func (r *Recorder) SyncDevice() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.write(trace.Op{Kind: trace.SyncDevice})
	return r.err
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
	if r.err != nil {
		return r.err
	}
	return r.w.Flush()
}
