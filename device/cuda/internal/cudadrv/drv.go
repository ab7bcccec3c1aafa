//go:build cuda

// drv.go: the cgo calls into the driver that gorgonia.org/cu lacks: the
// probe's state, device attributes, virtual memory management, pinned host
// memory and the driver's error texts.

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
