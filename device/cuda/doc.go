//go:build cuda

// Package cuda is gpumem's CUDA backend: a device.Device on the CUDA driver
// API through gorgonia.org/cu, with the virtual memory (device.VirtualMemory),
// pinned host memory (device.HostMemory), stream checking
// (device.StreamChecker), stream waits (device.StreamWaiter: WaitEvent and
// WaitStream, both cuStreamWaitEvent), copy (device.Copier, cuMemcpyDtoH /
// cuMemcpyHtoD) and stream-ordered memory (device.StreamOrderedMemory, the
// device's default memory pool) capabilities.
//
//	dev, err := cuda.Open(0)
//	if err != nil { ... }
//	defer dev.Close()
//	p, err := dev.Malloc(1 << 20) // cuMemAlloc
//
// # Build tag
//
// Every file of this package carries the build tag cuda, and no other
// package of gpumem imports it: a program gets the backend only when built
// with -tags cuda, and then needs cgo, the CUDA headers (cuda.h) at build
// time, and libcuda.so at link time (set CGO_CFLAGS=-I<dir of cuda.h> and
// CGO_LDFLAGS=-L<dir of libcuda.so> when they are not in the default
// places). The binary records libcuda.so.1 by name (DT_NEEDED), so it runs
// wherever the NVIDIA driver is installed.
//
// # gorgonia.org/cu's init, and Available
//
// gorgonia.org/cu calls cuInit from its package init and, when that fails
// (no GPU, no driver), prints a message and exits the process. That is why
// the backend is opt-in by build tag. Within a cuda build, the package
// device/cuda/internal/cudadrv interposes cuInit: cu's call reaches the
// driver through it, the first result is remembered, and a failure is
// hidden from cu's init only, so the process goes on. Available and
// DeviceCount then report the driver's answer (ErrNoDevice with the
// driver's code and text), and Open fails with the same error instead of
// the process dying. What cannot be helped: when libcuda.so.1 itself is
// missing, the dynamic loader refuses to start the program before any Go
// code runs.
//
// # Contexts
//
// The driver keeps a current context per OS thread, and goroutines move
// between threads. A Device retains its device's primary context (the one
// the CUDA runtime and most libraries share) and makes every driver call
// with it current: the call locks its goroutine to the OS thread, pushes
// the context (cuCtxPushCurrent), calls, and pops it (cuCtxPopCurrent), so
// the thread's previous context, if any, is left as it was. Calls from any
// number of goroutines are therefore safe; no goroutine needs to lock
// itself to a thread or set a context beforehand.
//
// # A runtime's own context and streams
//
// OpenContext opens a device on a context the caller made instead of the
// primary context, and never releases it. AdoptStream (a cu.Stream) and
// AdoptStreamHandle (a raw CUstream as uintptr) put a stream the caller
// launches on into the stream table: gpumem records events on it and makes
// it wait, and neither Close nor ReleaseStream destroys it; ReleaseStream
// forgets it. StreamHandle and DriverStream give back the driver stream
// behind any device.Stream, to launch kernels on, and DevicePtr converts a
// device.Ptr to a cu.DevicePtr. The legacy default stream is
// device.DefaultStream (the NULL stream; adopting 0 or StreamLegacy gives
// it); the per-thread default stream is adopted from StreamPerThread.
//
// # Handle tables
//
// device.Stream and device.Event are integers. A Device keeps tables from
// those integers to the driver's CUstream and CUevent, so a caller never
// holds a driver pointer: an unknown, foreign or released handle gets
// device.ErrInvalidStream or device.ErrInvalidEvent, never reaches the
// driver and cannot crash it. device.DefaultStream is the legacy default
// stream. NewStream creates non-blocking streams. RecordEvent creates an
// event without timing (CU_EVENT_DISABLE_TIMING) and records it; EventDone
// maps CUDA_ERROR_NOT_READY to false; ReleaseEvent destroys the event and
// forgets the handle. Malloc results, reservations, mapped pages and pinned
// host allocations are tracked the same way, so Free of an address Malloc
// did not return, a double free, or an unmap of unmapped pages fails with
// a clear error before the driver sees it.
//
// Stream waits: WaitEvent is cuStreamWaitEvent on the event's driver
// event. WaitStream(s, t) needs no event from the caller: the Device keeps
// one event of its own outside the table, created without timing on the
// first WaitStream and destroyed by Close, records it on t and makes s
// wait on it. CUDA's wait is for the record most recent at the time of the
// call, so the one event serves every call; a lock of its own keeps the
// record and the wait of one call together. WaitStream of a stream on
// itself makes no driver call.
//
// Virtual memory: Map creates one physical allocation (cuMemCreate) per
// granularity page and maps it, then grants read-write access to the whole
// range; Unmap unmaps and releases page by page. Any page-aligned sub-range
// can thus be unmapped, whatever ranges were mapped together, at the cost
// of one driver call pair per page.
//
// Copies (CopyToHost, CopyFromHost) are synchronous cuMemcpyDtoH /
// cuMemcpyHtoD with the device's context current; the range must lie in a
// Malloc allocation, a pool block or mapped pages this Device handed out.
//
// Stream-ordered memory: when the device reports
// CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED, Open takes its default
// memory pool (cuDeviceGetDefaultMemPool); MallocAsync and FreeAsync are
// cuMemAllocFromPoolAsync and cuMemFreeAsync on the stream's driver
// stream, SetReleaseThreshold sets CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
// TrimPool is cuMemPoolTrimTo, PoolUsage reads the RESERVED_MEM and
// USED_MEM attributes (current and high) and ResetPoolPeaks sets the high
// ones to 0. Like virtual memory, the methods exist whatever the device:
// without pool support (MemoryPoolsSupported false) they fail with
// device.ErrNotSupported and never reach the driver.
//
// # Errors
//
// Every error is a *device.Error whose Err is a sentinel to test with
// errors.Is, and whose Code and Message keep the driver's CUresult and its
// text (cuGetErrorName: cuGetErrorString) when the driver failed:
//
//	CUDA_ERROR_OUT_OF_MEMORY                   device.ErrOutOfMemory
//	CUDA_ERROR_INVALID_VALUE, _INVALID_HANDLE  by argument: device.ErrInvalidSize (sizes),
//	                                           ErrInvalidPointer (frees), ErrInvalidStream,
//	                                           ErrInvalidEvent, else ErrInvalidArgument
//	CUDA_ERROR_NOT_SUPPORTED, _NOT_PERMITTED   device.ErrNotSupported
//	CUDA_ERROR_NO_DEVICE, _INVALID_DEVICE,
//	_NOT_INITIALIZED, _DEINITIALIZED           ErrNoDevice
//	anything else                              ErrDriver
//
// Calls after Close fail with ErrClosed. A failed call changes nothing the
// caller can see, with two exceptions: Unmap reports how far it got, and if
// popping the context fails after a successful driver call (only possible
// when something else corrupted the thread's context stack), the pop's
// error is returned and what the driver call made is not undone.
//
// # Locks
//
// Device.life is read-held by every call for its whole duration and
// write-held by Close. Under it, each table has its own lock (memMu,
// streamMu, eventMu, vmMu, hostMu), and WaitStream's event has waitMu;
// streamMu is taken before eventMu and before waitMu. The stream and event
// table locks are read-held across the driver call that uses the handle,
// so a handle cannot be destroyed under a call; vmMu is held across Map
// and Unmap, and waitMu across WaitStream's record and wait.
//
// # Tests
//
// Two kinds of tests live here, both with the cuda tag. The stub tests
// check the Go glue without a GPU: scripts/ci-cuda.sh builds
// device/cuda/internal/cudastub/csrc/libcuda_stub.c, a stub of the driver
// functions this package calls, as libcuda.so.1 and runs
//
//	LD_LIBRARY_PATH=<stub dir> go test -tags cuda ./device/cuda/...
//
// The stub fakes memory with a capacity, streams, events, the virtual
// memory calls and a per-thread current context that it checks on every
// call; tests inject driver error codes through
// device/cuda/internal/cudastub. They skip when the loaded libcuda is not
// the stub. The GPU tests (gpu_test.go, allocator_gpu_test.go) skip unless
// a real device is present; on a machine with a GPU run
// scripts/gpu-check.sh, which can also build the test binaries on one
// machine (scripts/gpu-check.sh build DIR) and run them on another that has
// the driver but no Go toolchain (scripts/gpu-check.sh run DIR).
package cuda
