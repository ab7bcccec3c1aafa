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
//		if errors.As(err, &oom) { ... }           // what was asked, what is free, where it went
//	}
//	_ = a.Free(p)                                      // cached: the next Alloc reuses it
//	st := a.Stats()
//	fmt.Println(st.Allocated(), st.MaxAllocated())     // memory_allocated, max_memory_allocated
//	fmt.Println(st.Get("reserved_bytes.all.peak"))    // any of PyTorch's memory_stats keys
//	fmt.Print(a.Summary(false))                        // PyTorch's memory_summary table
//
// Name the phases of a training loop (a.SetPhase("forward")) and mark its
// steps (a.MarkStep("step 12")): memory is then counted by phase, an
// out-of-memory error says in which phase it failed and which phases hold
// the memory, and a.Leaks lists the allocations whose number grows at
// every step.
//
// # Packages
//
// Imports point down this list and never up; importing any of them
// registers nothing and starts nothing.
//
//   - device: the Device interface every backend implements, its optional
//     capabilities (virtual memory, pinned host memory, stream checks,
//     usage reports, stream waits), Ptr/Stream/Event and errors.
//   - device/sim: the simulated device: capacity, a deterministic address
//     rule, streams whose work a test controls, a cost clock, virtual
//     memory.
//   - device/cuda: the CUDA backend on gorgonia.org/cu (build tag cuda).
//   - device/counting, device/faulty: adaptors around any device, counting
//     its calls or failing the Nth call of any kind.
//   - allocator: the caching allocator, its configuration (ParseConf reads
//     PYTORCH_CUDA_ALLOC_CONF syntax), out-of-memory errors, phases and
//     leaks, snapshots, a multi-device Manager and a pass-through baseline;
//     allocator/host caches pinned host memory as PyTorch's host allocator
//     does; allocator/memlog logs memory every few steps (log/slog).
//   - stats: the statistics, PyTorch's memory_stats key space and its
//     memory_summary table; stats/expvarstats and stats/promstats publish
//     them to expvar and Prometheus.
//   - gpumemtest: helpers for users' tests: a simulated-device fixture,
//     VerifyNoLeaks, budgets.
//   - trace: memtrace, the trace format alone (ops, reader, writer,
//     validator; specified in trace/FORMAT.md), importing nothing else of
//     gpumem. Around it: trace/replay drives an allocator from a trace and
//     measures it, trace/viz draws a replay, trace/record records an
//     allocator as memtrace (and a pprof profile of live memory by call
//     site), trace/pytorch reads and writes PyTorch memory snapshots,
//     trace/rmm reads RMM logs, trace/convert converts any of them to
//     memtrace, and trace/plan answers fit, scale and tune from a trace.
//   - estimate: will a model fit on a card, by count and by simulation,
//     with the remedies when it does not.
//   - cmd/gpumem: the command line: demo, replay, compare, convert, viz,
//     estimate, fit, scale, tune.
package gpumem
