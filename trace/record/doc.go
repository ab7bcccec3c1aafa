// Package record writes what a running allocator does as memtrace, so that
// a real program's allocations can be replayed later (trace/replay), and
// keeps the Go call stack of every live allocation for a pprof profile of
// live device memory by call site.
//
// # The model
//
// A Recorder is an allocator.Observer: attach it with Allocator.Attach and
// it sees each action the allocator takes. It gives each allocation the
// next ID, 0, 1, 2, ..., and remembers the ID by pointer until the free:
//
//	allocation served       a ID BYTES STREAM  (BYTES as requested)
//	free requested          f ID
//	RecordStream            r ID STREAM
//	EmptyCache              c
//
// Blocks allocated before the Recorder was attached have no ID; their
// frees and record-streams are left out, so a recording started mid-run
// is still a valid trace. Other actions (segments, page maps, retries) are
// the allocator's answer to the requests, not requests, and are not
// written: a replay recomputes them. What the allocator cannot see the
// program writes itself: tags with Tag, step boundaries with Mark, stream
// and device synchronizations with SyncStream and SyncDevice.
//
// With Options.Stacks the Recorder also keeps, for each live allocation,
// the program counters of the Go call stack that made it (LiveBlocks), and
// WriteProfile turns them into a pprof profile with two sample values per
// stack, live blocks and live bytes: `go tool pprof` then says which Go
// code holds device memory. Such a Recorder is also an
// allocator.SiteReporter: when the allocator it is attached to runs out of
// memory, the error lists the call sites holding the most memory
// (LargestSites), each named by the first frame of its stacks outside this
// library, "function (file.go:line)".
//
// A Recorder is safe for concurrent use, as observers must be. It writes
// through one trace.Writer; its first write error is kept and returned by
// Err, Flush and Close. Close ends the recording and closes the Writer
// (finishing a gzip stream and the file of trace.Create); Flush only
// flushes it, for a caller that keeps the Writer.
package record
