// pair.c: N cached 1 MiB gpumem_malloc+gpumem_free pairs through the C
// library, for scripts/callgrind.sh libgpumem, which counts the
// instructions of two runs that differ only in N.
//
//	pair N [stream]   stream: use an adopted stream (made here) instead of
//	                  the legacy default stream
#define _GNU_SOURCE
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "libgpumem.h"

int main(int argc, char **argv) {
	if (argc < 2) {
		fprintf(stderr, "usage: pair N [stream]\n");
		return 2;
	}
	long n = atol(argv[1]);
	cudaStream_t s = NULL;
	if (argc > 2 && strcmp(argv[2], "stream") == 0) {
		CUdevice dev;
		CUcontext ctx;
		if (cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&ctx, dev) || cuCtxSetCurrent(ctx) ||
		    cuStreamCreate((CUstream *)&s, CU_STREAM_NON_BLOCKING)) {
			fprintf(stderr, "pair: cannot make a stream\n");
			return 1;
		}
	}
	// The first pair makes the allocator, adopts the stream and fills the
	// cache; the others take the cached path.
	for (long i = 0; i <= n; i++) {
		void *p = gpumem_malloc(1 << 20, 0, s);
		if (!p) {
			char buf[512];
			gpumem_last_error(buf, sizeof buf);
			fprintf(stderr, "pair: %s\n", buf);
			return 1;
		}
		gpumem_free(p, 1 << 20, 0, s);
	}
	return 0;
}
