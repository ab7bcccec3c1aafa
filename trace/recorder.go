// This file holds Recorder, which writes what an allocator does as
// memtrace.

package trace

import (
	"runtime"
	"sync"

	"github.com/gpumem/gpumem/allocator"
	"github.com/gpumem/gpumem/device"
)

// Recorder writes the requests an allocator serves as memtrace: each
// allocation becomes an a line with a fresh ID, each free an f line, each
// RecordStream an r line, each EmptyCache a c line. Attach it with
// Allocator.Attach; detach it and call Flush (or Close) when done. Tags
// (t lines) and stream synchronizations (s, S) are not visible to the
// allocator: write them with Tag, SyncStream and SyncDevice.
//
// With RecordStacks, the Recorder also keeps the Go call stack of every
// live allocation (LiveBlocks), so that a report can say where memory
// was allocated.
//
// A Recorder is safe for concurrent use. Its first write error is kept
// and returned by Err and Flush.
type Recorder struct {
	mu     sync.Mutex // guards everything below
	w      *Writer
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

// RecorderOptions configures a Recorder.
type RecorderOptions struct {
	// RecordStacks keeps the Go call stack of every live allocation.
	RecordStacks bool
}

// NewRecorder returns a Recorder that writes to w.
func NewRecorder(w *Writer, opt RecorderOptions) *Recorder {
	r := &Recorder{w: w, ids: make(map[device.Ptr]uint64), keep: opt.RecordStacks}
	if opt.RecordStacks {
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
		r.write(Op{Kind: Alloc, ID: id, Size: e.Requested, Stream: uint64(e.Stream)})
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
		r.write(Op{Kind: Free, ID: id})
	case allocator.ActionRecordStream:
		if id, ok := r.ids[e.Ptr]; ok {
			r.write(Op{Kind: RecordStream, ID: id, Stream: uint64(e.Stream)})
		}
	case allocator.ActionEmptyCache:
		r.write(Op{Kind: EmptyCache})
	}
}

func (r *Recorder) write(op Op) {
	if r.err == nil {
		r.err = r.w.Write(op)
	}
}

// Tag writes a t line: the allocations that follow belong to tag ("" clears it).
func (r *Recorder) Tag(tag string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.write(Op{Kind: Tag, Tag: tag})
	return r.err
}

// SyncStream writes an s line: the work queued on s so far has finished.
func (r *Recorder) SyncStream(s device.Stream) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.write(Op{Kind: SyncStream, Stream: uint64(s)})
	return r.err
}

// SyncDevice writes an S line: the whole device was synchronized.
func (r *Recorder) SyncDevice() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.write(Op{Kind: SyncDevice})
	return r.err
}

// LiveBlocks returns the allocations not yet freed, with their stacks
// when RecordStacks is set (otherwise nil).
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
