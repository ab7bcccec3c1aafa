// Package trace is memtrace, the project's allocation trace format: the
// record of what a program asked of a GPU allocator, which can be replayed
// against any allocator to study its time, peaks and fragmentation. It
// holds the ops, a streaming reader, a writer and the validator of the
// format's stateful rules.
//
// # The memtrace format
//
// The specification is FORMAT.md, beside this file; in short, memtrace v1
// is plain text, one operation a line, fields separated by single spaces:
//
//	a ID BYTES [STREAM]   allocate BYTES on STREAM (default 0), call the block ID
//	f ID                  free the block called ID
//	r ID STREAM           the block called ID is used on STREAM too (record-stream)
//	s STREAM              work queued on STREAM so far has finished
//	S                     the whole device is synchronized
//	c                     empty the cache
//	t [TAG]               allocations that follow belong to TAG; t alone clears it
//	m NAME                a step boundary called NAME (a training step, a request)
//
// Lines starting with "#" are comments; the first says where the trace came
// from ("# memtrace v1 source=..."). One comment is an operation: a line
// that is exactly "# mark NAME" is a step boundary, as "m NAME" is, so
// that captures made before m existed keep their steps. Blank lines are
// skipped, and a line may end in "\r\n". Files may be gzip-compressed.
// Numbers are decimal uint64 without sign or leading zeros; a TAG or NAME
// is one field of printable UTF-8.
//
// In Go an operation is an Op: a Kind (whose value is the line's letter:
// Alloc is 'a', Mark is 'm') and the fields the kind uses. Op.String is
// the line.
//
// # Reading and writing
//
// Reader streams a trace: Next returns one Op at a time, so a trace of tens
// of millions of lines is read in the memory of one line. It parses each
// line in place in its buffer and does not allocate per line (only the
// first use of each tag or mark name costs a string). It never guesses: a
// missing or extra field, a bad or overflowing integer, an unknown letter,
// two spaces, a tab or a trailing space is a *SyntaxError that names the
// line number and the line, and ends the reading. Reader detects gzip by
// its magic bytes. The leading comment block is available as Header.
// What consumes ops takes an OpReader: a *Reader, or SliceReader of ops
// held in memory. NextBatch reads many ops in one call, the plain a, f, r
// and s lines straight from the read buffer, as many Next calls would.
//
// Writer writes ops, plain (NewWriter) or gzip (NewGzipWriter, or Create
// with a ".gz" name), after a header comment block that starts with
// "# memtrace v1". An op that cannot be written and read back unchanged
// (see Op.Check) is refused, and a Mark is written as an m line.
//
// The reader checks each line alone. The rules that need state, that an f
// or r names a live ID and that an a does not reuse one, belong to whoever
// consumes the ops; Validator tracks the live IDs and reports a broken rule
// as a *StateError with the line number (ReadBatch checks a batch as it
// reads it from a Reader). It also carries the one exception
// the format makes: after an allocation that failed with out of memory in
// a replay (MarkFailed), the later f of that ID is to be skipped.
//
// # Imported traces
//
// Other tools' logs cover a window of a run, not all of it. The importers
// (trace/pytorch for PyTorch memory snapshots, trace/rmm for RMM logs)
// turn one into an Import: ops that allocate up front the blocks alive
// before the window, then the window, then frees of the blocks alive at
// its end, so that the result is a self-consistent trace. Import.WriteOps
// writes it with comments where the window starts and ends.
//
// # What lives elsewhere
//
// This package is the format and nothing else: it imports no other
// package of this module, so that a program that reads or writes memtrace
// links neither the allocator nor the importers. Around it:
//
//   - trace/replay drives an allocator from a trace and measures it;
//   - trace/viz draws a replay as a timeline and a segment map;
//   - trace/record writes what a running allocator does as memtrace, and
//     a pprof profile of live device memory by Go call site;
//   - trace/pytorch reads and writes PyTorch memory snapshots, and records
//     an allocator's history the way PyTorch does;
//   - trace/rmm reads RMM's logging_resource_adaptor CSV;
//   - trace/convert detects the format of any of these and converts it to
//     memtrace.
//
// # Memory and concurrency
//
// Reader, Writer and Validator use memory bounded by a line, a buffer and
// the live blocks respectively (the Validator keeps a table of one byte
// per ID below 2^22 too, up to the largest seen). An Import holds the whole converted trace
// (about 64 bytes an op) because blocks from before the window can only be
// known at its end. None of these types is safe for concurrent use: use
// one per goroutine.
package trace
