// Package offline answers how little memory a trace could run in: the
// best any allocator could do if it knew, at every allocation, when each
// block will be freed. It gives two figures for a trace, one below and one
// above that best:
//
//   - Bound, the lower bound: the peak of the bytes live at once, each
//     block's size rounded up to a multiple of Granule (512 bytes, the
//     caching allocator's rounding; a size of 0 takes no memory). No
//     allocator that rounds as the caching allocator does can serve the
//     trace in less.
//   - A packing: an address (an offset from 0) for every block, such that
//     no two blocks live at the same time share a byte. Its footprint, the
//     highest end of any block, is memory that provably suffices. Planners
//     for static graphs (TensorFlow Lite's arena planner, XLA's heap
//     simulator) assign offsets this way.
//
// The best possible lies between the two; on real traces they are within a
// fraction of a percent of each other (POLICY.md has the figures).
//
// # Lifetimes
//
// Lifetimes turns a trace into blocks, one per allocation (a line), each
// with the interval of op indices [Start, End) during which its memory is
// in use. Start is its a line. End is its f line, except:
//
//   - a block used on other streams (r lines naming a stream other than 0
//     and other than its own) stays in use after its f until work on each
//     of those streams has finished: the first point after the f where
//     every one of them has been synchronized (an s line for it, or an S
//     line), as the format's replay rule says. Work on stream 0, and on the
//     block's own stream, is ordered with the free and ends there;
//   - a block never freed lives to the end of the trace (End = len(ops)).
//
// Empty-cache (c), tag (t) and mark (m) lines change no lifetime: they
// concern an allocator's cache and the trace's reader, not what memory is
// in use. Streams share one address space: a plan that gives two streams
// the same memory at different times relies on the program ordering them
// there, as a static planner's schedule does.
//
// A trace that breaks the format's rules (an a line for a live ID, an f or
// r line for an ID that is not live) is an error naming the op.
//
// # Packing
//
// Pack assigns offsets greedily: blocks in decreasing order of size, then
// of lifetime length, each at the lowest gap between blocks already
// placed that overlap it in time that holds it, or else above them all
// ("greedy by size", Pisarchyk and Lee, 2020, with a first fit where
// theirs takes the smallest such gap: on every trace of the project the
// best of the passes below packs as tight by first fit as by best fit,
// or tighter, and a first fit stops its search sooner).
// The blocks that overlap a block in time are found through an
// index of time buckets, each holding the placed blocks that touch it in
// address order, so a trace of 10^5 allocations packs in seconds rather
// than in the n^2 steps of a scan over every placed block; where most
// blocks are in use at once, as in the BERT, cs336 and random_mixed_2000
// traces, that scan reads less than the index, and internal/pack's
// Greedy takes it (both place every block alike). Through the index a
// pass costs about the number of pairs of blocks in use at the same
// time: 10^5 allocations with some 2,000 live at once (random_mixed) take
// about 3 s of CPU; a trace that holds tens of thousands of blocks at
// once is quadratic again (30,000 never freed: 3.4 s).
//
// Unless that pass meets the bound, which no packing can beat, Pack runs
// three other orders in parallel and keeps the smallest footprint: sizes
// grouped in classes (powers of 4, each class by start; powers of 2, each
// by lifetime) and lifetime first. The classes pack traces whose sizes
// and lifetimes are random much tighter (random_mixed: 1.024 times the
// bound against 1.030 by size alone; by best fit, 1.034 and 1.068).
//
// The packing is contiguous: one address range per block. An allocator
// that maps pages of virtual memory (expandable segments) is bound by
// physical pages, not by addresses, and can run a trace in less than the
// packing's footprint, though never in less than the bound.
//
// # Checking
//
// Check proves a packing valid: it sweeps the blocks in time, keeps the
// live ones in address order (a B-tree) and verifies that each block, when
// it starts, ends at or below its successor's offset and starts at or
// above its predecessor's end. Two blocks overlap in time when each starts
// before the other ends (intervals are half open: a block freed at op i
// and one allocated at op j > i may share memory), and in address when
// each starts below the other's end. Plan.Check also verifies the
// footprint and that the bound is no more than it.
//
// The greedy passes are internal/pack's, which the allocator's planned
// policy shares. The package prints nothing; of gpumem it imports only the
// trace format and internal/pack.
package offline
