//go:build cuda

// adopt.go: a runtime's own context and streams. OpenContext opens a
// device on a context the caller made; AdoptStream and AdoptStreamHandle
// take a driver stream the caller launches on into the stream table;
// StreamHandle, DriverStream and DevicePtr hand the driver's handles back.

package cuda

import (
	"runtime"
	"unsafe"

	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/device/cuda/internal/cudadrv"
	"gorgonia.org/cu"
)

// The driver's special stream handles, as cuda.h defines them. Adopting
// either expresses a default stream: StreamLegacy (and 0, the NULL stream,
// which the driver API takes as the legacy default stream) adopts as
// device.DefaultStream; StreamPerThread adopts as a stream of its own.
const (
	// StreamLegacy is CU_STREAM_LEGACY: the legacy default stream, which
	// synchronizes with every blocking stream of the context.
	StreamLegacy uintptr = 0x1
	// StreamPerThread is CU_STREAM_PER_THREAD: the default stream of the
	// calling OS thread. The driver resolves it on every call, so it names
	// one stream only for calls made from one thread. A C thread calling
	// into Go (libgpumem) stays on its thread for the call; a goroutine
	// moves between threads, so Go code should adopt a stream it made
	// rather than the per-thread one.
	StreamPerThread uintptr = 0x2
)

// OpenContext opens the device of ctx, a context the caller made
// (cuCtxCreate) or retained, and makes every driver call with ctx current
// instead of the device's primary context. Streams and memory are then the
// caller's context's: a runtime that launches its kernels in ctx can share
// them with gpumem. The Device never destroys or releases ctx; the caller
// keeps it alive until Close has returned.
func OpenContext(ctx cu.CUContext) (*Device, error) {
	if ctx == (cu.CUContext{}) {
		return nil, usageError("open context", -1, device.ErrInvalidArgument, "the context is nil")
	}
	if _, err := DeviceCount(); err != nil {
		return nil, err
	}
	var dev cu.Device
	c := func() int {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if c := codeOf(cu.PushCurrentCtx(ctx)); c != cudadrv.Success {
			return c
		}
		var err error
		dev, err = cu.CurrentDevice()
		c := codeOf(err)
		if _, err := cu.PopCurrentCtx(); c == cudadrv.Success {
			c = codeOf(err)
		}
		return c
	}()
	if c != cudadrv.Success {
		return nil, driverError("open context", -1, c, subjectNone)
	}
	return open(int(dev), &ctx)
}

// Context returns the driver context the device's calls run in: the
// primary context (Open) or the caller's (OpenContext).
func (d *Device) Context() cu.CUContext { return d.ctx }

// OwnsContext reports whether the Device retained its context (the primary
// context, released by Close) rather than being given it (OpenContext).
func (d *Device) OwnsContext() bool { return d.primary }

// AdoptStream adopts the driver stream s, made by the caller in the
// device's context, as a device.Stream: gpumem records events on it and
// makes it wait for events, and never destroys it. See AdoptStreamHandle.
func (d *Device) AdoptStream(s cu.Stream) (device.Stream, error) {
	return d.AdoptStreamHandle(uintptr(unsafe.Pointer(s.C())))
}

// AdoptStreamHandle adopts a raw CUstream (or cudaStream_t, the same
// pointer) as a device.Stream. 0 and StreamLegacy give
// device.DefaultStream, which is always valid; StreamPerThread and every
// other handle get a handle of their own, which HasStream accepts until
// ReleaseStream. Adopting a handle already adopted returns the same
// device.Stream. The driver is asked once whether the handle is a stream
// (cuStreamQuery); a handle it rejects fails with device.ErrInvalidStream.
// The stream must belong to the device's context and outlive its adoption.
func (d *Device) AdoptStreamHandle(h uintptr) (device.Stream, error) {
	if h == 0 || h == StreamLegacy {
		return device.DefaultStream, nil
	}
	if err := d.enter("adopt stream"); err != nil {
		return 0, err
	}
	defer d.life.RUnlock()
	d.streamMu.RLock()
	s, ok := d.adopted[h]
	d.streamMu.RUnlock()
	if ok {
		return s, nil
	}
	cs := streamOf(h)
	c := d.call(func() int {
		if c := codeOf(cs.Query()); c != cudadrv.ErrNotReady {
			return c
		}
		return cudadrv.Success
	})
	if c != cudadrv.Success {
		return 0, driverError("adopt stream", d.ordinal, c, subjectStream)
	}
	d.streamMu.Lock()
	defer d.streamMu.Unlock()
	if s, ok := d.adopted[h]; ok { // adopted by a concurrent call meanwhile
		return s, nil
	}
	d.nextStream++
	s = device.Stream(uint64(d.ordinal)<<32) | d.nextStream
	d.streams[s] = streamEntry{cs: cs, adopted: true}
	d.adopted[h] = s
	return s, nil
}

// ReleaseStream forgets an adopted stream: the handle becomes invalid and
// the driver stream is left to its owner, undestroyed. Release a stream
// only once nothing of gpumem uses it any more (for a caching allocator:
// no live block was allocated or recorded on it, and its cache was
// emptied), since events can no longer be recorded on it. Releasing
// device.DefaultStream does nothing; a stream made by NewStream, or a
// handle not in the table, fails with device.ErrInvalidStream.
func (d *Device) ReleaseStream(s device.Stream) error {
	if s == device.DefaultStream {
		return nil
	}
	if err := d.enter("release stream"); err != nil {
		return err
	}
	defer d.life.RUnlock()
	d.streamMu.Lock()
	defer d.streamMu.Unlock()
	e, ok := d.streams[s]
	if !ok || !e.adopted {
		why := "it was not adopted by this device, or was released"
		if ok {
			why = "it was made by NewStream and lives until Close"
		}
		return usageError("release stream", d.ordinal, device.ErrInvalidStream, "stream %d: %s", uint64(s), why)
	}
	delete(d.streams, s)
	delete(d.adopted, handleOf(e.cs))
	return nil
}

// StreamHandle returns the raw CUstream behind s, to launch kernels on:
// 0 (the NULL stream, the legacy default stream) for device.DefaultStream.
// An unknown or released handle fails with device.ErrInvalidStream.
func (d *Device) StreamHandle(s device.Stream) (uintptr, error) {
	cs, err := d.DriverStream(s)
	if err != nil {
		return 0, err
	}
	return handleOf(cs), nil
}

// DriverStream returns the driver stream behind s as a cu.Stream (see
// StreamHandle). Streams made by NewStream stay the Device's: the caller
// launches on them but never destroys them.
func (d *Device) DriverStream(s device.Stream) (cu.Stream, error) {
	if s == device.DefaultStream {
		return cu.NoStream, nil
	}
	d.streamMu.RLock()
	defer d.streamMu.RUnlock()
	return d.streamLocked("driver stream", s)
}

// DevicePtr returns p as the driver's device pointer, to pass to kernels
// and cu's memory functions. Device pointers are device addresses, so the
// conversion is exact both ways (PtrOf).
func DevicePtr(p device.Ptr) cu.DevicePtr { return cu.DevicePtr(p) }

// PtrOf returns a driver device pointer as a device.Ptr.
func PtrOf(p cu.DevicePtr) device.Ptr { return device.Ptr(p) }

// A cu.Stream is one CUstream pointer; streamOf and handleOf convert it
// from and to the raw handle. The compile-time check below fails the build
// if cu ever changes the layout.
var _ [unsafe.Sizeof(cu.Stream{}) - unsafe.Sizeof(uintptr(0))]struct{}
var _ [unsafe.Sizeof(uintptr(0)) - unsafe.Sizeof(cu.Stream{})]struct{}

func streamOf(h uintptr) cu.Stream { return *(*cu.Stream)(unsafe.Pointer(&h)) }

func handleOf(s cu.Stream) uintptr { return uintptr(unsafe.Pointer(s.C())) }
