// ctest.c: tests libgpumem from C the way PyTorch's CUDAPluggableAllocator
// calls it (gpumem_malloc(size, device, stream), gpumem_free(ptr, size,
// device, stream)), with the C API around it: several threads on two
// streams, frees on another stream than the allocation's, record-stream,
// out of memory, empty-cache, the stats JSON and its snprintf contract,
// the summary, step marks and the plan's figures, and the last error.
//
// It runs against the stub driver (device/cuda/internal/cudastub), whose
// control functions it finds with dlsym; on a real driver the checks that
// need them are skipped. scripts/ci-cuda.sh builds and runs it:
//
//	ctest            every check (GPUMEM_ALLOC_CONF as the caller set it)
//	ctest badconf    the configuration is bad: every call fails and says why
//
// It prints one line per failed check and exits 1 if any failed.

#define _GNU_SOURCE
#include <cuda.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "libgpumem.h"

static int failures;

#define CHECK(cond, ...)                                                   \
	do {                                                                   \
		if (!(cond)) {                                                     \
			failures++;                                                    \
			fprintf(stderr, "ctest: FAIL %s:%d: %s: ", __FILE__, __LINE__, \
			        #cond);                                                \
			fprintf(stderr, __VA_ARGS__);                                  \
			fprintf(stderr, "\n");                                         \
		}                                                                  \
	} while (0)

#define MiB (1ll << 20)

// ---- the stub's controls (NULL on a real driver) ----

static void (*stub_hold_events)(int);
static uint64_t (*stub_used)(void);

static int stubbed(void) {
	stub_hold_events = (void (*)(int))dlsym(RTLD_DEFAULT, "cudastub_hold_events");
	stub_used = (uint64_t(*)(void))dlsym(RTLD_DEFAULT, "cudastub_used");
	return stub_hold_events && stub_used;
}

// ---- small functions of the checks ----

static char *last_error(void) {
	static __thread char buf[4096];
	size_t n = gpumem_last_error(buf, sizeof buf);
	if (n == 0) buf[0] = 0;
	return buf;
}

// stat reads one key of the stats JSON of device 0 (-1 if absent).
static long long stat(const char *key) {
	size_t n = gpumem_memory_stats_json(0, NULL, 0);
	char *buf = malloc(n + 1);
	if (!buf) abort();
	size_t m = gpumem_memory_stats_json(0, buf, n + 1);
	CHECK(m == n && strlen(buf) == n, "length %zu then %zu, strlen %zu", n, m, strlen(buf));
	char pat[256];
	snprintf(pat, sizeof pat, "\"%s\":", key);
	char *at = strstr(buf, pat);
	long long v = at ? strtoll(at + strlen(pat), NULL, 10) : -1;
	free(buf);
	return v;
}

static void cu_check(CUresult r, const char *what) {
	if (r != CUDA_SUCCESS) {
		fprintf(stderr, "ctest: %s failed: CUresult %d\n", what, (int)r);
		exit(2);
	}
}

// ---- threads ----

enum { THREADS = 8, ROUNDS = 400 };

static cudaStream_t streams[2];
static CUcontext primary;

static void *worker(void *arg) {
	long w = (long)arg;
	// A runtime's thread has its context current; gpumem does not need it.
	if (w % 2) cu_check(cuCtxSetCurrent(primary), "cuCtxSetCurrent");
	cudaStream_t mine = streams[w % 2], other = streams[1 - w % 2];
	void *held[8] = {0};
	for (int i = 0; i < ROUNDS; i++) {
		ssize_t size = (ssize_t)((i * 7919 + w * 104729) % (3 * MiB)) + 1;
		void *p = gpumem_malloc(size, 0, mine);
		CHECK(p != NULL, "thread %ld round %d: malloc(%zd): %s", w, i, size, last_error());
		if (!p) return NULL;
		if (i % 5 == 0) CHECK(gpumem_record_stream(p, 0, other) == 0, "record stream: %s", last_error());
		int slot = i % 8;
		if (held[slot]) gpumem_free(held[slot], 0, 0, (i % 3 == 0) ? other : mine);
		held[slot] = p;
	}
	for (int i = 0; i < 8; i++) gpumem_free(held[i], 0, 0, mine);
	return NULL;
}

// ---- checks ----

static void check_snprintf(void) {
	size_t n = gpumem_memory_stats_json(0, NULL, 0);
	CHECK(n > 2, "stats JSON length %zu", n);
	char small[10];
	memset(small, 'x', sizeof small);
	size_t m = gpumem_memory_stats_json(0, small, sizeof small);
	CHECK(m == n, "returns the whole length whatever the cap: %zu vs %zu", m, n);
	CHECK(small[9] == 0 && strlen(small) == 9 && small[0] == '{', "cut at cap-1 and NUL-terminated: %.10s", small);
	char one = 'x';
	gpumem_memory_stats_json(0, &one, 1);
	CHECK(one == 0, "cap 1 writes the NUL only");
	char *exact = malloc(n + 1);
	memset(exact, 'x', n + 1);
	gpumem_memory_stats_json(0, exact, n);
	CHECK(exact[n - 1] == 0 && exact[n] == 'x', "cap n writes n bytes, no more");
	free(exact);

	size_t s = gpumem_memory_summary(0, 0, NULL, 0);
	char *sum = malloc(s + 1);
	CHECK(gpumem_memory_summary(0, 0, sum, s + 1) == s, "summary length");
	CHECK(strstr(sum, "Allocated memory") != NULL, "summary has PyTorch's rows");
	free(sum);
}

static void check_streams(int stub) {
	// Allocated on stream 0, freed on stream 1 while its work is pending:
	// not reused on stream 0 until stream 1's work has finished.
	if (stub) stub_hold_events(1);
	void *p = gpumem_malloc(4 * MiB, 0, streams[0]);
	CHECK(p != NULL, "malloc: %s", last_error());
	gpumem_free(p, 4 * MiB, 0, streams[1]);
	void *q = gpumem_malloc(4 * MiB, 0, streams[0]);
	CHECK(q != NULL, "malloc: %s", last_error());
	if (stub) CHECK(q != p, "a block freed on another stream is not reused while that stream's work is pending");
	cu_check(cuStreamSynchronize((CUstream)streams[1]), "cuStreamSynchronize");
	gpumem_free(q, 4 * MiB, 0, streams[0]);
	void *r = gpumem_malloc(4 * MiB, 0, streams[0]);
	CHECK(r == p || r == q, "reused once stream 1 finished: %p not %p or %p", r, p, q);

	// record-stream: the same rule for a block used on stream 1.
	CHECK(gpumem_record_stream(r, 0, streams[1]) == 0, "record stream: %s", last_error());
	gpumem_free(r, 4 * MiB, 0, streams[0]);
	void *t = gpumem_malloc(4 * MiB, 0, streams[0]);
	if (stub) CHECK(t != r, "a recorded block waits for its stream");
	gpumem_free(t, 4 * MiB, 0, streams[0]);
	cu_check(cuStreamSynchronize((CUstream)streams[1]), "cuStreamSynchronize");
	if (stub) stub_hold_events(0);
}

static void check_errors(int stub) {
	CHECK(gpumem_malloc(0, 0, streams[0]) == NULL, "size 0 gives NULL");
	gpumem_free(NULL, 0, 0, streams[0]); // nothing happens

	// Out of memory: NULL, the error says so, and num_ooms counts it.
	long long ooms = stat("num_ooms");
	void *big = gpumem_malloc(1ll << 50, 0, streams[0]);
	CHECK(big == NULL, "1 PiB cannot be allocated");
	CHECK(strstr(last_error(), "out of memory") != NULL, "last error: %s", last_error());
	CHECK(stat("num_ooms") == ooms + 1, "num_ooms %lld then %lld", ooms, stat("num_ooms"));

	long long allocated = stat("allocated_bytes.all.current");
	gpumem_free((void *)0x1234, 16, 0, streams[0]);
	CHECK(strstr(last_error(), "0x1234") != NULL, "free of a foreign pointer: %s", last_error());
	CHECK(gpumem_record_stream((void *)0x1234, 0, streams[1]) == -1, "record stream of a foreign pointer");
	CHECK(gpumem_malloc(-5, 0, streams[0]) == NULL, "negative size");
	CHECK(strstr(last_error(), "invalid size") != NULL, "last error: %s", last_error());
	CHECK(gpumem_malloc(MiB, 99, streams[0]) == NULL, "device 99");
	if (stub) { // a real driver may crash on a handle that is not a stream
		CHECK(gpumem_malloc(MiB, 0, (cudaStream_t)0x4321) == NULL, "a stream the driver does not know");
		CHECK(strstr(last_error(), "stream") != NULL, "last error: %s", last_error());
	}
	CHECK(gpumem_empty_cache(-1) == -1, "empty cache of device -1");
	CHECK(gpumem_memory_stats_json(-1, NULL, 0) == 0, "stats of device -1");
	CHECK(stat("allocated_bytes.all.current") == allocated, "bad calls change nothing");
}

static void *no_error_thread(void *arg) {
	(void)arg;
	char c = 'x';
	size_t n = gpumem_last_error(&c, 1);
	CHECK(n == 0 && c == 0, "a thread without errors has no last error (%zu)", n);
	return NULL;
}

// check_steps marks four steps of the same allocations on one stream.
// Under gpumem_policy:planned (in GPUMEM_ALLOC_CONF) the second repeats the
// first, is planned at the third mark, and the last two are served from
// its arena; under any other configuration the plan's figures are null.
static void check_steps(void) {
	const char *conf = getenv("GPUMEM_ALLOC_CONF");
	int planned = conf && strstr(conf, "gpumem_policy:planned");
	const ssize_t sizes[] = {3 * MiB, 512, 25 * MiB, 70 * 1024};
	for (int step = 0; step < 4; step++) {
		CHECK(gpumem_mark_step(0, "step") == 0, "mark step: %s", last_error());
		void *p[4];
		for (int i = 0; i < 4; i++) {
			p[i] = gpumem_malloc(sizes[i], 0, streams[0]);
			CHECK(p[i] != NULL, "malloc in a step: %s", last_error());
		}
		for (int i = 0; i < 4; i++) gpumem_free(p[i], sizes[i], 0, streams[0]);
	}
	CHECK(gpumem_mark_step(0, NULL) == 0, "mark step with no name: %s", last_error());
	char buf[512];
	size_t n = gpumem_plan_stats_json(0, buf, sizeof buf);
	CHECK(n > 0 && n < sizeof buf, "plan stats length %zu: %s", n, last_error());
	if (planned) {
		CHECK(strstr(buf, "\"plans\":1,") != NULL && strstr(buf, "\"served\":8,") != NULL, "planned steps: %s", buf);
	} else {
		CHECK(strcmp(buf, "null") == 0, "no plan under %s: %s", conf ? conf : "the default", buf);
	}
	CHECK(gpumem_mark_step(-1, "step") == -1, "mark step on device -1");
	CHECK(gpumem_plan_stats_json(-1, NULL, 0) == 0, "plan stats of device -1");
}

static int run_all(void) {
	int stub = stubbed();
	if (!stub) fprintf(stderr, "ctest: the driver is not the stub: checks that hold events are skipped\n");
	CUdevice dev;
	cu_check(cuInit(0), "cuInit");
	cu_check(cuDeviceGet(&dev, 0), "cuDeviceGet");
	cu_check(cuDevicePrimaryCtxRetain(&primary, dev), "cuDevicePrimaryCtxRetain");
	cu_check(cuCtxSetCurrent(primary), "cuCtxSetCurrent");
	for (int i = 0; i < 2; i++) cu_check(cuStreamCreate((CUstream *)&streams[i], CU_STREAM_NON_BLOCKING), "cuStreamCreate");

	check_snprintf();
	check_streams(stub);
	check_steps();

	pthread_t th[THREADS];
	for (long w = 0; w < THREADS; w++) pthread_create(&th[w], NULL, worker, (void *)w);
	for (int w = 0; w < THREADS; w++) pthread_join(th[w], NULL);
	cu_check(cuCtxSynchronize(), "cuCtxSynchronize");
	CHECK(stat("allocated_bytes.all.current") == 0, "all freed: %lld", stat("allocated_bytes.all.current"));
	CHECK(stat("allocation.all.allocated") >= THREADS * ROUNDS, "allocations counted: %lld", stat("allocation.all.allocated"));

	check_errors(stub);
	pthread_t t;
	pthread_create(&t, NULL, no_error_thread, NULL);
	pthread_join(t, NULL);

	// The out-of-memory check emptied the cache: fill it again.
	void *again = gpumem_malloc(3 * MiB, 0, streams[1]);
	CHECK(again != NULL, "malloc after OOM: %s", last_error());
	gpumem_free(again, 3 * MiB, 0, streams[1]);
	CHECK(stat("reserved_bytes.all.current") > 0, "the cache holds segments before empty-cache");
	CHECK(gpumem_empty_cache(0) == 0, "empty cache: %s", last_error());
	CHECK(stat("reserved_bytes.all.current") == 0, "empty cache releases every segment: %lld", stat("reserved_bytes.all.current"));
	if (stub) CHECK(stub_used() == 0, "the driver holds nothing after empty-cache: %llu", (unsigned long long)stub_used());

	for (int i = 0; i < 2; i++) cu_check(cuStreamDestroy((CUstream)streams[i]), "cuStreamDestroy");
	return failures;
}

static int run_badconf(void) {
	CHECK(gpumem_malloc(MiB, 0, NULL) == NULL, "a bad configuration fails malloc");
	CHECK(strstr(last_error(), "GPUMEM_ALLOC_CONF") != NULL, "the error names the variable: %s", last_error());
	CHECK(gpumem_empty_cache(0) == -1, "and empty cache");
	return failures;
}

int main(int argc, char **argv) {
	int bad = argc > 1 && strcmp(argv[1], "badconf") == 0;
	int n = bad ? run_badconf() : run_all();
	if (n) {
		fprintf(stderr, "ctest: %d checks failed\n", n);
		return 1;
	}
	printf("ctest: ok (%s)\n", bad ? "bad configuration" : "threads, two streams, cross-stream free, record-stream, steps and the plan's figures, OOM, empty-cache, stats JSON");
	return 0;
}
