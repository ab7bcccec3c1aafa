// Package intercept is the forwarding core of the device adaptors
// (device/counting, device/faulty): a device.Device that passes every
// fallible call (each device.Call) to a hook before it reaches the wrapped
// device and after it returns, and forwards everything else untouched.
//
// New hands out the wrapper through device.WithCapabilitiesOf, so it
// offers exactly the capabilities of the device it wraps; the capability
// methods below are therefore only ever reached when the wrapped device
// has them.
package intercept

import "github.com/gpumem/gpumem/device"

// Hooks observe and may refuse calls.
type Hooks interface {
	// Before runs before a call of kind c reaches the wrapped device; size
	// is the byte count the call carries (Malloc, Reserve, Map, Unmap,
	// HostAlloc and MallocAsync sizes, HostFree's slice length, the length
	// of a copy's host buffer; 0 for the others, including the byte counts
	// SetReleaseThreshold and TrimPool take, which are limits, not bytes
	// moved). A
	// non-nil error fails the call with that error, and the wrapped device
	// is not called.
	Before(c device.Call, size uint64) error
	// After runs once the wrapped device has returned err from a call that
	// Before let through.
	After(c device.Call, size uint64, err error)
}

// wrapper forwards to inner and its capabilities, through h.
type wrapper struct {
	inner device.Device
	caps  device.Capabilities
	h     Hooks
}

// New returns inner wrapped so that h sees every fallible call, with
// exactly inner's capabilities; nil if inner or h is nil.
func New(inner device.Device, h Hooks) device.Device {
	if inner == nil || h == nil {
		return nil
	}
	w := &wrapper{inner: inner, caps: device.CapabilitiesOf(inner), h: h}
	return device.WithCapabilitiesOf(w, inner)
}

func (w *wrapper) Ordinal() int { return w.inner.Ordinal() }
func (w *wrapper) Name() string { return w.inner.Name() }

func (w *wrapper) Malloc(size uint64) (device.Ptr, error) {
	if err := w.h.Before(device.CallMalloc, size); err != nil {
		return 0, err
	}
	p, err := w.inner.Malloc(size)
	w.h.After(device.CallMalloc, size, err)
	return p, err
}

func (w *wrapper) Free(p device.Ptr) error {
	if err := w.h.Before(device.CallFree, 0); err != nil {
		return err
	}
	err := w.inner.Free(p)
	w.h.After(device.CallFree, 0, err)
	return err
}

func (w *wrapper) MemInfo() (free, total uint64, err error) {
	if err := w.h.Before(device.CallMemInfo, 0); err != nil {
		return 0, 0, err
	}
	free, total, err = w.inner.MemInfo()
	w.h.After(device.CallMemInfo, 0, err)
	return free, total, err
}

func (w *wrapper) Synchronize() error {
	if err := w.h.Before(device.CallSynchronize, 0); err != nil {
		return err
	}
	err := w.inner.Synchronize()
	w.h.After(device.CallSynchronize, 0, err)
	return err
}

func (w *wrapper) NewStream() (device.Stream, error) {
	if err := w.h.Before(device.CallNewStream, 0); err != nil {
		return 0, err
	}
	s, err := w.inner.NewStream()
	w.h.After(device.CallNewStream, 0, err)
	return s, err
}

func (w *wrapper) SynchronizeStream(s device.Stream) error {
	if err := w.h.Before(device.CallSynchronizeStream, 0); err != nil {
		return err
	}
	err := w.inner.SynchronizeStream(s)
	w.h.After(device.CallSynchronizeStream, 0, err)
	return err
}

func (w *wrapper) RecordEvent(s device.Stream) (device.Event, error) {
	if err := w.h.Before(device.CallRecordEvent, 0); err != nil {
		return 0, err
	}
	e, err := w.inner.RecordEvent(s)
	w.h.After(device.CallRecordEvent, 0, err)
	return e, err
}

func (w *wrapper) EventDone(e device.Event) (bool, error) {
	if err := w.h.Before(device.CallEventDone, 0); err != nil {
		return false, err
	}
	done, err := w.inner.EventDone(e)
	w.h.After(device.CallEventDone, 0, err)
	return done, err
}

func (w *wrapper) SynchronizeEvent(e device.Event) error {
	if err := w.h.Before(device.CallSynchronizeEvent, 0); err != nil {
		return err
	}
	err := w.inner.SynchronizeEvent(e)
	w.h.After(device.CallSynchronizeEvent, 0, err)
	return err
}

func (w *wrapper) ReleaseEvent(e device.Event) error {
	if err := w.h.Before(device.CallReleaseEvent, 0); err != nil {
		return err
	}
	err := w.inner.ReleaseEvent(e)
	w.h.After(device.CallReleaseEvent, 0, err)
	return err
}

// device.VirtualMemory

func (w *wrapper) Granularity() uint64 { return w.caps.VirtualMemory.Granularity() }

func (w *wrapper) Reserve(size uint64) (device.Ptr, error) {
	if err := w.h.Before(device.CallReserve, size); err != nil {
		return 0, err
	}
	p, err := w.caps.VirtualMemory.Reserve(size)
	w.h.After(device.CallReserve, size, err)
	return p, err
}

func (w *wrapper) Map(p device.Ptr, size uint64) error {
	if err := w.h.Before(device.CallMap, size); err != nil {
		return err
	}
	err := w.caps.VirtualMemory.Map(p, size)
	w.h.After(device.CallMap, size, err)
	return err
}

func (w *wrapper) Unmap(p device.Ptr, size uint64) error {
	if err := w.h.Before(device.CallUnmap, size); err != nil {
		return err
	}
	err := w.caps.VirtualMemory.Unmap(p, size)
	w.h.After(device.CallUnmap, size, err)
	return err
}

func (w *wrapper) Release(p device.Ptr) error {
	if err := w.h.Before(device.CallRelease, 0); err != nil {
		return err
	}
	err := w.caps.VirtualMemory.Release(p)
	w.h.After(device.CallRelease, 0, err)
	return err
}

// device.HostMemory

func (w *wrapper) HostAlloc(size uint64) ([]byte, error) {
	if err := w.h.Before(device.CallHostAlloc, size); err != nil {
		return nil, err
	}
	b, err := w.caps.HostMemory.HostAlloc(size)
	w.h.After(device.CallHostAlloc, size, err)
	return b, err
}

func (w *wrapper) HostFree(b []byte) error {
	size := uint64(len(b))
	if err := w.h.Before(device.CallHostFree, size); err != nil {
		return err
	}
	err := w.caps.HostMemory.HostFree(b)
	w.h.After(device.CallHostFree, size, err)
	return err
}

// device.StreamWaiter

func (w *wrapper) WaitEvent(s device.Stream, e device.Event) error {
	if err := w.h.Before(device.CallWaitEvent, 0); err != nil {
		return err
	}
	err := w.caps.StreamWaiter.WaitEvent(s, e)
	w.h.After(device.CallWaitEvent, 0, err)
	return err
}

func (w *wrapper) WaitStream(s, t device.Stream) error {
	if err := w.h.Before(device.CallWaitStream, 0); err != nil {
		return err
	}
	err := w.caps.StreamWaiter.WaitStream(s, t)
	w.h.After(device.CallWaitStream, 0, err)
	return err
}

// device.Copier

func (w *wrapper) CopyToHost(dst []byte, src device.Ptr) error {
	size := uint64(len(dst))
	if err := w.h.Before(device.CallCopyToHost, size); err != nil {
		return err
	}
	err := w.caps.Copier.CopyToHost(dst, src)
	w.h.After(device.CallCopyToHost, size, err)
	return err
}

func (w *wrapper) CopyFromHost(dst device.Ptr, src []byte) error {
	size := uint64(len(src))
	if err := w.h.Before(device.CallCopyFromHost, size); err != nil {
		return err
	}
	err := w.caps.Copier.CopyFromHost(dst, src)
	w.h.After(device.CallCopyFromHost, size, err)
	return err
}

// device.StreamOrderedMemory

func (w *wrapper) MallocAsync(size uint64, s device.Stream) (device.Ptr, error) {
	if err := w.h.Before(device.CallMallocAsync, size); err != nil {
		return 0, err
	}
	p, err := w.caps.StreamOrderedMemory.MallocAsync(size, s)
	w.h.After(device.CallMallocAsync, size, err)
	return p, err
}

func (w *wrapper) FreeAsync(p device.Ptr, s device.Stream) error {
	if err := w.h.Before(device.CallFreeAsync, 0); err != nil {
		return err
	}
	err := w.caps.StreamOrderedMemory.FreeAsync(p, s)
	w.h.After(device.CallFreeAsync, 0, err)
	return err
}

func (w *wrapper) SetReleaseThreshold(bytes uint64) error {
	if err := w.h.Before(device.CallSetReleaseThreshold, 0); err != nil {
		return err
	}
	err := w.caps.StreamOrderedMemory.SetReleaseThreshold(bytes)
	w.h.After(device.CallSetReleaseThreshold, 0, err)
	return err
}

func (w *wrapper) TrimPool(keep uint64) error {
	if err := w.h.Before(device.CallTrimPool, 0); err != nil {
		return err
	}
	err := w.caps.StreamOrderedMemory.TrimPool(keep)
	w.h.After(device.CallTrimPool, 0, err)
	return err
}

func (w *wrapper) PoolUsage() (device.PoolUsage, error) {
	if err := w.h.Before(device.CallPoolUsage, 0); err != nil {
		return device.PoolUsage{}, err
	}
	u, err := w.caps.StreamOrderedMemory.PoolUsage()
	w.h.After(device.CallPoolUsage, 0, err)
	return u, err
}

func (w *wrapper) ResetPoolPeaks() error {
	if err := w.h.Before(device.CallResetPoolPeaks, 0); err != nil {
		return err
	}
	err := w.caps.StreamOrderedMemory.ResetPoolPeaks()
	w.h.After(device.CallResetPoolPeaks, 0, err)
	return err
}

// device.StreamChecker, device.UsageReporter and device.ProgressReporter:
// infallible reads, forwarded as they are.

func (w *wrapper) HasStream(s device.Stream) bool { return w.caps.StreamChecker.HasStream(s) }
func (w *wrapper) BytesInUse() uint64             { return w.caps.UsageReporter.BytesInUse() }

func (w *wrapper) Progressed(mark uint64, f func(device.Stream)) (uint64, bool) {
	return w.caps.ProgressReporter.Progressed(mark, f)
}
