// Command libgpumem is gpumem as a C library: built with
//
//	go build -buildmode=c-shared -tags cuda -o libgpumem.so ./cmd/libgpumem
//
// it gives libgpumem.so and its header libgpumem.h, which go together (the
// header beside the library). A C or C++ program, or PyTorch through
// torch.cuda.memory.CUDAPluggableAllocator, then allocates device memory
// through gpumem's caching allocator.
//
// # The C API
//
//	void  *gpumem_malloc(ssize_t size, int device, cudaStream_t stream);
//	void   gpumem_free(void *ptr, ssize_t size, int device, cudaStream_t stream);
//	int    gpumem_empty_cache(int device);
//	int    gpumem_record_stream(void *ptr, int device, cudaStream_t stream);
//	size_t gpumem_memory_stats_json(int device, char *buf, size_t cap);
//	size_t gpumem_memory_summary(int device, int abbreviated, char *buf, size_t cap);
//	int    gpumem_mark_step(int device, char *name);
//	size_t gpumem_plan_stats_json(int device, char *buf, size_t cap);
//	size_t gpumem_last_error(char *buf, size_t cap);
//
// gpumem_malloc and gpumem_free have exactly the signatures PyTorch's
// pluggable allocator loads. Streams are cudaStream_t (the same pointers as
// the driver's CUstream); 0 is the legacy default stream.
//
// # Semantics
//
//   - One caching allocator per device, made on the device's first use on
//     its primary context (the one the CUDA runtime and PyTorch use), with
//     the configuration read once when the library loads, from
//     GPUMEM_ALLOC_CONF, else PYTORCH_ALLOC_CONF, else
//     PYTORCH_CUDA_ALLOC_CONF (PyTorch's syntax;
//     gpumem's own keys too, such as gpumem_policy:low_fragmentation). A
//     bad configuration makes every call fail with an error that names the
//     variable. With backend:cudaMallocAsync the allocator of each device
//     is the driver's stream-ordered pool (allocator.Async: the device's
//     default memory pool) instead of the caching allocator.
//   - Streams are adopted on first sight and never destroyed.
//   - gpumem_free on a stream other than the allocation's records the
//     block on that stream first, so the block is reused only after the
//     work queued there has finished; the size argument is not used.
//   - An error (out of memory, a pointer gpumem did not give, a stream the
//     driver does not know) makes gpumem_malloc return NULL and the int
//     functions -1, and sets the calling thread's last error text;
//     gpumem_free has no way to say it failed but the last error. Size 0
//     returns NULL without an error, as PyTorch's allocator does. A Go panic
//     never crosses into C: it is recovered and becomes an error.
//   - The size_t functions work as snprintf: they write at most cap bytes,
//     the NUL included, and return the length of the whole text without its
//     NUL (0, with the last error set, when the device cannot be used;
//     gpumem_last_error returns 0 when the thread has no error).
//   - Every function may be called from any number of threads.
//
// The statistics are one JSON object with PyTorch's memory_stats names
// ("allocated_bytes.all.current", "reserved_bytes.all.current", ...); the
// summary is PyTorch's memory_summary table.
//
// gpumem_mark_step marks where a step starts (a training step, a
// request; the name NULL is ""): under gpumem_policy:planned, the steps
// that are planned once one repeats the one before it, or fits the
// largest sizes of the steps before it (a program that marks none has
// its steps found by the policy). gpumem_plan_stats_json
// gives the planned policy's figures as one JSON object ("plans",
// "served", "skips", "departures", "spared", "reused", "arena_bytes",
// "following", "found_period"), or null under any other policy.
//
// Without the cuda build tag this command builds as an empty program: the
// library needs the CUDA backend.
package main

func main() {}
