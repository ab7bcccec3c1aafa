// Package replay drives an allocator from a memtrace and measures what it
// did: time per operation, peaks, device calls, fragmentation and every
// memory_stats key.
//
// # The model
//
// A replay reads the ops of a trace (any trace.OpReader) in order and
// applies each to a Target, the allocator under study, whose memory comes
// from a device:
//
//	a ID BYTES STREAM   Target.Alloc on the stream's device stream; the block is called ID
//	f ID                Target.Free of the block called ID
//	r ID STREAM         Target.RecordStream of that block on the stream's device stream
//	s STREAM            device.SynchronizeStream of the stream's device stream
//	S                   device.Synchronize
//	c                   Target.EmptyCache
//	t TAG               nothing: tags are for whoever reads the trace
//	m NAME              a step boundary: Options.Mark, if set, is called with NAME
//
// The rules are memtrace's (trace/FORMAT.md in this module). Each op is
// first checked by a trace.Validator, so an f or r of an ID that is not
// live, or an a that reuses one, stops the replay with an error naming the
// line. An allocation that fails for lack of memory (an error matching
// device.ErrOutOfMemory) is counted in Result.OOMs and the replay goes on;
// the later f or r of that ID is skipped. Any other error stops the replay
// and names the line.
//
// Streams: trace stream 0 is the device's default stream. The first time
// another stream number appears, Run creates a device stream for it. The
// format says that work queued on such a stream is still running until an
// s line for it or an S line, so that an event recorded there (for a block
// freed after an r line) completes only then: a device that can hold a
// stream's work says so by implementing StreamHolder (the simulated device
// does), and Run holds each stream it creates busy. On other devices
// streams run as they run.
//
// # Timing
//
// Ops are read and validated in batches (Options.Batch, 1024 by default),
// and only the application of a batch is timed, so Result.NsPerOp is the
// allocator's time and the replay's bookkeeping, not parsing.
// Options.Progress is called after each batch. The device's own cost clock, where
// there is one, belongs to the device: the caller that made the device
// reads it around Run and fills Result.DeviceSeconds.
//
// # Peaks and stopping early
//
// With Options.Peak, Run also finds where allocated bytes (the sum of the
// blocks handed out, allocated_bytes.all.current, whose highest value is
// allocated_bytes.all.peak and torch.cuda.max_memory_allocated) first
// reached their highest value: Result.PeakOp ops into the trace, at line
// Result.PeakLine. Options.StopAfter ends a replay after that many ops. A
// replay on the simulated device is deterministic, so replaying the trace
// again on a new, equal allocator with StopAfter = PeakOp leaves it in its
// state at the peak, for a snapshot (trace/pytorch) or a picture: the
// state at the peak costs two replays, and nothing is copied on the way.
//
// # What it holds
//
// Run, its Options and Result; Target, what Run drives (the caching
// allocator and the pass-through baseline both implement it); and
// StreamHolder, the device capability behind the stream rule. The package
// imports trace, device and stats, not the allocator. Pictures of a replay
// are in trace/viz.
package replay
