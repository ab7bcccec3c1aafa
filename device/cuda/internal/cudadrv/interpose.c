//go:build cuda

// interpose.c: the cuInit interposer that lets a program built with the
// cuda tag survive gorgonia.org/cu's package init on a machine without a
// usable GPU (see the package documentation).

#define _GNU_SOURCE
#include <dlfcn.h>
#include <cuda.h>

typedef CUresult (*gpumem_cuInit_fn)(unsigned int);

// Written by the first cuInit call (during package initialization), read
// afterwards. gpumem_init_called is 0 until then.
int gpumem_init_called = 0;
int gpumem_init_result = CUDA_ERROR_NOT_INITIALIZED;
int gpumem_init_found = 0;
int gpumem_init_masking = 1;

CUresult CUDAAPI cuInit(unsigned int flags) {
	static gpumem_cuInit_fn real = 0;
	CUresult r;
	if (real == 0) {
		real = (gpumem_cuInit_fn)dlsym(RTLD_NEXT, "cuInit");
	}
	if (real == 0) {
		r = CUDA_ERROR_SHARED_OBJECT_SYMBOL_NOT_FOUND;
	} else {
		gpumem_init_found = 1;
		r = real(flags);
	}
	if (!gpumem_init_called) {
		gpumem_init_called = 1;
		gpumem_init_result = (int)r;
	}
	if (r != CUDA_SUCCESS && gpumem_init_masking) {
		return CUDA_SUCCESS;
	}
	return r;
}
