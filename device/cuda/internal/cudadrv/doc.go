//go:build cuda

// Package cudadrv holds the small cgo shims that the CUDA backend
// (device/cuda) needs beyond what gorgonia.org/cu binds: the driver's
// virtual memory management calls (cuMemGetAllocationGranularity,
// cuMemAddressReserve, cuMemCreate, cuMemMap, cuMemSetAccess, cuMemUnmap,
// cuMemRelease, cuMemAddressFree), pinned host allocation (cuMemHostAlloc),
// the driver's own error names and texts (cuGetErrorName, cuGetErrorString),
// and the probe behind device/cuda.Available.
//
// # Calls
//
// Every function here is a thin call into the driver that returns the raw
// CUresult as an int (0 is CUDA_SUCCESS). Mapping codes to errors, checking
// arguments and making the right context current are the caller's job
// (device/cuda does all three); nothing here keeps state except the probe.
//
// # The probe and cuInit
//
// gorgonia.org/cu calls cuInit from its package init and, when that fails
// (no GPU, no usable driver), prints a message and exits the process. A
// program built with the cuda tag could then never report "no GPU" itself.
// This package defines a C function named cuInit (interpose.c). The static
// linker resolves every cuInit reference in the program (cu's included) to
// it, and it forwards to the driver's cuInit, found with
// dlsym(RTLD_NEXT, "cuInit"). It remembers the result of the first call, and
// while masking is on (from process start until device/cuda's package init
// calls EndInitMasking) it reports success to the caller even when the
// driver failed, so cu's init does not exit. Later calls, and every other
// driver call, see the driver's true answers; a failed cuInit leaves the
// driver uninitialized, so they fail with CUDA_ERROR_NOT_INITIALIZED rather
// than touching a device. This works whatever order the packages are
// initialized in, because the interposer itself records the first result.
//
// What the probe cannot do: a program built with the cuda tag links
// libcuda.so.1 by name (DT_NEEDED), so when no such library can be loaded
// the dynamic loader refuses to start the program before any Go code runs.
// Only a build without the tag avoids that; no code in the process can
// catch it.
//
// # Locking
//
// The package holds no locks. The probe state is written by the first
// cuInit call (during package initialization, on one goroutine) and only
// read afterwards; masking is a C int written once by EndInitMasking, also
// during package initialization.
package cudadrv
