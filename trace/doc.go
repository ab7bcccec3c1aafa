// Package trace reads, writes and converts allocation traces: the record of
// what a program asked of a GPU allocator, which can be replayed against
// any allocator to study its time, peaks and fragmentation.
//
// # The memtrace format
//
// memtrace v1 is plain text, one operation a line, fields separated by
// single spaces:
//
//	a ID BYTES [STREAM]   allocate BYTES on STREAM (default 0), call the block ID
//	f ID                  free the block called ID
//	r ID STREAM           the block called ID is used on STREAM too (record-stream)
//	s STREAM              work queued on STREAM so far has finished
//	S                     the whole device is synchronized
//	c                     empty the cache
//	t [TAG]               allocations that follow belong to TAG; t alone clears it
//
// Lines starting with "#" are comments; the first says where the trace came
// from ("# memtrace v1 source=..."). Blank lines are skipped, and a line may
// end in "\r\n". Files may be gzip-compressed. Numbers are decimal uint64
// without sign or leading zeros; a TAG is one field of printable UTF-8.
//
// In Go an operation is an Op: a Kind (whose value is the line's letter:
// Alloc is 'a') and the fields the kind uses. Op.String is the line.
//
// # Reading and writing
//
// Reader streams a trace: Next returns one Op at a time, so a trace of tens
// of millions of lines is read in the memory of one line. It parses each
// line in place in its buffer and does not allocate per line (only the
// first use of each tag costs a string). It never guesses: a
// missing or extra field, a bad or overflowing integer, an unknown letter,
// two spaces, a tab or a trailing space is a *SyntaxError that names the
// line number and the line, and ends the reading. Reader detects gzip by
// its magic bytes. The leading comment block is available as Header.
//
// Writer writes ops, plain (NewWriter) or gzip (NewGzipWriter, or Create
// with a ".gz" name), after a header comment block that starts with
// "# memtrace v1". An op that cannot be written and read back unchanged
// (see Op.Check) is refused.
//
// The reader checks each line alone. The rules that need state, that an f
// or r names a live ID and that an a does not reuse one, belong to whoever
// consumes the ops; Validator tracks the live IDs and reports a broken rule
// as a *StateError with the line number. It also carries the one exception
// the format makes: after an allocation that failed with out of memory in
// a replay (MarkFailed), the later f of that ID is to be skipped.
//
// # Importers
//
// Other tools' logs become the same ops:
//
//   - ReadSnapshot reads a PyTorch memory snapshot, the pickle that
//     torch.cuda.memory._dump_snapshot writes. Pickles can run code when
//     Python loads them; this one is decoded by a scan that admits only the
//     opcodes of plain data (dicts, lists, tuples, strings, numbers) and
//     checks every length before gopickle decodes it, so no class is ever
//     named or built. The device trace's alloc entries become a and its
//     free_completed entries f.
//   - ReadRMMLog reads the CSV log of RMM's logging_resource_adaptor:
//     allocate rows become a, free rows f.
//
// Both kinds of log cover a window of the run, not all of it: the
// snapshot's trace is a ring buffer of the latest entries, and an RMM log
// starts when the adaptor is installed. Blocks allocated before the window
// are therefore allocated up front, in increasing address order, before
// the window's ops, with IDs 0, 1, 2, ...: those the window frees without
// having allocated them, and, for a snapshot, those that the final
// segments list shows active but the window never allocated. The window's
// own allocations take the following IDs in order. Blocks still alive when
// the window ends are freed after it, in increasing ID order, so an
// imported trace is self-consistent and ends with nothing live. Small
// stream numbers replace the logs' cudaStream_t handles: 0 stays 0, others
// count 1, 2, 3 in order of first appearance. ReadSnapshot and ReadRMMLog
// say the details (what free_requested without free_completed means, which
// entries are ignored, which contradictions are errors).
//
// Convert detects the format of its input (a pickle starts with byte 0x80,
// an RMM log with its CSV header row, anything else is read as memtrace),
// runs the importer, checks the result with a Validator and writes memtrace
// whose header says where it came from, how it was converted, and a line
// of figures (ops, allocations, peak live bytes, streams).
//
// # Replay
//
// Replay drives a Target (the caching allocator, or the pass-through
// baseline) from any OpReader (a Reader, or SliceReader of ops in memory)
// on a device, following the format's rules: an allocation that fails for
// lack of memory is counted and the replay goes on, skipping the later f
// or r of its ID; trace stream 0 is the default stream and every other
// stream number gets a device stream of its own, held busy on the
// simulated device so that its work completes only at an s or S line. Ops
// are parsed in batches and only the replay of a batch is timed, so the
// Result's ns per op excludes parsing. The Result carries the peaks,
// device calls, fragmentation (peak reserved / peak requested) and every
// memory_stats key. Record does the same and samples memory for a
// Picture, which WriteSVG draws as a timeline and a segment map.
//
// # Recording
//
// Recorder is an allocator.Observer that writes what an allocator serves
// as memtrace, so that a real program's allocations can be replayed
// later; with RecordStacks it keeps the Go call stack of each live
// allocation and WriteProfile turns them into a pprof profile of live
// device memory by call site. History records the same events as PyTorch's
// memory history (a ring buffer of alloc, free and segment entries) and
// WriteSnapshot writes them, with the allocator's segments, as a
// PyTorch-format snapshot pickle that PyTorch's memory visualizer opens.
//
// # Memory and concurrency
//
// Reader, Writer and Validator use memory bounded by a line, a buffer and
// the live blocks respectively. Importers hold the whole converted trace
// (about 48 bytes an op) because blocks from before the window can only be
// known at its end. Recorder is safe for concurrent use; the other types
// are not: use one per goroutine.
package trace
