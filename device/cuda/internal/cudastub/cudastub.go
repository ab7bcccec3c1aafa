//go:build cuda

// Package cudastub drives the stub CUDA driver (csrc/libcuda_stub.c) from
// Go tests of the CUDA backend.
//
// # Model
//
// The stub is a shared library named libcuda.so.1 that fakes the driver
// calls the backend makes; scripts/ci-cuda.sh builds it and loads it in
// place of the real driver through LD_LIBRARY_PATH. Besides the driver
// functions it exports control functions (prefix cudastub_). This package
// finds them at run time with dlsym, so a test binary links against the real
// libcuda.so (which has no such functions) and still runs with either
// library: Loaded reports whether the library in the process is the stub,
// and every other function does nothing (or returns zero) when it is not.
// Tests of the Go glue skip unless Loaded; tests that need a GPU skip when
// it is.
//
// cgo cannot be used in _test.go files, which is why these controls live in
// a package of their own, imported only by tests.
//
// # Concurrency
//
// The stub guards its state with one mutex, so these functions may be
// called from any goroutine. Symbols are looked up once.
package cudastub

/*
#cgo LDFLAGS: -ldl
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdlib.h>

static void *sym(const char *name) { return dlsym(RTLD_DEFAULT, name); }

static void call_v(void *f) { ((void (*)(void))f)(); }
static void call_vi(void *f, int a) { ((void (*)(int))f)(a); }
static void call_vu64(void *f, uint64_t a) { ((void (*)(uint64_t))f)(a); }
static int call_i(void *f) { return ((int (*)(void))f)(); }
static long call_l(void *f) { return ((long (*)(void))f)(); }
static uint64_t call_u64(void *f) { return ((uint64_t (*)(void))f)(); }
static long call_ls(void *f, const char *s) { return ((long (*)(const char *))f)(s); }
static int call_fail(void *f, const char *s, int code, int skip, int count) {
	return ((int (*)(const char *, int, int, int))f)(s, code, skip, count);
}
*/
import "C"

import (
	"sync"
	"unsafe"
)

var syms struct {
	once                                                    sync.Once
	reset, setCapacity, setDevices, setVMM, fail, calls     unsafe.Pointer
	threads, invalidate, contextFailures, timedEvents, hold unsafe.Pointer
	complete, live, used, unboundMalloc, setPools           unsafe.Pointer
}

func lookup(name string) unsafe.Pointer {
	cs := C.CString(name)
	defer C.free(unsafe.Pointer(cs))
	return C.sym(cs)
}

func load() {
	syms.once.Do(func() {
		syms.reset = lookup("cudastub_reset")
		syms.setCapacity = lookup("cudastub_set_capacity")
		syms.setDevices = lookup("cudastub_set_devices")
		syms.setVMM = lookup("cudastub_set_vmm")
		syms.setPools = lookup("cudastub_set_pools")
		syms.fail = lookup("cudastub_fail")
		syms.calls = lookup("cudastub_calls")
		syms.threads = lookup("cudastub_threads")
		syms.invalidate = lookup("cudastub_invalidate_contexts")
		syms.contextFailures = lookup("cudastub_context_failures")
		syms.timedEvents = lookup("cudastub_timed_events")
		syms.hold = lookup("cudastub_hold_events")
		syms.complete = lookup("cudastub_complete_events")
		syms.live = lookup("cudastub_live")
		syms.used = lookup("cudastub_used")
		syms.unboundMalloc = lookup("cudastub_unbound_malloc")
	})
}

// Loaded reports whether the CUDA driver library in this process is the
// stub (all its control functions are present).
func Loaded() bool {
	load()
	for _, p := range []unsafe.Pointer{syms.reset, syms.setCapacity, syms.setDevices, syms.setVMM,
		syms.fail, syms.calls, syms.threads, syms.invalidate, syms.contextFailures, syms.timedEvents,
		syms.hold, syms.complete, syms.live, syms.used, syms.unboundMalloc, syms.setPools} {
		if p == nil {
			return false
		}
	}
	return true
}

// Reset forgets every allocation, stream, event, mapping, injected error
// and counter of the stub and restores its defaults: one device of 8 GiB
// with virtual memory support, events that complete at once.
func Reset() {
	if Loaded() {
		C.call_v(syms.reset)
	}
}

// SetCapacity sets the fake device memory size in bytes (cuDeviceTotalMem,
// cuMemGetInfo, and the limit of cuMemAlloc and cuMemCreate).
func SetCapacity(bytes uint64) {
	if Loaded() {
		C.call_vu64(syms.setCapacity, C.uint64_t(bytes))
	}
}

// SetDevices sets the number of fake devices (0 to 8).
func SetDevices(n int) {
	if Loaded() {
		C.call_vi(syms.setDevices, C.int(n))
	}
}

// SetVirtualMemory sets whether the devices report virtual memory
// management support.
func SetVirtualMemory(supported bool) {
	if Loaded() {
		v := 0
		if supported {
			v = 1
		}
		C.call_vi(syms.setVMM, C.int(v))
	}
}

// SetMemoryPools sets whether the devices report memory pool support
// (CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED); without it
// cuDeviceGetDefaultMemPool fails with CUDA_ERROR_NOT_SUPPORTED.
func SetMemoryPools(supported bool) {
	if Loaded() {
		v := 0
		if supported {
			v = 1
		}
		C.call_vi(syms.setPools, C.int(v))
	}
}

// Fail makes calls skip+1 to skip+count of the driver function fn (its
// unversioned name, such as "cuMemAlloc") return code without any other
// effect. It reports false if the stub's table of injections is full or
// the stub is not loaded.
func Fail(fn string, code, skip, count int) bool {
	if !Loaded() {
		return false
	}
	cs := C.CString(fn)
	defer C.free(unsafe.Pointer(cs))
	return C.call_fail(syms.fail, cs, C.int(code), C.int(skip), C.int(count)) == 0
}

// FailNext makes the next call of fn return code.
func FailNext(fn string, code int) bool { return Fail(fn, code, 0, 1) }

// Calls returns how many times fn was called since the last Reset.
func Calls(fn string) int {
	if !Loaded() {
		return 0
	}
	cs := C.CString(fn)
	defer C.free(unsafe.Pointer(cs))
	return int(C.call_ls(syms.calls, cs))
}

// Threads returns how many distinct OS threads made driver calls since the
// last Reset.
func Threads() int {
	if !Loaded() {
		return 0
	}
	return int(C.call_i(syms.threads))
}

// InvalidateContexts makes every thread's current context stale: from now
// on a call that needs a context fails with CUDA_ERROR_INVALID_CONTEXT
// unless its thread set or pushed one since.
func InvalidateContexts() {
	if Loaded() {
		C.call_v(syms.invalidate)
	}
}

// ContextFailures counts the calls refused since the last Reset because no
// valid context was current on the calling thread.
func ContextFailures() int {
	if !Loaded() {
		return 0
	}
	return int(C.call_l(syms.contextFailures))
}

// TimedEvents counts the events created since the last Reset without
// CU_EVENT_DISABLE_TIMING.
func TimedEvents() int {
	if !Loaded() {
		return 0
	}
	return int(C.call_l(syms.timedEvents))
}

// HoldEvents makes recorded events stay not ready (on) until a synchronize
// or CompleteEvents, or complete at once (off, the default).
func HoldEvents(on bool) {
	if Loaded() {
		v := 0
		if on {
			v = 1
		}
		C.call_vi(syms.hold, C.int(v))
	}
}

// CompleteEvents marks every recorded event done.
func CompleteEvents() {
	if Loaded() {
		C.call_v(syms.complete)
	}
}

// Live counts the stub's live objects of a kind: "mem", "stream", "event",
// "host", "reservation", "handle", "mapping", "wait" (waits on held events
// that synchronizing the waiting stream has not passed yet) or "context"
// (contexts made with cuCtxCreate and not destroyed); -1 for an unknown
// kind.
func Live(kind string) int {
	if !Loaded() {
		return 0
	}
	cs := C.CString(kind)
	defer C.free(unsafe.Pointer(cs))
	return int(C.call_ls(syms.live, cs))
}

// Used returns the bytes of fake device memory in use (cuMemAlloc plus
// cuMemCreate).
func Used() uint64 {
	if !Loaded() {
		return 0
	}
	return uint64(C.call_u64(syms.used))
}

// UnboundMalloc calls cuMemAlloc on a new OS thread that never made a
// context current and returns the CUresult; with the stub it is
// CUDA_ERROR_INVALID_CONTEXT (201), which shows that the stub checks
// contexts per thread.
func UnboundMalloc() int {
	if !Loaded() {
		return -1
	}
	return int(C.call_i(syms.unboundMalloc))
}
