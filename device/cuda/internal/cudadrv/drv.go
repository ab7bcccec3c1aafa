//go:build cuda

// drv.go: the cgo calls into the driver that gorgonia.org/cu lacks: the
// probe's state, device attributes, virtual memory management, pinned host
// memory, copies between host and device, the device's default memory pool
// (stream-ordered allocation) and the driver's error texts.

package cudadrv

/*
#cgo LDFLAGS: -lcuda -ldl
#include <cuda.h>
#include <stdint.h>

extern int gpumem_init_called;
extern int gpumem_init_result;
extern int gpumem_init_found;
extern int gpumem_init_masking;

static void gpumem_end_masking(void) { gpumem_init_masking = 0; }

static int gpumem_attribute(int dev, int attr, int *out) {
	return cuDeviceGetAttribute(out, (CUdevice_attribute)attr, (CUdevice)dev);
}

static void gpumem_prop(CUmemAllocationProp *prop, int dev) {
	*prop = (CUmemAllocationProp){0};
	prop->type = CU_MEM_ALLOCATION_TYPE_PINNED;
	prop->location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	prop->location.id = dev;
}

static int gpumem_granularity(int dev, int recommended, uint64_t *out) {
	CUmemAllocationProp prop;
	size_t g = 0;
	gpumem_prop(&prop, dev);
	CUresult r = cuMemGetAllocationGranularity(&g, &prop,
		recommended ? CU_MEM_ALLOC_GRANULARITY_RECOMMENDED : CU_MEM_ALLOC_GRANULARITY_MINIMUM);
	*out = (uint64_t)g;
	return r;
}

static int gpumem_address_reserve(uint64_t size, uint64_t *out) {
	CUdeviceptr p = 0;
	CUresult r = cuMemAddressReserve(&p, (size_t)size, 0, 0, 0);
	*out = (uint64_t)p;
	return r;
}

static int gpumem_address_free(uint64_t p, uint64_t size) {
	return cuMemAddressFree((CUdeviceptr)p, (size_t)size);
}

static int gpumem_create(int dev, uint64_t size, uint64_t *out) {
	CUmemAllocationProp prop;
	CUmemGenericAllocationHandle h = 0;
	gpumem_prop(&prop, dev);
	CUresult r = cuMemCreate(&h, (size_t)size, &prop, 0);
	*out = (uint64_t)h;
	return r;
}

static int gpumem_map(uint64_t p, uint64_t size, uint64_t h) {
	return cuMemMap((CUdeviceptr)p, (size_t)size, 0, (CUmemGenericAllocationHandle)h, 0);
}

static int gpumem_set_access(uint64_t p, uint64_t size, int dev) {
	CUmemAccessDesc desc = {0};
	desc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	desc.location.id = dev;
	desc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
	return cuMemSetAccess((CUdeviceptr)p, (size_t)size, &desc, 1);
}

static int gpumem_unmap(uint64_t p, uint64_t size) {
	return cuMemUnmap((CUdeviceptr)p, (size_t)size);
}

static int gpumem_release(uint64_t h) {
	return cuMemRelease((CUmemGenericAllocationHandle)h);
}

static int gpumem_host_alloc(uint64_t size, void **out) {
	return cuMemHostAlloc(out, (size_t)size, 0);
}

static int gpumem_host_free(void *p) {
	return cuMemFreeHost(p);
}

static int gpumem_memcpy_dtoh(void *dst, uint64_t src, uint64_t n) {
	return cuMemcpyDtoH(dst, (CUdeviceptr)src, (size_t)n);
}

static int gpumem_memcpy_htod(uint64_t dst, const void *src, uint64_t n) {
	return cuMemcpyHtoD((CUdeviceptr)dst, src, (size_t)n);
}

static int gpumem_default_mem_pool(int dev, uintptr_t *out) {
	CUmemoryPool pool = 0;
	CUresult r = cuDeviceGetDefaultMemPool(&pool, (CUdevice)dev);
	*out = (uintptr_t)pool;
	return r;
}

static int gpumem_alloc_async(uint64_t size, uintptr_t pool, uintptr_t stream, uint64_t *out) {
	CUdeviceptr p = 0;
	CUresult r = cuMemAllocFromPoolAsync(&p, (size_t)size, (CUmemoryPool)pool, (CUstream)stream);
	*out = (uint64_t)p;
	return r;
}

static int gpumem_free_async(uint64_t p, uintptr_t stream) {
	return cuMemFreeAsync((CUdeviceptr)p, (CUstream)stream);
}

static int gpumem_pool_set(uintptr_t pool, int attr, uint64_t v) {
	cuuint64_t x = (cuuint64_t)v;
	return cuMemPoolSetAttribute((CUmemoryPool)pool, (CUmemPool_attribute)attr, &x);
}

static int gpumem_pool_get(uintptr_t pool, int attr, uint64_t *out) {
	cuuint64_t x = 0;
	CUresult r = cuMemPoolGetAttribute((CUmemoryPool)pool, (CUmemPool_attribute)attr, &x);
	*out = (uint64_t)x;
	return r;
}

static int gpumem_pool_trim(uintptr_t pool, uint64_t keep) {
	return cuMemPoolTrimTo((CUmemoryPool)pool, (size_t)keep);
}

static const char *gpumem_error_name(int code) {
	const char *s = 0;
	if (cuGetErrorName((CUresult)code, &s) != CUDA_SUCCESS) return 0;
	return s;
}

static const char *gpumem_error_string(int code) {
	const char *s = 0;
	if (cuGetErrorString((CUresult)code, &s) != CUDA_SUCCESS) return 0;
	return s;
}
*/
import "C"

import "unsafe"

// Result codes the callers test for (CUresult values).
const (
	Success           = 0   // CUDA_SUCCESS
	ErrInvalidValue   = 1   // CUDA_ERROR_INVALID_VALUE
	ErrOutOfMemory    = 2   // CUDA_ERROR_OUT_OF_MEMORY
	ErrNotInitialized = 3   // CUDA_ERROR_NOT_INITIALIZED
	ErrNoDevice       = 100 // CUDA_ERROR_NO_DEVICE
	ErrInvalidDevice  = 101 // CUDA_ERROR_INVALID_DEVICE
	ErrInvalidContext = 201 // CUDA_ERROR_INVALID_CONTEXT
	ErrInvalidHandle  = 400 // CUDA_ERROR_INVALID_HANDLE
	ErrNotReady       = 600 // CUDA_ERROR_NOT_READY
	ErrNotSupported   = 801 // CUDA_ERROR_NOT_SUPPORTED
)

// AttrVirtualMemorySupported is CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED.
const AttrVirtualMemorySupported = C.CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED

// AttrMemoryPoolsSupported is CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED.
const AttrMemoryPoolsSupported = C.CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED

// Memory pool attributes (CUmemPool_attribute) that callers read or set.
const (
	PoolReleaseThreshold   = C.CU_MEMPOOL_ATTR_RELEASE_THRESHOLD
	PoolReservedMemCurrent = C.CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT
	PoolReservedMemHigh    = C.CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH
	PoolUsedMemCurrent     = C.CU_MEMPOOL_ATTR_USED_MEM_CURRENT
	PoolUsedMemHigh        = C.CU_MEMPOOL_ATTR_USED_MEM_HIGH
)

// InitResult reports what the driver answered to the first cuInit call of
// the process: called is false if nothing has called cuInit yet, found is
// false if no cuInit could be found behind the interposer, and code is the
// CUresult.
func InitResult() (called, found bool, code int) {
	return C.gpumem_init_called != 0, C.gpumem_init_found != 0, int(C.gpumem_init_result)
}

// EndInitMasking stops the interposer from hiding cuInit failures; from
// then on callers of cuInit get the driver's own answer. device/cuda calls
// it from its package init, after gorgonia.org/cu's init has run.
func EndInitMasking() { C.gpumem_end_masking() }

// Attribute returns the device attribute attr (a CUdevice_attribute) of
// device dev.
func Attribute(dev, attr int) (int, int) {
	var v C.int
	r := C.gpumem_attribute(C.int(dev), C.int(attr), &v)
	return int(v), int(r)
}

// Granularity returns the minimum (or, with recommended, the recommended)
// granularity of physical allocations pinned to device dev.
func Granularity(dev int, recommended bool) (uint64, int) {
	var g C.uint64_t
	rec := C.int(0)
	if recommended {
		rec = 1
	}
	r := C.gpumem_granularity(C.int(dev), rec, &g)
	return uint64(g), int(r)
}

// AddressReserve reserves size bytes of device virtual address space
// (cuMemAddressReserve, default alignment, no fixed address).
func AddressReserve(size uint64) (uint64, int) {
	var p C.uint64_t
	r := C.gpumem_address_reserve(C.uint64_t(size), &p)
	return uint64(p), int(r)
}

// AddressFree releases a reservation (cuMemAddressFree).
func AddressFree(p, size uint64) int {
	return int(C.gpumem_address_free(C.uint64_t(p), C.uint64_t(size)))
}

// Create allocates size bytes of physical memory on device dev and returns
// its generic allocation handle (cuMemCreate).
func Create(dev int, size uint64) (uint64, int) {
	var h C.uint64_t
	r := C.gpumem_create(C.int(dev), C.uint64_t(size), &h)
	return uint64(h), int(r)
}

// Map maps the whole of physical allocation h at [p, p+size) (cuMemMap).
func Map(p, size, h uint64) int {
	return int(C.gpumem_map(C.uint64_t(p), C.uint64_t(size), C.uint64_t(h)))
}

// SetAccess makes [p, p+size) readable and writable from device dev
// (cuMemSetAccess).
func SetAccess(p, size uint64, dev int) int {
	return int(C.gpumem_set_access(C.uint64_t(p), C.uint64_t(size), C.int(dev)))
}

// Unmap unmaps [p, p+size) (cuMemUnmap).
func Unmap(p, size uint64) int {
	return int(C.gpumem_unmap(C.uint64_t(p), C.uint64_t(size)))
}

// Release drops the handle h of a physical allocation (cuMemRelease); the
// memory is freed once it is also unmapped everywhere.
func Release(h uint64) int {
	return int(C.gpumem_release(C.uint64_t(h)))
}

// HostAlloc allocates size bytes of page-locked host memory
// (cuMemHostAlloc, default flags).
func HostAlloc(size uint64) (unsafe.Pointer, int) {
	var p unsafe.Pointer
	r := C.gpumem_host_alloc(C.uint64_t(size), &p)
	return p, int(r)
}

// HostFree frees memory from HostAlloc (cuMemFreeHost).
func HostFree(p unsafe.Pointer) int {
	return int(C.gpumem_host_free(p))
}

// ErrorName returns the driver's name for a CUresult, such as
// "CUDA_ERROR_OUT_OF_MEMORY", or "" if the driver does not know it.
func ErrorName(code int) string {
	if s := C.gpumem_error_name(C.int(code)); s != nil {
		return C.GoString(s)
	}
	return ""
}

// ErrorString returns the driver's description of a CUresult, such as
// "out of memory", or "" if the driver does not know it.
func ErrorString(code int) string {
	if s := C.gpumem_error_string(C.int(code)); s != nil {
		return C.GoString(s)
	}
	return ""
}

// MemcpyDtoH copies len(dst) bytes from device address src into dst
// (cuMemcpyDtoH). dst holds no Go pointers.
func MemcpyDtoH(dst []byte, src uint64) int {
	if len(dst) == 0 {
		return Success
	}
	return int(C.gpumem_memcpy_dtoh(unsafe.Pointer(&dst[0]), C.uint64_t(src), C.uint64_t(len(dst))))
}

// MemcpyHtoD copies src to device address dst (cuMemcpyHtoD).
func MemcpyHtoD(dst uint64, src []byte) int {
	if len(src) == 0 {
		return Success
	}
	return int(C.gpumem_memcpy_htod(C.uint64_t(dst), unsafe.Pointer(&src[0]), C.uint64_t(len(src))))
}

// DefaultMemPool returns device dev's default memory pool, a CUmemoryPool
// (cuDeviceGetDefaultMemPool).
func DefaultMemPool(dev int) (uintptr, int) {
	var p C.uintptr_t
	r := C.gpumem_default_mem_pool(C.int(dev), &p)
	return uintptr(p), int(r)
}

// AllocAsync allocates size bytes from pool in the order of stream, a
// CUstream (cuMemAllocFromPoolAsync).
func AllocAsync(size uint64, pool, stream uintptr) (uint64, int) {
	var p C.uint64_t
	r := C.gpumem_alloc_async(C.uint64_t(size), C.uintptr_t(pool), C.uintptr_t(stream), &p)
	return uint64(p), int(r)
}

// FreeAsync frees p in the order of stream (cuMemFreeAsync).
func FreeAsync(p uint64, stream uintptr) int {
	return int(C.gpumem_free_async(C.uint64_t(p), C.uintptr_t(stream)))
}

// PoolSetAttribute sets a 64-bit attribute of pool (cuMemPoolSetAttribute).
func PoolSetAttribute(pool uintptr, attr int, v uint64) int {
	return int(C.gpumem_pool_set(C.uintptr_t(pool), C.int(attr), C.uint64_t(v)))
}

// PoolGetAttribute reads a 64-bit attribute of pool (cuMemPoolGetAttribute).
func PoolGetAttribute(pool uintptr, attr int) (uint64, int) {
	var v C.uint64_t
	r := C.gpumem_pool_get(C.uintptr_t(pool), C.int(attr), &v)
	return uint64(v), int(r)
}

// PoolTrimTo releases pool's unused memory down to keep bytes
// (cuMemPoolTrimTo).
func PoolTrimTo(pool uintptr, keep uint64) int {
	return int(C.gpumem_pool_trim(C.uintptr_t(pool), C.uint64_t(keep)))
}
