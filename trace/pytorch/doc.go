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
// A pickle is a program for a small stack machine that can name and call
// Python code. The loader here runs nothing: it first walks the opcodes
// of the whole input and admits only those that build plain data (None,
// bools, numbers, strings, bytes, lists, tuples, dicts, sets, the memo and
// framing), checking every length against the bytes that remain, and only
// then lets gopickle decode it. Whatever passes decodes to plain Go values
// in a few times the input's size.
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
