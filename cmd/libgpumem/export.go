//go:build cuda

// export.go: the C functions. Each converts its arguments, runs the call
// in package capi (which recovers panics into errors), and turns an error
// into its C result and the calling thread's last error. The conversions
// here cannot panic; the deferred recover of the functions off the hot
// path guards the rest (copying into the caller's buffer).

package main

/*
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#ifndef __DRIVER_TYPES_H__
typedef struct CUstream_st *cudaStream_t;
#endif
*/
import "C"

import (
	"sync"
	"syscall"
	"unsafe"

	"github.com/gpumem/gpumem/cmd/libgpumem/internal/capi"
	"github.com/gpumem/gpumem/device/cuda"
)

// lib is the library's state, configured once at load.
var lib = func() *capi.Lib {
	conf, err := capi.ConfFromEnv()
	return capi.New(func(ordinal int) (capi.Device, error) { return cuda.Open(ordinal) }, conf, err)
}()

// lastErrors holds the last error text of each OS thread that had one,
// by thread id (a C thread runs its calls into Go on itself).
var lastErrors sync.Map // int (thread id) -> string

// maxErrorThreads bounds lastErrors: past it, the texts of other threads
// are dropped.
const maxErrorThreads = 4096

var errorThreads int64 // entries in lastErrors, approximately; guarded by errorThreadsMu
var errorThreadsMu sync.Mutex

func setLastError(err error) {
	tid := syscall.Gettid()
	if _, loaded := lastErrors.Swap(tid, err.Error()); !loaded {
		errorThreadsMu.Lock()
		errorThreads++
		if errorThreads > maxErrorThreads {
			lastErrors.Range(func(k, _ any) bool {
				if k != tid {
					lastErrors.Delete(k)
				}
				return true
			})
			errorThreads = 1
		}
		errorThreadsMu.Unlock()
	}
}

// fail records a recovered panic, if any, as the last error and reports
// whether there was one.
func fail(r any) bool {
	if r == nil {
		return false
	}
	setLastError(capi.Recovered(r))
	return true
}

// addrPointer returns a device address as a C pointer. It is never
// dereferenced by the host, and it is not Go memory, so the collector
// ignores it. (The conversion goes through memory, as a direct uintptr to
// unsafe.Pointer conversion of an integer is reserved for real pointers;
// calling C to convert would cost a Go-to-C crossing per malloc.)
func addrPointer(addr uintptr) unsafe.Pointer {
	return *(*unsafe.Pointer)(unsafe.Pointer(&addr))
}

// buffer is the Go view of a C buffer of capacity cap (nil when empty).
func buffer(buf *C.char, cap C.size_t) []byte {
	if buf == nil || cap == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(buf)), capi.CapBuffer(uint64(cap)))
}

//export gpumem_malloc
func gpumem_malloc(size C.ssize_t, device C.int, stream C.cudaStream_t) unsafe.Pointer {
	// No recover here: capi's Malloc recovers, and what is left cannot
	// panic (a deferred recover would cost the hot path 60 instructions).
	addr, err := lib.Malloc(int64(size), int(device), uintptr(unsafe.Pointer(stream)))
	if err != nil {
		setLastError(err)
		return nil
	}
	return addrPointer(addr)
}

//export gpumem_free
func gpumem_free(ptr unsafe.Pointer, size C.ssize_t, device C.int, stream C.cudaStream_t) {
	// No recover here, as in gpumem_malloc.
	if err := lib.Free(uintptr(ptr), int64(size), int(device), uintptr(unsafe.Pointer(stream))); err != nil {
		setLastError(err)
	}
}

//export gpumem_empty_cache
func gpumem_empty_cache(device C.int) (rc C.int) {
	defer func() {
		if fail(recover()) {
			rc = -1
		}
	}()
	if err := lib.EmptyCache(int(device)); err != nil {
		setLastError(err)
		return -1
	}
	return 0
}

//export gpumem_record_stream
func gpumem_record_stream(ptr unsafe.Pointer, device C.int, stream C.cudaStream_t) (rc C.int) {
	defer func() {
		if fail(recover()) {
			rc = -1
		}
	}()
	if err := lib.RecordStream(uintptr(ptr), int(device), uintptr(unsafe.Pointer(stream))); err != nil {
		setLastError(err)
		return -1
	}
	return 0
}

//export gpumem_memory_stats_json
func gpumem_memory_stats_json(device C.int, buf *C.char, cap C.size_t) C.size_t {
	return copyText(buf, cap, func() ([]byte, error) { return lib.StatsJSON(int(device)) })
}

// copyText copies what text returns into buf, snprintf-style (the
// length it needs, the text cut to fit cap with a NUL), for the exports
// that return text: 0 on an error, which gpumem_last_error then gives.
func copyText(buf *C.char, cap C.size_t, text func() ([]byte, error)) (n C.size_t) {
	defer func() {
		if fail(recover()) {
			n = 0
		}
	}()
	b, err := text()
	if err != nil {
		setLastError(err)
		return 0
	}
	return C.size_t(capi.CopyOut(buffer(buf, cap), b))
}

//export gpumem_mark_step
func gpumem_mark_step(device C.int, name *C.char) (rc C.int) {
	defer func() {
		if fail(recover()) {
			rc = -1
		}
	}()
	var n string
	if name != nil {
		n = C.GoString(name)
	}
	if err := lib.MarkStep(int(device), n); err != nil {
		setLastError(err)
		return -1
	}
	return 0
}

//export gpumem_plan_stats_json
func gpumem_plan_stats_json(device C.int, buf *C.char, cap C.size_t) C.size_t {
	return copyText(buf, cap, func() ([]byte, error) { return lib.PlanStatsJSON(int(device)) })
}

//export gpumem_memory_summary
func gpumem_memory_summary(device C.int, abbreviated C.int, buf *C.char, cap C.size_t) C.size_t {
	return copyText(buf, cap, func() ([]byte, error) {
		s, err := lib.Summary(int(device), abbreviated != 0)
		return []byte(s), err
	})
}

//export gpumem_last_error
func gpumem_last_error(buf *C.char, cap C.size_t) (n C.size_t) {
	defer func() {
		if recover() != nil {
			n = 0
		}
	}()
	v, ok := lastErrors.Load(syscall.Gettid())
	if !ok {
		return C.size_t(capi.CopyOut(buffer(buf, cap), nil))
	}
	return C.size_t(capi.CopyOut(buffer(buf, cap), []byte(v.(string))))
}
