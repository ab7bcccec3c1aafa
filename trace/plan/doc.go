// Package plan answers the questions people bring a trace to: what is the
// smallest device it runs on (Fit), how much memory it needs at a bigger
// batch (Model), and which allocator configuration serves it best (Tune).
// Each answer comes from replays of the trace through the caching
// allocator on the simulated device, which make PyTorch's decisions
// exactly, rather than from a formula on the peak.
//
// # Replays
//
// Replay runs a trace, held in memory as []trace.Op, on a fresh simulated
// device with a given configuration and capacity, and keeps the first
// out-of-memory error beside replay.Run's figures (Outcome). Machine is the
// same with the device and allocator exposed, for callers that attach
// observers. PeakRequested scans a trace for the most bytes it holds at
// once: no device smaller than that can run it, whatever the allocator
// does.
//
// # Fit: the smallest device
//
// Under memory pressure the caching allocator releases its cache and
// retries, so a trace often runs on a device well below the peak it
// reserves on a big one. Fit finds the smallest capacity, a multiple of
// Step (2 MiB), with no out-of-memory error: it gallops up from 1.5 times
// the peak requested to a capacity that runs, bisects down to two
// capacities one Step apart, the lower failing and the upper running, and
// has replayed both. A caching allocator is not monotone in the capacity
// (more memory changes what is cached, what a retry releases and where
// later blocks land), so Fit also replays a ladder of capacities on each
// side of the answer; what it finds moves the answer down or is reported
// (FitResult.NonMonotone, SafeCapacity), never hidden. Each replay is a
// Trial.
//
// # Model: probe small, predict big
//
// A program run at two batch sizes gives two traces with the same
// operations in the same order, whose allocation sizes differ. NewModel
// aligns such probes op by op (kinds, streams, tags and which block each
// free names must agree; block IDs need not) and models each allocation's
// size as p + q × batch bytes, with p and q whole numbers; every probe
// beyond two must fit the model exactly. The first op that does not align
// or fit is an *AlignError naming it. Model.Ops synthesizes the trace at
// any batch, Model.Predict replays it, and Model.MaxBatch finds the
// largest batch that runs on a device, bounding the search by the peak
// requested bytes (which the model computes without a replay) and
// bisecting over replays below that bound. Scaling the peak by hand is not
// enough: which phase holds the peak changes with the batch, and only a
// replay of the scaled trace sees where.
//
// # Tune: the configuration to use
//
// Tune evaluates candidate configurations (Sweep by default: PyTorch's
// default, expandable_segments alone, and combinations of
// expandable_segments, max_split_size_mb, roundup_power2_divisions and
// garbage_collection_threshold) in parallel, each on its own simulated
// device, with golang.org/x/sync/errgroup bounding the goroutines to the
// number of cores. For each it runs Fit and one replay on the device of
// interest, and ranks them: the smallest capacity that runs first, then
// peak reserved bytes, then device calls, then the candidate order, so
// that the best is never worse than the default or expandable_segments
// alone; a configuration that runs out of memory on the device of
// interest ranks below every one that does not. PyTorchSetting turns a configuration into what PyTorch takes:
// the PYTORCH_CUDA_ALLOC_CONF value and a memory fraction, which PyTorch
// sets with a call rather than a key.
//
// How far each answer is from the best any allocator could do is the
// subpackage offline's question: the peak of live bytes, and a packing
// that knows every lifetime in advance.
//
// The package prints nothing; cmd/gpumem's fit, scale and tune commands
// are its front end.
package plan
