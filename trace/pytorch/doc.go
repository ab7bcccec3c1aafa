// Package pytorch reads and writes PyTorch's memory snapshots, and records
// an allocator's history the way PyTorch does.
//
// # PyTorch snapshots
//
// torch.cuda.memory._record_memory_history makes PyTorch's caching
// allocator keep a ring buffer of its latest actions (alloc,
// free_requested, free_completed, segment_alloc, segment_free, ...), each
// with address, size, stream and time; torch.cuda.memory._dump_snapshot
// then writes a pickle of a dict: "segments" (the allocator's segments
// now, with their blocks and states), "device_traces" (the ring buffer,
// one list per device) and "allocator_settings". PyTorch's memory
// visualizer (https://pytorch.org/memory_viz) draws these files.
//
// # Reading
//
// ReadSnapshot turns a snapshot into memtrace ops (a trace.Import): the
// device trace's alloc entries become a lines and its free_completed
// entries f lines, and since the ring buffer is a window of the run, the
// blocks that were alive before it are allocated up front (from the frees
// of blocks the window never allocated, and from the active blocks of the
// final segments), and the blocks alive at its end are freed after it.
//
// It reads the snapshots of PyTorch 2.6 and of today's PyTorch alike:
//
//   - any pickle protocol from 2 to 5, as Python's pickle module writes it
//     (torch.cuda.memory._dump_snapshot uses Python's default protocol,
//     5 from Python 3.14) or as the C++ torch::cuda::_memory_snapshot_pickled
//     does (protocol 2): protocol 5's bytearrays (BYTEARRAY8) and in-band
//     read-only buffers (READONLY_BUFFER) decode, and frames are checked
//     (each begins where the one before it ends, and no length may pass
//     the size limit); an out-of-band buffer (NEXT_BUFFER, written only
//     with a buffer_callback) is refused, since a file does not carry it;
//   - keys it does not use are ignored, those added since 2.6 included:
//     segment_pool_id, is_expandable, allocated_size and active_size in
//     segments; compile_context, user_metadata and frames in trace entries;
//     external_annotations; allocator_settings whatever its keys (its repr
//     goes into the notes, graph_capture_record_stream_reuse and all);
//   - the actions that make no op (segment_alloc, segment_free,
//     segment_map, segment_unmap, snapshot, oom, whose entry carries
//     device_free in place of addr) are counted in trace.Import.Ignored;
//     an action it does not know is counted there too, and named in a
//     note that begins "warning:";
//   - a snapshot taken without memory history has segments and blocks but
//     no trace: device_traces holds empty lists, or is missing (a dict
//     without it), or the pickle holds torch.cuda.memory_snapshot()'s
//     list of segments alone. Its import is the state at the snapshot: the
//     active blocks, allocated in address order and then freed, so that a
//     replay of it shows what the snapshot held (allocated bytes; the
//     reserved bytes are the replaying allocator's own) but nothing of the
//     run that led there; the first note says so, and gives the segments'
//     count and reserved bytes as the snapshot recorded them. A snapshot
//     with neither a trace nor segments of the device is an error that
//     names both.
//
// A pickle is a program for a small stack machine that can name and call
// Python code. The reader here runs nothing: it is a stack machine of its
// own that knows only the opcodes that build plain data (None, bools,
// numbers, strings, bytes, lists, tuples, dicts, sets, the memo and
// framing), refuses every other opcode when it meets it, and builds the
// plain Go values of gopickle's types package. It reads the pickle as a
// stream, gzip or not, up to its STOP opcode, and never holds the input
// whole.
//
// # Limits
//
// Any input, however made, is read in bounded time and memory; past a
// limit, ReadSnapshot fails with an error that names it:
//
//   - the pickle, after decompression, is at most SnapshotOptions.MaxSize
//     bytes (DefaultMaxPickleSize, 1 GiB); a length field is checked
//     against it before anything is read, and long data is read as it
//     arrives, so that a length cannot make the reader allocate what the
//     input does not hold;
//   - the values decoded take at most SnapshotOptions.MaxMemory bytes
//     (DefaultMaxPickleMemory, 1 GiB), counted as they are allocated,
//     garbage included; a snapshot's values take about 5 to 10 times its
//     pickle's size, so the default admits snapshots of about 100 MiB;
//   - the import spends the rest of the same budget: before it builds
//     anything it counts what each entry of the device trace and each
//     block of the segments may become (about 360 and 200 bytes), so
//     that a pickle that names one dict millions of times through the
//     memo, at two bytes a name, is refused instead of expanded;
//   - the repr of allocator_settings, kept in the notes, is at most about
//     4 KiB, however its lists nest or hold themselves;
//   - at most 64 marks are open at once (Python's pickler opens one per
//     level of nesting), and at most 2^20 values wait on the stack outside
//     any container (Python's pickler puts 1,000 there per level);
//   - an integer written as text (INT, LONG) has at most 4,300 digits,
//     Python's own limit for int strings, since converting it costs the
//     square of its length; a binary one (LONG1, LONG4) at most 2 KiB;
//   - a protocol-0 string line (STRING, UNICODE) is at most 1 MiB.
//
// So decoding and importing together allocate at most about MaxMemory
// plus 50 MiB (the stack and buffers), whatever the input, and read at
// most MaxSize bytes.
// Error messages quote at most 100 bytes of the input (trace.Quote).
//
// # Recording and writing
//
// History is an allocator.Observer that keeps the same ring buffer as
// PyTorch's memory history, with PyTorch's action names. WriteSnapshot
// writes it, with the allocator's current segments and configuration, as a
// snapshot pickle that PyTorch's memory visualizer, Python's pickle module
// and ReadSnapshot all open: protocol 4, framed and memoized as Python's
// pickle.dump writes it, so that the keys, action names, states and the
// names of files and functions repeated over thousands of entries are
// written once and cost two to five bytes each after that.
//
// With HistoryOptions.Stacks, History captures the Go call stack of each
// entry (runtime.Callers, in the goroutine that called the allocator) and
// keeps that of each live block and segment; the snapshot gives them as
// the frames the visualizer shows for an allocation, a block or a segment,
// innermost first, starting at the caller's code: the frames of this
// library (the observer, the allocator, a replay loop) that lead to it are
// left out. Each entry also carries the phase it belongs to
// (allocator.SetPhase): as the entry's user_metadata, and as its category,
// by which the visualizer's Active Memory Timeline colors allocations.
//
// A snapshot is the state when it is written. To see the state at the
// peak of a trace's replay, replay it twice (trace/replay): once with
// replay.Options.Peak to learn after how many ops allocated memory peaked
// (Result.PeakOp), then, on a fresh allocator with a History attached,
// with replay.Options.StopAfter set to that count, and write the snapshot
// then. The simulated device is deterministic, so the second replay
// reaches the same state, and the snapshot's allocated blocks add up to
// exactly the replay's peak allocated bytes.
package pytorch
