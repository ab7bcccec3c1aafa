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
// snapshot pickle (protocol 2, plain data only) that PyTorch's memory
// visualizer, Python's pickle module and ReadSnapshot all open. Stack
// frames are not recorded: the frame lists are empty.
package pytorch
