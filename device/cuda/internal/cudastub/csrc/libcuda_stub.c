// libcuda_stub.c: a STUB of the CUDA driver library for tests. It is not a
// driver and drives no GPU. It fakes the driver functions that gpumem's CUDA
// backend calls, so that the backend's Go glue can be tested on machines
// without a GPU. scripts/ci-cuda.sh builds it with gcc as a shared library
// whose soname is libcuda.so.1 and puts it first on LD_LIBRARY_PATH, so it is
// loaded in place of the real libcuda.so.1.
//
// What it fakes:
//   - cuInit (fails with the code in $CUDASTUB_INIT_ERROR when set), device
//     count, name, total memory, attributes; primary contexts, contexts a
//     caller creates (cuCtxCreate pushes one, cuCtxDestroy ends it), the
//     device of the current context, a per-thread context stack
//     (push/pop/set), and a check that a live context is current on the
//     calling thread in every call that needs one;
//   - cuMemAlloc/cuMemFree/cuMemGetInfo on a fake address space with a
//     capacity (no device or host memory is used; addresses are never
//     dereferenced);
//   - streams and events as tables of handles (unknown handles give
//     CUDA_ERROR_INVALID_HANDLE; the NULL stream, CU_STREAM_LEGACY and
//     CU_STREAM_PER_THREAD are always valid and never destroyed); events
//     complete at once unless held;
//     cuStreamWaitEvent notes a wait on a held event, and synchronizing
//     the waiting stream completes the awaited stream's events too;
//   - the virtual memory calls (reserve, create, map, set access, unmap,
//     release, free) with a 2 MiB granularity, sharing the capacity;
//   - cuMemHostAlloc/cuMemFreeHost on real host memory (callers touch it);
//   - cuMemcpyDtoH/cuMemcpyHtoD on device memory the stub handed out
//     (cuMemAlloc, mapped pages, pool blocks): it keeps each write's bytes,
//     reads see the latest writes and zeros elsewhere, and a free or unmap
//     drops the bytes written in its range (a write that overlaps the
//     range in part keeps its bytes outside it);
//   - the device's default memory pool (cuDeviceGetDefaultMemPool,
//     cuMemAllocFromPoolAsync, cuMemFreeAsync, cuMemPoolTrimTo and the
//     release threshold, reserved and used attributes) as counts: the
//     pool reserves in 2 MiB steps from the capacity, a synchronization
//     releases what is above the threshold and not used, and it is
//     reported only while memory pools are supported
//     (CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED; cudastub_set_pools).
//
// Control functions (prefix cudastub_) let tests reset the stub, set the
// capacity and device count, inject error codes into the next calls of a
// function, hold events, invalidate every thread's current context, and read
// call counters. Tests find them with dlsym, so the real driver is never
// required to have them.
//
// All state is guarded by one mutex; the context stack is thread-local.

#define _GNU_SOURCE
#include <cuda.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <stdio.h>

#define MAXDEV 8
#define MAXINJ 32
#define MAXCALLS 128
#define MAXTHREADS 4096
#define GRANULARITY (2ull << 20)

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

// ---- small growable tables ----

typedef struct {
	uint64_t key, size, aux;
} entry;

typedef struct {
	entry *v;
	int n, cap;
} table;

static int tfind(table *t, uint64_t key) {
	for (int i = 0; i < t->n; i++)
		if (t->v[i].key == key) return i;
	return -1;
}

static void tadd(table *t, uint64_t key, uint64_t size, uint64_t aux) {
	if (t->n == t->cap) {
		t->cap = t->cap ? 2 * t->cap : 64;
		t->v = realloc(t->v, sizeof(entry) * t->cap);
		if (!t->v) abort();
	}
	t->v[t->n++] = (entry){key, size, aux};
}

static void tdel(table *t, int i) { t->v[i] = t->v[--t->n]; }

// ---- state ----

struct stub_ctx {
	int dev;
	int refs;
};

static struct stub_ctx contexts[MAXDEV];
// created holds the contexts of cuCtxCreate; refs 1 while alive.
#define MAXCREATED 64
static struct stub_ctx created[MAXCREATED];
static int ndevices = 1;
static uint64_t capacity = 8ull << 30;
static uint64_t used;
static int initialized;
static int vmm_supported = 1;
static int pools_supported = 1;
static int hold_events;
static unsigned generation = 1;
static uint64_t next_addr = 0x7f0000000000ull;
static uint64_t next_va = 0x600000000000ull;
static uint64_t next_handle = 1;
static uint64_t next_obj = 1;
static long context_failures;
static long timed_events;

static table mem;          // key addr, size
static table streams;      // key handle
static table events;       // key handle, size = pending, aux = stream
static table hosts;        // key pointer, size
static table reservations; // key base, size
static table handles;      // key handle, size, aux = mapped count
static table mappings;     // key addr, size, aux = handle
static table waits;        // key waiting stream, size = awaited event's stream
static table async_blocks; // key addr, size: live blocks of the default pool
static table writes;       // key addr, size, aux = malloc'd copy of the bytes written

// The default memory pool, as counts.
static int pool_obj;
#define DEFAULT_POOL ((CUmemoryPool)&pool_obj)
static uint64_t pool_used, pool_used_high, pool_reserved, pool_reserved_high, pool_threshold;

struct inj {
	char name[64];
	int skip, count, code;
};
static struct inj inj[MAXINJ];

struct counter {
	char name[64];
	long n;
};
static struct counter calls[MAXCALLS];

static pthread_t threads[MAXTHREADS];
static int nthreads;

struct tls_frame {
	CUcontext ctx;
	unsigned gen;
};
static __thread struct tls_frame stack[16];
static __thread int depth;

// ---- helpers (mu held) ----

static void count_call(const char *name) {
	pthread_t self = pthread_self();
	int i;
	for (i = 0; i < nthreads; i++)
		if (pthread_equal(threads[i], self)) break;
	if (i == nthreads && nthreads < MAXTHREADS) threads[nthreads++] = self;
	for (i = 0; i < MAXCALLS && calls[i].name[0]; i++)
		if (strcmp(calls[i].name, name) == 0) {
			calls[i].n++;
			return;
		}
	if (i < MAXCALLS) {
		snprintf(calls[i].name, sizeof calls[i].name, "%s", name);
		calls[i].n = 1;
	}
}

static int injected(const char *name) {
	for (int i = 0; i < MAXINJ; i++) {
		struct inj *j = &inj[i];
		if (j->count == 0 || strcmp(j->name, name) != 0) continue;
		if (j->skip > 0) {
			j->skip--;
			return 0;
		}
		j->count--;
		return j->code;
	}
	return 0;
}

static int valid_ctx(CUcontext c) {
	for (int i = 0; i < ndevices; i++)
		if (c == (CUcontext)&contexts[i]) return 1;
	for (int i = 0; i < MAXCREATED; i++)
		if (c == (CUcontext)&created[i]) return created[i].refs > 0;
	return 0;
}

// current_ok: the calling thread has a live context current, set since the
// last cudastub_invalidate_contexts.
static int current_ok(void) {
	if (depth == 0) return 0;
	struct tls_frame *f = &stack[depth - 1];
	return f->ctx != NULL && valid_ctx(f->ctx) && f->gen == generation;
}

#define ENTER(name)                                  \
	pthread_mutex_lock(&mu);                         \
	count_call(name);                                \
	{                                                \
		int code_ = injected(name);                  \
		if (code_) {                                 \
			pthread_mutex_unlock(&mu);               \
			return (CUresult)code_;                  \
		}                                            \
	}                                                \
	if (!initialized) {                              \
		pthread_mutex_unlock(&mu);                   \
		return CUDA_ERROR_NOT_INITIALIZED;           \
	}

#define NEED_CTX()                                   \
	if (!current_ok()) {                             \
		context_failures++;                          \
		pthread_mutex_unlock(&mu);                   \
		return CUDA_ERROR_INVALID_CONTEXT;           \
	}

#define RETURN(code)                                 \
	do {                                             \
		pthread_mutex_unlock(&mu);                   \
		return (code);                               \
	} while (0)

// ---- initialization and devices ----

CUresult CUDAAPI cuInit(unsigned int flags) {
	pthread_mutex_lock(&mu);
	count_call("cuInit");
	const char *e = getenv("CUDASTUB_INIT_ERROR");
	if (e && atoi(e) != 0) RETURN((CUresult)atoi(e));
	if (flags != 0) RETURN(CUDA_ERROR_INVALID_VALUE);
	initialized = 1;
	RETURN(CUDA_SUCCESS);
}

CUresult CUDAAPI cuDriverGetVersion(int *v) {
	if (!v) return CUDA_ERROR_INVALID_VALUE;
	*v = 11080;
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceGetCount(int *count) {
	ENTER("cuDeviceGetCount");
	if (!count) RETURN(CUDA_ERROR_INVALID_VALUE);
	*count = ndevices;
	RETURN(CUDA_SUCCESS);
}

CUresult CUDAAPI cuDeviceGet(CUdevice *dev, int ordinal) {
	ENTER("cuDeviceGet");
	if (!dev) RETURN(CUDA_ERROR_INVALID_VALUE);
	if (ordinal < 0 || ordinal >= ndevices) RETURN(CUDA_ERROR_INVALID_DEVICE);
	*dev = ordinal;
	RETURN(CUDA_SUCCESS);
}

CUresult CUDAAPI cuDeviceGetName(char *name, int len, CUdevice dev) {
	ENTER("cuDeviceGetName");
	if (dev < 0 || dev >= ndevices) RETURN(CUDA_ERROR_INVALID_DEVICE);
	if (!name || len <= 0) RETURN(CUDA_ERROR_INVALID_VALUE);
	snprintf(name, (size_t)len, "gpumem stub device %d", dev);
	RETURN(CUDA_SUCCESS);
}

CUresult CUDAAPI cuDeviceTotalMem(size_t *bytes, CUdevice dev) {
	ENTER("cuDeviceTotalMem");
	if (dev < 0 || dev >= ndevices) RETURN(CUDA_ERROR_INVALID_DEVICE);
	if (!bytes) RETURN(CUDA_ERROR_INVALID_VALUE);
	*bytes = capacity;
	RETURN(CUDA_SUCCESS);
}

CUresult CUDAAPI cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib, CUdevice dev) {
	ENTER("cuDeviceGetAttribute");
	if (dev < 0 || dev >= ndevices) RETURN(CUDA_ERROR_INVALID_DEVICE);
	if (!pi) RETURN(CUDA_ERROR_INVALID_VALUE);
	*pi = 0;
	if (attrib == CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED) *pi = vmm_supported;
	if (attrib == CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED) *pi = pools_supported;
	RETURN(CUDA_SUCCESS);
}

// ---- contexts ----

CUresult CUDAAPI cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev) {
	ENTER("cuDevicePrimaryCtxRetain");
	if (dev < 0 || dev >= ndevices) RETURN(CUDA_ERROR_INVALID_DEVICE);
	if (!pctx) RETURN(CUDA_ERROR_INVALID_VALUE);
	contexts[dev].dev = dev;
	contexts[dev].refs++;
	*pctx = (CUcontext)&contexts[dev];
	RETURN(CUDA_SUCCESS);
}

CUresult CUDAAPI cuDevicePrimaryCtxRelease(CUdevice dev) {
	ENTER("cuDevicePrimaryCtxRelease");
	if (dev < 0 || dev >= ndevices) RETURN(CUDA_ERROR_INVALID_DEVICE);
	if (contexts[dev].refs <= 0) RETURN(CUDA_ERROR_INVALID_CONTEXT);
	contexts[dev].refs--;
	RETURN(CUDA_SUCCESS);
}

CUresult CUDAAPI cuCtxCreate(CUcontext *pctx, unsigned int flags, CUdevice dev) {
	ENTER("cuCtxCreate");
	(void)flags;
	if (dev < 0 || dev >= ndevices) RETURN(CUDA_ERROR_INVALID_DEVICE);
	if (!pctx) RETURN(CUDA_ERROR_INVALID_VALUE);
	if (depth == (int)(sizeof stack / sizeof stack[0])) RETURN(CUDA_ERROR_INVALID_VALUE);
	for (int i = 0; i < MAXCREATED; i++)
		if (created[i].refs == 0) {
			created[i] = (struct stub_ctx){dev, 1};
			*pctx = (CUcontext)&created[i];
			stack[depth++] = (struct tls_frame){*pctx, generation};
			RETURN(CUDA_SUCCESS);
		}
	RETURN(CUDA_ERROR_OUT_OF_MEMORY);
}

CUresult CUDAAPI cuCtxDestroy(CUcontext ctx) {
	ENTER("cuCtxDestroy");
	for (int i = 0; i < MAXCREATED; i++)
		if (ctx == (CUcontext)&created[i] && created[i].refs > 0) {
			created[i].refs = 0;
			RETURN(CUDA_SUCCESS);
		}
	RETURN(CUDA_ERROR_INVALID_CONTEXT);
}

CUresult CUDAAPI cuCtxGetDevice(CUdevice *dev) {
	ENTER("cuCtxGetDevice");
	NEED_CTX();
	if (!dev) RETURN(CUDA_ERROR_INVALID_VALUE);
	*dev = ((struct stub_ctx *)stack[depth - 1].ctx)->dev;
	RETURN(CUDA_SUCCESS);
}

CUresult CUDAAPI cuCtxSetCurrent(CUcontext ctx) {
	ENTER("cuCtxSetCurrent");
	if (ctx != NULL && !valid_ctx(ctx)) RETURN(CUDA_ERROR_INVALID_CONTEXT);
	if (ctx == NULL) {
		if (depth > 0) depth--;
		RETURN(CUDA_SUCCESS);
	}
	if (depth == 0) depth = 1;
	stack[depth - 1] = (struct tls_frame){ctx, generation};
	RETURN(CUDA_SUCCESS);
}

CUresult CUDAAPI cuCtxGetCurrent(CUcontext *pctx) {
	ENTER("cuCtxGetCurrent");
	if (!pctx) RETURN(CUDA_ERROR_INVALID_VALUE);
	*pctx = depth ? stack[depth - 1].ctx : NULL;
	RETURN(CUDA_SUCCESS);
}

CUresult CUDAAPI cuCtxPushCurrent(CUcontext ctx) {
	ENTER("cuCtxPushCurrent");
	if (!valid_ctx(ctx)) RETURN(CUDA_ERROR_INVALID_CONTEXT);
	if (depth == (int)(sizeof stack / sizeof stack[0])) RETURN(CUDA_ERROR_INVALID_VALUE);
	stack[depth++] = (struct tls_frame){ctx, generation};
	RETURN(CUDA_SUCCESS);
}

CUresult CUDAAPI cuCtxPopCurrent(CUcontext *pctx) {
	ENTER("cuCtxPopCurrent");
	if (depth == 0) RETURN(CUDA_ERROR_INVALID_CONTEXT);
	depth--;
	if (pctx) *pctx = stack[depth].ctx;
	RETURN(CUDA_SUCCESS);
}

// pool_release_to lowers the pool's reservation to keep, or to what its
// live blocks need (in 2 MiB steps) if that is more.
static void pool_release_to(uint64_t keep) {
	uint64_t need = (pool_used + GRANULARITY - 1) / GRANULARITY * GRANULARITY;
	uint64_t target = keep > need ? keep : need;
	if (pool_reserved > target) {
		used -= pool_reserved - target;
		pool_reserved = target;
	}
}

// pool_synchronized is what a synchronization does to the pool.
static void pool_synchronized(void) {
	if (pool_reserved > pool_threshold) pool_release_to(pool_threshold);
}

// drop_writes forgets the bytes written inside [p, p+size); a write that
// overlaps the range in part keeps its bytes outside it.
static void drop_writes(uint64_t p, uint64_t size) {
	uint64_t q = p + size;
	for (int i = 0; i < writes.n;) {
		uint64_t a = writes.v[i].key, b = a + writes.v[i].size;
		char *bytes = (char *)(uintptr_t)writes.v[i].aux;
		if (b <= p || a >= q) {
			i++;
		} else if (a >= p && b <= q) {
			free(bytes);
			// Later writes win over earlier ones: keep the order.
			memmove(&writes.v[i], &writes.v[i + 1], sizeof(entry) * (writes.n - i - 1));
			writes.n--;
		} else if (a < p && b > q) {
			// Split in two, the right part just after the left one.
			char *right = malloc(b - q);
			memcpy(right, bytes + (q - a), b - q);
			writes.v[i].size = p - a;
			tadd(&writes, 0, 0, 0);
			memmove(&writes.v[i + 2], &writes.v[i + 1], sizeof(entry) * (writes.n - i - 2));
			writes.v[i + 1] = (entry){.key = q, .size = b - q, .aux = (uint64_t)(uintptr_t)right};
			i += 2;
		} else if (a < p) {
			writes.v[i].size = p - a;
			i++;
		} else {
			char *right = malloc(b - q);
			memcpy(right, bytes + (q - a), b - q);
			free(bytes);
			writes.v[i] = (entry){.key = q, .size = b - q, .aux = (uint64_t)(uintptr_t)right};
			i++;
		}
	}
}

static void complete_events(CUstream s, int all) {
	for (int i = 0; i < events.n; i++)
		if (all || events.v[i].aux == (uint64_t)(uintptr_t)s) events.v[i].size = 0;
}

CUresult CUDAAPI cuCtxSynchronize(void) {
	ENTER("cuCtxSynchronize");
	NEED_CTX();
	complete_events(NULL, 1);
	waits.n = 0;
	pool_synchronized();
	RETURN(CUDA_SUCCESS);
}

// ---- memory ----

CUresult CUDAAPI cuMemAlloc(CUdeviceptr *dptr, size_t bytesize) {
	ENTER("cuMemAlloc");
	NEED_CTX();
	if (!dptr || bytesize == 0) RETURN(CUDA_ERROR_INVALID_VALUE);
	if (bytesize > capacity - used) RETURN(CUDA_ERROR_OUT_OF_MEMORY);
	uint64_t a = next_addr;
	next_addr += (bytesize + 511) & ~511ull;
	used += bytesize;
	tadd(&mem, a, bytesize, 0);
	*dptr = (CUdeviceptr)a;
	RETURN(CUDA_SUCCESS);
}

CUresult CUDAAPI cuMemFree(CUdeviceptr dptr) {
	ENTER("cuMemFree");
	NEED_CTX();
	int i = tfind(&mem, dptr);
	if (i < 0) RETURN(CUDA_ERROR_INVALID_VALUE);
	used -= mem.v[i].size;
	drop_writes(dptr, mem.v[i].size);
	tdel(&mem, i);
	RETURN(CUDA_SUCCESS);
}

CUresult CUDAAPI cuMemGetInfo(size_t *free, size_t *total) {
	ENTER("cuMemGetInfo");
	NEED_CTX();
	if (!free || !total) RETURN(CUDA_ERROR_INVALID_VALUE);
	*free = capacity - used;
	*total = capacity;
	RETURN(CUDA_SUCCESS);
}

CUresult CUDAAPI cuMemHostAlloc(void **pp, size_t bytesize, unsigned int flags) {
	ENTER("cuMemHostAlloc");
	NEED_CTX();
	(void)flags;
	if (!pp || bytesize == 0) RETURN(CUDA_ERROR_INVALID_VALUE);
	void *p = calloc(1, bytesize);
	if (!p) RETURN(CUDA_ERROR_OUT_OF_MEMORY);
	tadd(&hosts, (uint64_t)(uintptr_t)p, bytesize, 0);
	*pp = p;
	RETURN(CUDA_SUCCESS);
}

CUresult CUDAAPI cuMemFreeHost(void *p) {
	ENTER("cuMemFreeHost");
	NEED_CTX();
	int i = tfind(&hosts, (uint64_t)(uintptr_t)p);
	if (i < 0) RETURN(CUDA_ERROR_INVALID_VALUE);
	tdel(&hosts, i);
	free(p);
	RETURN(CUDA_SUCCESS);
}

// ---- streams and events ----

static int valid_stream(CUstream s) {
	return s == NULL || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD ||
	       tfind(&streams, (uint64_t)(uintptr_t)s) >= 0;
}

CUresult CUDAAPI cuStreamCreate(CUstream *ps, unsigned int flags) {
	ENTER("cuStreamCreate");
	NEED_CTX();
	if (!ps || (flags & ~1u)) RETURN(CUDA_ERROR_INVALID_VALUE);
	// Handles are fake, odd, non-null values that are never dereferenced.
	uint64_t h = 0x5000000000000001ull + 2 * next_obj++;
	tadd(&streams, h, 0, flags);
	*ps = (CUstream)(uintptr_t)h;
	RETURN(CUDA_SUCCESS);
}

CUresult CUDAAPI cuStreamDestroy(CUstream s) {
	ENTER("cuStreamDestroy");
	NEED_CTX();
	int i = tfind(&streams, (uint64_t)(uintptr_t)s);
	if (i < 0) RETURN(CUDA_ERROR_INVALID_HANDLE);
	tdel(&streams, i);
	RETURN(CUDA_SUCCESS);
}

CUresult CUDAAPI cuStreamSynchronize(CUstream s) {
	ENTER("cuStreamSynchronize");
	NEED_CTX();
	if (!valid_stream(s)) RETURN(CUDA_ERROR_INVALID_HANDLE);
	// The work of s waits for the events it waited on: they complete first.
	for (int i = 0; i < waits.n;)
		if (waits.v[i].key == (uint64_t)(uintptr_t)s) {
			complete_events((CUstream)(uintptr_t)waits.v[i].size, 0);
			tdel(&waits, i);
		} else {
			i++;
		}
	complete_events(s, 0);
	pool_synchronized();
	RETURN(CUDA_SUCCESS);
}

// cuStreamQuery: not ready while an event recorded on s is held.
CUresult CUDAAPI cuStreamQuery(CUstream s) {
	ENTER("cuStreamQuery");
	NEED_CTX();
	if (!valid_stream(s)) RETURN(CUDA_ERROR_INVALID_HANDLE);
	for (int i = 0; i < events.n; i++)
		if (events.v[i].aux == (uint64_t)(uintptr_t)s && events.v[i].size) RETURN(CUDA_ERROR_NOT_READY);
	RETURN(CUDA_SUCCESS);
}

CUresult CUDAAPI cuStreamWaitEvent(CUstream s, CUevent e, unsigned int flags) {
	ENTER("cuStreamWaitEvent");
	NEED_CTX();
	if (flags != 0) RETURN(CUDA_ERROR_INVALID_VALUE);
	int i = tfind(&events, (uint64_t)(uintptr_t)e);
	if (i < 0 || !valid_stream(s)) RETURN(CUDA_ERROR_INVALID_HANDLE);
	if (events.v[i].size) tadd(&waits, (uint64_t)(uintptr_t)s, events.v[i].aux, 0);
	RETURN(CUDA_SUCCESS);
}

CUresult CUDAAPI cuEventCreate(CUevent *pe, unsigned int flags) {
	ENTER("cuEventCreate");
	NEED_CTX();
	if (!pe) RETURN(CUDA_ERROR_INVALID_VALUE);
	if (!(flags & CU_EVENT_DISABLE_TIMING)) timed_events++;
	uint64_t h = 0x6000000000000001ull + 2 * next_obj++;
	tadd(&events, h, 0, 0);
	*pe = (CUevent)(uintptr_t)h;
	RETURN(CUDA_SUCCESS);
}

CUresult CUDAAPI cuEventRecord(CUevent e, CUstream s) {
	ENTER("cuEventRecord");
	NEED_CTX();
	int i = tfind(&events, (uint64_t)(uintptr_t)e);
	if (i < 0 || !valid_stream(s)) RETURN(CUDA_ERROR_INVALID_HANDLE);
	events.v[i].size = hold_events ? 1 : 0;
	events.v[i].aux = (uint64_t)(uintptr_t)s;
	RETURN(CUDA_SUCCESS);
}

CUresult CUDAAPI cuEventQuery(CUevent e) {
	ENTER("cuEventQuery");
	NEED_CTX();
	int i = tfind(&events, (uint64_t)(uintptr_t)e);
	if (i < 0) RETURN(CUDA_ERROR_INVALID_HANDLE);
	RETURN(events.v[i].size ? CUDA_ERROR_NOT_READY : CUDA_SUCCESS);
}

CUresult CUDAAPI cuEventSynchronize(CUevent e) {
	ENTER("cuEventSynchronize");
	NEED_CTX();
	int i = tfind(&events, (uint64_t)(uintptr_t)e);
	if (i < 0) RETURN(CUDA_ERROR_INVALID_HANDLE);
	events.v[i].size = 0;
	pool_synchronized();
	RETURN(CUDA_SUCCESS);
}

CUresult CUDAAPI cuEventDestroy(CUevent e) {
	ENTER("cuEventDestroy");
	NEED_CTX();
	int i = tfind(&events, (uint64_t)(uintptr_t)e);
	if (i < 0) RETURN(CUDA_ERROR_INVALID_HANDLE);
	tdel(&events, i);
	RETURN(CUDA_SUCCESS);
}

// ---- virtual memory ----

CUresult CUDAAPI cuMemGetAllocationGranularity(size_t *g, const CUmemAllocationProp *prop,
                                               CUmemAllocationGranularity_flags option) {
	ENTER("cuMemGetAllocationGranularity");
	(void)option;
	if (!g || !prop || prop->location.id < 0 || prop->location.id >= ndevices) RETURN(CUDA_ERROR_INVALID_VALUE);
	if (!vmm_supported) RETURN(CUDA_ERROR_NOT_SUPPORTED);
	*g = GRANULARITY;
	RETURN(CUDA_SUCCESS);
}

CUresult CUDAAPI cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
                                     unsigned long long flags) {
	ENTER("cuMemAddressReserve");
	NEED_CTX();
	(void)alignment, (void)addr, (void)flags;
	if (!ptr || size == 0 || size % GRANULARITY) RETURN(CUDA_ERROR_INVALID_VALUE);
	uint64_t b = next_va;
	next_va += size + GRANULARITY; // a guard page between reservations
	tadd(&reservations, b, size, 0);
	*ptr = (CUdeviceptr)b;
	RETURN(CUDA_SUCCESS);
}

static int overlaps_mapping(uint64_t p, uint64_t size) {
	for (int i = 0; i < mappings.n; i++)
		if (p < mappings.v[i].key + mappings.v[i].size && mappings.v[i].key < p + size) return 1;
	return 0;
}

CUresult CUDAAPI cuMemAddressFree(CUdeviceptr ptr, size_t size) {
	ENTER("cuMemAddressFree");
	NEED_CTX();
	int i = tfind(&reservations, ptr);
	if (i < 0 || reservations.v[i].size != size) RETURN(CUDA_ERROR_INVALID_VALUE);
	if (overlaps_mapping(ptr, size)) RETURN(CUDA_ERROR_INVALID_VALUE);
	tdel(&reservations, i);
	RETURN(CUDA_SUCCESS);
}

CUresult CUDAAPI cuMemCreate(CUmemGenericAllocationHandle *h, size_t size, const CUmemAllocationProp *prop,
                             unsigned long long flags) {
	ENTER("cuMemCreate");
	NEED_CTX();
	(void)flags;
	if (!h || !prop || size == 0 || size % GRANULARITY) RETURN(CUDA_ERROR_INVALID_VALUE);
	if (prop->location.id < 0 || prop->location.id >= ndevices) RETURN(CUDA_ERROR_INVALID_DEVICE);
	if (size > capacity - used) RETURN(CUDA_ERROR_OUT_OF_MEMORY);
	used += size;
	uint64_t id = next_handle++;
	tadd(&handles, id, size, 0);
	*h = id;
	RETURN(CUDA_SUCCESS);
}

// maybe_drop frees a handle's memory once it is released and unmapped.
// aux holds the mapping count; bit 63 says released.
static void maybe_drop(int i) {
	if (handles.v[i].aux == (1ull << 63)) {
		used -= handles.v[i].size;
		tdel(&handles, i);
	}
}

CUresult CUDAAPI cuMemRelease(CUmemGenericAllocationHandle h) {
	ENTER("cuMemRelease");
	NEED_CTX();
	int i = tfind(&handles, h);
	if (i < 0 || (handles.v[i].aux >> 63)) RETURN(CUDA_ERROR_INVALID_VALUE);
	handles.v[i].aux |= 1ull << 63;
	maybe_drop(i);
	RETURN(CUDA_SUCCESS);
}

static int in_reservation(uint64_t p, uint64_t size) {
	for (int i = 0; i < reservations.n; i++)
		if (p >= reservations.v[i].key && p + size <= reservations.v[i].key + reservations.v[i].size) return 1;
	return 0;
}

CUresult CUDAAPI cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle h,
                          unsigned long long flags) {
	ENTER("cuMemMap");
	NEED_CTX();
	(void)flags;
	int i = tfind(&handles, h);
	if (i < 0 || (handles.v[i].aux >> 63)) RETURN(CUDA_ERROR_INVALID_HANDLE);
	if (offset != 0 || size != handles.v[i].size || ptr % GRANULARITY) RETURN(CUDA_ERROR_INVALID_VALUE);
	if (!in_reservation(ptr, size)) RETURN(CUDA_ERROR_INVALID_VALUE);
	if (overlaps_mapping(ptr, size)) RETURN(CUDA_ERROR_ALREADY_MAPPED);
	handles.v[i].aux++;
	tadd(&mappings, ptr, size, h);
	RETURN(CUDA_SUCCESS);
}

CUresult CUDAAPI cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count) {
	ENTER("cuMemSetAccess");
	NEED_CTX();
	if (!desc || count == 0 || size == 0) RETURN(CUDA_ERROR_INVALID_VALUE);
	// Every byte of the range must be mapped.
	uint64_t covered = 0;
	for (int i = 0; i < mappings.n; i++) {
		uint64_t a = mappings.v[i].key, b = a + mappings.v[i].size;
		if (a >= ptr && b <= ptr + size) covered += b - a;
		else if (a < ptr + size && ptr < b) RETURN(CUDA_ERROR_INVALID_VALUE);
	}
	if (covered != size) RETURN(CUDA_ERROR_INVALID_VALUE);
	RETURN(CUDA_SUCCESS);
}

CUresult CUDAAPI cuMemUnmap(CUdeviceptr ptr, size_t size) {
	ENTER("cuMemUnmap");
	NEED_CTX();
	// The range must be exactly one or more whole mappings.
	uint64_t covered = 0;
	for (int i = 0; i < mappings.n; i++) {
		uint64_t a = mappings.v[i].key, b = a + mappings.v[i].size;
		if (a >= ptr && b <= ptr + size) covered += b - a;
		else if (a < ptr + size && ptr < b) RETURN(CUDA_ERROR_INVALID_VALUE);
	}
	if (size == 0 || covered != size) RETURN(CUDA_ERROR_INVALID_VALUE);
	drop_writes(ptr, size);
	for (int i = 0; i < mappings.n;) {
		uint64_t a = mappings.v[i].key;
		if (a >= ptr && a < ptr + size) {
			int hi = tfind(&handles, mappings.v[i].aux);
			tdel(&mappings, i);
			if (hi >= 0) {
				handles.v[hi].aux--;
				maybe_drop(hi);
			}
			continue;
		}
		i++;
	}
	RETURN(CUDA_SUCCESS);
}

// ---- copies ----

// handed_out: [p, p+n) lies in one cuMemAlloc range, one pool block, or
// mapped pages throughout.
static int handed_out(uint64_t p, uint64_t n) {
	if (n == 0 || p + n < p) return 0;
	for (int i = 0; i < mem.n; i++)
		if (p >= mem.v[i].key && p + n <= mem.v[i].key + mem.v[i].size) return 1;
	for (int i = 0; i < async_blocks.n; i++)
		if (p >= async_blocks.v[i].key && p + n <= async_blocks.v[i].key + async_blocks.v[i].size) return 1;
	uint64_t covered = 0;
	for (int i = 0; i < mappings.n; i++) {
		uint64_t a = mappings.v[i].key, b = a + mappings.v[i].size;
		uint64_t lo = a > p ? a : p, hi = b < p + n ? b : p + n;
		if (lo < hi) covered += hi - lo;
	}
	return covered == n;
}

CUresult CUDAAPI cuMemcpyHtoD(CUdeviceptr dst, const void *src, size_t n) {
	ENTER("cuMemcpyHtoD");
	NEED_CTX();
	if (!src || !handed_out(dst, n)) RETURN(CUDA_ERROR_INVALID_VALUE);
	void *copy = malloc(n);
	if (!copy) RETURN(CUDA_ERROR_OUT_OF_MEMORY);
	memcpy(copy, src, n);
	tadd(&writes, dst, n, (uint64_t)(uintptr_t)copy);
	RETURN(CUDA_SUCCESS);
}

CUresult CUDAAPI cuMemcpyDtoH(void *dst, CUdeviceptr src, size_t n) {
	ENTER("cuMemcpyDtoH");
	NEED_CTX();
	if (!dst || !handed_out(src, n)) RETURN(CUDA_ERROR_INVALID_VALUE);
	memset(dst, 0, n);
	for (int i = 0; i < writes.n; i++) {
		uint64_t a = writes.v[i].key, b = a + writes.v[i].size;
		uint64_t lo = a > src ? a : src, hi = b < src + n ? b : src + n;
		if (lo < hi)
			memcpy((char *)dst + (lo - src), (char *)(uintptr_t)writes.v[i].aux + (lo - a), hi - lo);
	}
	RETURN(CUDA_SUCCESS);
}

// ---- the default memory pool ----

CUresult CUDAAPI cuDeviceGetDefaultMemPool(CUmemoryPool *pool, CUdevice dev) {
	ENTER("cuDeviceGetDefaultMemPool");
	if (dev < 0 || dev >= ndevices) RETURN(CUDA_ERROR_INVALID_DEVICE);
	if (!pool) RETURN(CUDA_ERROR_INVALID_VALUE);
	if (!pools_supported) RETURN(CUDA_ERROR_NOT_SUPPORTED);
	*pool = DEFAULT_POOL;
	RETURN(CUDA_SUCCESS);
}

CUresult CUDAAPI cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream s) {
	ENTER("cuMemAllocFromPoolAsync");
	NEED_CTX();
	if (!dptr || bytesize == 0 || pool != DEFAULT_POOL) RETURN(CUDA_ERROR_INVALID_VALUE);
	if (!valid_stream(s)) RETURN(CUDA_ERROR_INVALID_HANDLE);
	if (pool_used + bytesize > pool_reserved) {
		uint64_t grow = (pool_used + bytesize - pool_reserved + GRANULARITY - 1) / GRANULARITY * GRANULARITY;
		if (grow > capacity - used) RETURN(CUDA_ERROR_OUT_OF_MEMORY);
		used += grow;
		pool_reserved += grow;
		if (pool_reserved > pool_reserved_high) pool_reserved_high = pool_reserved;
	}
	uint64_t a = next_addr;
	next_addr += (bytesize + 511) & ~511ull;
	pool_used += bytesize;
	if (pool_used > pool_used_high) pool_used_high = pool_used;
	tadd(&async_blocks, a, bytesize, 0);
	*dptr = (CUdeviceptr)a;
	RETURN(CUDA_SUCCESS);
}

CUresult CUDAAPI cuMemFreeAsync(CUdeviceptr dptr, CUstream s) {
	ENTER("cuMemFreeAsync");
	NEED_CTX();
	if (!valid_stream(s)) RETURN(CUDA_ERROR_INVALID_HANDLE);
	int i = tfind(&async_blocks, dptr);
	if (i < 0) RETURN(CUDA_ERROR_INVALID_VALUE);
	pool_used -= async_blocks.v[i].size;
	drop_writes(dptr, async_blocks.v[i].size);
	tdel(&async_blocks, i);
	RETURN(CUDA_SUCCESS);
}

CUresult CUDAAPI cuMemPoolTrimTo(CUmemoryPool pool, size_t keep) {
	ENTER("cuMemPoolTrimTo");
	if (pool != DEFAULT_POOL) RETURN(CUDA_ERROR_INVALID_VALUE);
	pool_release_to(keep);
	RETURN(CUDA_SUCCESS);
}

CUresult CUDAAPI cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value) {
	ENTER("cuMemPoolSetAttribute");
	if (pool != DEFAULT_POOL || !value) RETURN(CUDA_ERROR_INVALID_VALUE);
	cuuint64_t v = *(cuuint64_t *)value;
	switch (attr) {
	case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD: pool_threshold = v; break;
	case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
		if (v != 0) RETURN(CUDA_ERROR_INVALID_VALUE);
		pool_reserved_high = pool_reserved;
		break;
	case CU_MEMPOOL_ATTR_USED_MEM_HIGH:
		if (v != 0) RETURN(CUDA_ERROR_INVALID_VALUE);
		pool_used_high = pool_used;
		break;
	default: RETURN(CUDA_ERROR_INVALID_VALUE);
	}
	RETURN(CUDA_SUCCESS);
}

CUresult CUDAAPI cuMemPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value) {
	ENTER("cuMemPoolGetAttribute");
	if (pool != DEFAULT_POOL || !value) RETURN(CUDA_ERROR_INVALID_VALUE);
	cuuint64_t *v = (cuuint64_t *)value;
	switch (attr) {
	case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD: *v = pool_threshold; break;
	case CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT: *v = pool_reserved; break;
	case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH: *v = pool_reserved_high; break;
	case CU_MEMPOOL_ATTR_USED_MEM_CURRENT: *v = pool_used; break;
	case CU_MEMPOOL_ATTR_USED_MEM_HIGH: *v = pool_used_high; break;
	default: RETURN(CUDA_ERROR_INVALID_VALUE);
	}
	RETURN(CUDA_SUCCESS);
}

// ---- error texts ----

static const struct {
	int code;
	const char *name, *text;
} errtab[] = {
	{CUDA_SUCCESS, "CUDA_SUCCESS", "no error"},
	{CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
	{CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
	{CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
	{CUDA_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
	{CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
	{CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
	{CUDA_ERROR_ALREADY_MAPPED, "CUDA_ERROR_ALREADY_MAPPED", "resource already mapped"},
	{CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
	{CUDA_ERROR_NOT_READY, "CUDA_ERROR_NOT_READY", "device not ready"},
	{CUDA_ERROR_ILLEGAL_ADDRESS, "CUDA_ERROR_ILLEGAL_ADDRESS", "an illegal memory access was encountered"},
	{CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
	{CUDA_ERROR_UNKNOWN, "CUDA_ERROR_UNKNOWN", "unknown error"},
};

CUresult CUDAAPI cuGetErrorName(CUresult error, const char **pstr) {
	if (!pstr) return CUDA_ERROR_INVALID_VALUE;
	for (size_t i = 0; i < sizeof errtab / sizeof errtab[0]; i++)
		if (errtab[i].code == (int)error) {
			*pstr = errtab[i].name;
			return CUDA_SUCCESS;
		}
	*pstr = NULL;
	return CUDA_ERROR_INVALID_VALUE;
}

CUresult CUDAAPI cuGetErrorString(CUresult error, const char **pstr) {
	if (!pstr) return CUDA_ERROR_INVALID_VALUE;
	for (size_t i = 0; i < sizeof errtab / sizeof errtab[0]; i++)
		if (errtab[i].code == (int)error) {
			*pstr = errtab[i].text;
			return CUDA_SUCCESS;
		}
	*pstr = NULL;
	return CUDA_ERROR_INVALID_VALUE;
}

// ---- controls ----

// cudastub_reset forgets every allocation, stream, event, mapping, injected
// error and counter, and restores the defaults: one device, 8 GiB, virtual
// memory and memory pools supported, events complete at once, an empty
// default pool with release threshold 0.
void cudastub_reset(void) {
	pthread_mutex_lock(&mu);
	for (int i = 0; i < hosts.n; i++) free((void *)(uintptr_t)hosts.v[i].key);
	for (int i = 0; i < writes.n; i++) free((void *)(uintptr_t)writes.v[i].aux);
	mem.n = streams.n = events.n = hosts.n = reservations.n = handles.n = mappings.n = waits.n = 0;
	async_blocks.n = writes.n = 0;
	pool_used = pool_used_high = pool_reserved = pool_reserved_high = pool_threshold = 0;
	pools_supported = 1;
	memset(inj, 0, sizeof inj);
	memset(calls, 0, sizeof calls);
	memset(created, 0, sizeof created);
	nthreads = 0;
	ndevices = 1;
	capacity = 8ull << 30;
	used = 0;
	vmm_supported = 1;
	hold_events = 0;
	context_failures = 0;
	timed_events = 0;
	pthread_mutex_unlock(&mu);
}

void cudastub_set_capacity(uint64_t bytes) {
	pthread_mutex_lock(&mu);
	capacity = bytes;
	pthread_mutex_unlock(&mu);
}

void cudastub_set_devices(int n) {
	pthread_mutex_lock(&mu);
	ndevices = n < 0 ? 0 : n > MAXDEV ? MAXDEV : n;
	pthread_mutex_unlock(&mu);
}

void cudastub_set_pools(int supported) {
	pthread_mutex_lock(&mu);
	pools_supported = supported;
	pthread_mutex_unlock(&mu);
}

void cudastub_set_vmm(int supported) {
	pthread_mutex_lock(&mu);
	vmm_supported = supported;
	pthread_mutex_unlock(&mu);
}

// cudastub_fail makes calls number skip+1 .. skip+count of the function
// name (its unversioned driver name, such as "cuMemAlloc") return code,
// without any other effect.
int cudastub_fail(const char *name, int code, int skip, int count) {
	pthread_mutex_lock(&mu);
	for (int i = 0; i < MAXINJ; i++)
		if (inj[i].count == 0) {
			snprintf(inj[i].name, sizeof inj[i].name, "%s", name);
			inj[i].code = code;
			inj[i].skip = skip;
			inj[i].count = count;
			pthread_mutex_unlock(&mu);
			return 0;
		}
	pthread_mutex_unlock(&mu);
	return -1;
}

long cudastub_calls(const char *name) {
	long n = 0;
	pthread_mutex_lock(&mu);
	for (int i = 0; i < MAXCALLS && calls[i].name[0]; i++)
		if (strcmp(calls[i].name, name) == 0) n = calls[i].n;
	pthread_mutex_unlock(&mu);
	return n;
}

// cudastub_threads is the number of distinct threads that made calls since
// the last reset.
int cudastub_threads(void) {
	pthread_mutex_lock(&mu);
	int n = nthreads;
	pthread_mutex_unlock(&mu);
	return n;
}

// cudastub_invalidate_contexts makes every thread's current context stale,
// as if no context were current anywhere; a call then succeeds only after
// its thread sets or pushes a context again.
void cudastub_invalidate_contexts(void) {
	pthread_mutex_lock(&mu);
	generation++;
	pthread_mutex_unlock(&mu);
}

long cudastub_context_failures(void) {
	pthread_mutex_lock(&mu);
	long n = context_failures;
	pthread_mutex_unlock(&mu);
	return n;
}

long cudastub_timed_events(void) {
	pthread_mutex_lock(&mu);
	long n = timed_events;
	pthread_mutex_unlock(&mu);
	return n;
}

// cudastub_hold_events: when on, recorded events stay not ready until a
// synchronize (event, stream or context) or cudastub_complete_events.
void cudastub_hold_events(int on) {
	pthread_mutex_lock(&mu);
	hold_events = on;
	pthread_mutex_unlock(&mu);
}

void cudastub_complete_events(void) {
	pthread_mutex_lock(&mu);
	complete_events(NULL, 1);
	pthread_mutex_unlock(&mu);
}

// cudastub_live counts the live objects of a kind: "mem", "stream",
// "event", "host", "reservation", "handle", "mapping", "wait" (waits on
// held events not yet passed), "async" (blocks of the default pool),
// "write" (copies to the device whose bytes are kept) or "context"
// (contexts of cuCtxCreate not destroyed); -1 for others.
long cudastub_live(const char *kind) {
	long n = -1;
	pthread_mutex_lock(&mu);
	if (!strcmp(kind, "mem")) n = mem.n;
	else if (!strcmp(kind, "stream")) n = streams.n;
	else if (!strcmp(kind, "event")) n = events.n;
	else if (!strcmp(kind, "host")) n = hosts.n;
	else if (!strcmp(kind, "reservation")) n = reservations.n;
	else if (!strcmp(kind, "handle")) n = handles.n;
	else if (!strcmp(kind, "mapping")) n = mappings.n;
	else if (!strcmp(kind, "wait")) n = waits.n;
	else if (!strcmp(kind, "async")) n = async_blocks.n;
	else if (!strcmp(kind, "write")) n = writes.n;
	else if (!strcmp(kind, "context")) {
		n = 0;
		for (int i = 0; i < MAXCREATED; i++) n += created[i].refs > 0;
	}
	pthread_mutex_unlock(&mu);
	return n;
}

uint64_t cudastub_used(void) {
	pthread_mutex_lock(&mu);
	uint64_t n = used;
	pthread_mutex_unlock(&mu);
	return n;
}

static void *unbound_malloc(void *arg) {
	CUdeviceptr p = 0;
	CUresult r = cuMemAlloc(&p, 1 << 20);
	if (r == CUDA_SUCCESS) cuMemFree(p); // cannot happen without a context
	*(int *)arg = (int)r;
	return NULL;
}

// cudastub_unbound_malloc calls cuMemAlloc on a fresh thread that never
// made a context current, and returns the result (the stub's context check
// makes it CUDA_ERROR_INVALID_CONTEXT).
int cudastub_unbound_malloc(void) {
	pthread_t t;
	int r = -1;
	if (pthread_create(&t, NULL, unbound_malloc, &r) != 0) return -1;
	pthread_join(t, NULL);
	return r;
}
