// Package gpumem is a caching GPU memory allocator for Go, faithful to
// PyTorch's CUDA caching allocator.
//
// Allocating device memory with cudaMalloc and releasing it with cudaFree
// costs tens to hundreds of microseconds per call, and cudaFree
// synchronizes the device. A training loop that creates and drops
// thousands of tensors per step cannot afford that. gpumem keeps the
// memory it obtains, splits it into blocks, merges freed neighbours and
// hands blocks out again, exactly as PyTorch's allocator does: with the
// default configuration the same requests give the same device
// allocations, the same segments and the same statistics as PyTorch 2.6.
//
// It runs on a CUDA device (package device/cuda, build tag cuda) and on a
// simulated device (package device/sim) so that tests, benchmarks and
// fragmentation studies run on any machine.
//
// # Quick start
//
//	dev, _ := sim.New(sim.Config{Capacity: 80 << 30}) // or cuda.Open(0) with -tags cuda
//	a, _ := allocator.New(dev, allocator.Config{})   // PyTorch's defaults
//	p, err := a.Alloc(64<<20, device.DefaultStream)  // 64 MiB
//	if err != nil {
//		var oom *allocator.OutOfMemoryError
//		if errors.As(err, &oom) { ... }           // what was asked, what is free, what to try
//	}
//	_ = a.Free(p)                                      // cached: the next Alloc reuses it
//	st := a.Stats()
//	fmt.Println(st.Get("allocated_bytes.all.peak"))   // PyTorch's memory_stats keys
//	fmt.Print(stats.Summary(&st, stats.SummaryOptions{})) // PyTorch's memory_summary table
//
// # Packages
//
//   - device: the Device interface every backend implements, its optional
//     capabilities (virtual memory, pinned host memory) and errors.
//   - device/sim: the simulated device: capacity, a deterministic address
//     rule, streams whose work a test controls, a cost clock, fault
//     injection.
//   - device/cuda: the CUDA backend on gorgonia.org/cu (build tag cuda).
//   - allocator: the caching allocator, its configuration (ParseConf reads
//     PYTORCH_CUDA_ALLOC_CONF syntax), out-of-memory errors, snapshots, a
//     multi-device Manager and a pass-through baseline; allocator/host
//     caches pinned host memory as PyTorch's host allocator does.
//   - stats: the statistics, PyTorch's memory_stats key space and its
//     memory_summary table, expvar export.
//   - trace: memtrace, the trace format alone (ops, reader, writer,
//     validator; specified in trace/FORMAT.md), importing nothing else of
//     gpumem. Around it: trace/replay drives an allocator from a trace and
//     measures it, trace/viz draws a replay, trace/record records an
//     allocator as memtrace (and a pprof profile of live memory by call
//     site), trace/pytorch reads and writes PyTorch memory snapshots,
//     trace/rmm reads RMM logs, trace/convert converts any of them to
//     memtrace, and trace/plan answers from a trace: the smallest device
//     it runs on, its memory at a bigger batch, the best configuration.
//   - estimate: will a transformer train on a card, by count and by
//     simulation.
//   - cmd/gpumem: the command line: demo, replay, compare, convert,
//     estimate, viz, fit, scale, tune.
package gpumem
