//go:build cuda

// adopt_stub_test.go: a caller's context and streams against the stub
// driver: OpenContext, AdoptStream, ReleaseStream and the handles given
// back; and one test of the same on a real GPU (TestGPUAdoptContextAndStream,
// which skips without one).

package cuda

import (
	"runtime"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorgonia.org/cu"

	"github.com/gpumem/gpumem/allocator"
	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/device/cuda/internal/cudastub"
)

// makeContext creates a context on device 0 the way a runtime does
// (cuCtxCreate, which makes it current), then pops it off this thread.
func makeContext(t *testing.T) cu.CUContext {
	t.Helper()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	dev, err := cu.GetDevice(0)
	require.NoError(t, err)
	ctx, err := dev.MakeContext(0)
	require.NoError(t, err)
	_, err = cu.PopCurrentCtx()
	require.NoError(t, err)
	return ctx
}

// driverStream makes a driver stream in d's context, as a runtime would.
func driverStream(t *testing.T, d *Device) cu.Stream {
	t.Helper()
	var s cu.Stream
	c := d.call(func() int {
		var err error
		s, err = cu.MakeStream(cu.NonBlocking)
		return codeOf(err)
	})
	require.Equal(t, 0, c)
	return s
}

func TestStubOpenContext(t *testing.T) {
	openStub(t) // resets the stub and holds it
	ctx := makeContext(t)
	require.Equal(t, 1, cudastub.Live("context"))
	retains := cudastub.Calls("cuDevicePrimaryCtxRetain")

	d, err := OpenContext(ctx)
	require.NoError(t, err)
	assert.Equal(t, 0, d.Ordinal())
	assert.Equal(t, ctx, d.Context())
	assert.False(t, d.OwnsContext())
	assert.Equal(t, retains, cudastub.Calls("cuDevicePrimaryCtxRetain"), "OpenContext must not retain the primary context")

	s, err := d.NewStream()
	require.NoError(t, err)
	p, err := d.Malloc(mib)
	require.NoError(t, err)
	_, err = d.RecordEvent(s)
	require.NoError(t, err)
	require.NoError(t, d.Free(p))
	releases := cudastub.Calls("cuDevicePrimaryCtxRelease")
	require.NoError(t, d.Close())
	assert.Equal(t, releases, cudastub.Calls("cuDevicePrimaryCtxRelease"), "Close must not release a primary context it never retained")
	assert.Equal(t, 1, cudastub.Live("context"), "the caller's context outlives the Device")
	assert.Equal(t, 0, cudastub.Live("stream"), "Close destroys the streams the Device made")

	require.NoError(t, ctx.Destroy())
	_, err = OpenContext(ctx) // ctx was zeroed by Destroy
	requireDeviceError(t, err, device.ErrInvalidArgument, 0)
	_, err = OpenContext(makeDeadContext(t))
	require.Error(t, err)
}

// makeDeadContext returns a context that was destroyed.
func makeDeadContext(t *testing.T) cu.CUContext {
	ctx := makeContext(t)
	dead := ctx
	require.NoError(t, ctx.Destroy())
	return dead
}

func TestStubAdoptStream(t *testing.T) {
	d := openStub(t)
	cs := driverStream(t, d)
	h := handleOf(cs)
	require.NotZero(t, h)

	s, err := d.AdoptStream(cs)
	require.NoError(t, err)
	assert.NotEqual(t, device.DefaultStream, s)
	assert.True(t, d.HasStream(s))
	again, err := d.AdoptStreamHandle(h)
	require.NoError(t, err)
	assert.Equal(t, s, again, "adopting a stream twice gives the same handle")

	got, err := d.StreamHandle(s)
	require.NoError(t, err)
	assert.Equal(t, h, got)
	back, err := d.DriverStream(s)
	require.NoError(t, err)
	assert.Equal(t, cs, back)

	// Events are recorded on the caller's stream itself.
	cudastub.HoldEvents(true)
	e, err := d.RecordEvent(s)
	require.NoError(t, err)
	done, err := d.EventDone(e)
	require.NoError(t, err)
	assert.False(t, done)
	require.NoError(t, d.SynchronizeStream(s))
	done, err = d.EventDone(e)
	require.NoError(t, err)
	assert.True(t, done, "synchronizing the driver stream completes the event recorded on the adopted one")
	other, err := d.NewStream()
	require.NoError(t, err)
	e2, err := d.RecordEvent(other)
	require.NoError(t, err)
	require.NoError(t, d.WaitEvent(s, e2))
	cudastub.HoldEvents(false)

	// Release forgets; the driver stream stays.
	require.NoError(t, d.ReleaseStream(s))
	assert.False(t, d.HasStream(s))
	_, err = d.RecordEvent(s)
	requireDeviceError(t, err, device.ErrInvalidStream, 0)
	_, err = d.StreamHandle(s)
	requireDeviceError(t, err, device.ErrInvalidStream, 0)
	requireDeviceError(t, d.ReleaseStream(s), device.ErrInvalidStream, 0)
	assert.Equal(t, 2, cudastub.Live("stream"), "release must not destroy the caller's stream")
	requireDeviceError(t, d.ReleaseStream(other), device.ErrInvalidStream, 0)
	assert.True(t, d.HasStream(other), "a failed release changes nothing")

	// Adopted again after release: a new handle, usable.
	s2, err := d.AdoptStream(cs)
	require.NoError(t, err)
	assert.NotEqual(t, s, s2)
	_, err = d.RecordEvent(s2)
	require.NoError(t, err)

	destroys := cudastub.Calls("cuStreamDestroy")
	require.NoError(t, d.Close())
	assert.Equal(t, destroys+1, cudastub.Calls("cuStreamDestroy"), "Close destroys the stream it made, not the adopted one")
	assert.Equal(t, 1, cudastub.Live("stream"))
	_, err = d.AdoptStream(cs)
	requireDeviceError(t, err, ErrClosed, 0)
}

func TestStubAdoptStreamSpecialAndBad(t *testing.T) {
	d := openStub(t)
	for _, h := range []uintptr{0, StreamLegacy} {
		s, err := d.AdoptStreamHandle(h)
		require.NoError(t, err)
		assert.Equal(t, device.DefaultStream, s, "handle %#x", h)
	}
	got, err := d.StreamHandle(device.DefaultStream)
	require.NoError(t, err)
	assert.Zero(t, got)
	require.NoError(t, d.ReleaseStream(device.DefaultStream))
	assert.True(t, d.HasStream(device.DefaultStream))

	pt, err := d.AdoptStreamHandle(StreamPerThread)
	require.NoError(t, err)
	assert.NotEqual(t, device.DefaultStream, pt)
	got, err = d.StreamHandle(pt)
	require.NoError(t, err)
	assert.Equal(t, StreamPerThread, got)
	e, err := d.RecordEvent(pt)
	require.NoError(t, err)
	require.NoError(t, d.SynchronizeEvent(e))

	// A handle the driver does not know is refused, and nothing is kept.
	_, err = d.AdoptStreamHandle(0x1234)
	requireDeviceError(t, err, device.ErrInvalidStream, 400) // CUDA_ERROR_INVALID_HANDLE
	d.streamMu.RLock()
	n := len(d.streams)
	d.streamMu.RUnlock()
	assert.Equal(t, 1, n, "only the per-thread stream is in the table")

	// The driver's answer reaches the caller.
	cs := driverStream(t, d)
	require.True(t, cudastub.FailNext("cuStreamQuery", 201))
	_, err = d.AdoptStream(cs)
	requireDeviceError(t, err, ErrDriver, 201)
	// A stream with pending work is adopted (not ready is not an error).
	cudastub.HoldEvents(true)
	busy := driverStream(t, d)
	pt2, err := d.AdoptStream(busy)
	require.NoError(t, err)
	_, err = d.RecordEvent(pt2)
	require.NoError(t, err)
	require.NoError(t, d.ReleaseStream(pt2))
	again, err := d.AdoptStream(busy)
	require.NoError(t, err, "a stream with held work is adopted")
	assert.NotEqual(t, pt2, again)
	s, err := d.AdoptStream(cs)
	require.NoError(t, err)
	assert.NotEqual(t, again, s)
}

func TestDevicePtrRoundTrip(t *testing.T) {
	for _, p := range []device.Ptr{0, 1, 0x7f0000000000, ^device.Ptr(0)} {
		assert.Equal(t, p, PtrOf(DevicePtr(p)))
		assert.Equal(t, uint64(p), uint64(DevicePtr(p)))
	}
}

// The caching allocator over a runtime's own context and stream: blocks
// are ordered on the stream the runtime launches on, and a block used on a
// second adopted stream is reused only after the event on it completes.
func TestStubAllocatorOnAdoptedStreams(t *testing.T) {
	openStub(t)
	ctx := makeContext(t)
	defer func() { _ = ctx.Destroy() }()
	d, err := OpenContext(ctx)
	require.NoError(t, err)
	defer func() { _ = d.Close() }()
	s1, err := d.AdoptStream(driverStream(t, d))
	require.NoError(t, err)
	s2, err := d.AdoptStream(driverStream(t, d))
	require.NoError(t, err)

	a, err := allocator.New(d, allocator.Config{})
	require.NoError(t, err)
	p, err := a.Alloc(4*mib, s1)
	require.NoError(t, err)
	cudastub.HoldEvents(true)
	require.NoError(t, a.RecordStream(p, s2))
	require.NoError(t, a.Free(p))
	q, err := a.Alloc(4*mib, s1)
	require.NoError(t, err)
	assert.NotEqual(t, p, q, "the block is still in use on s2")
	require.NoError(t, d.SynchronizeStream(s2))
	require.NoError(t, a.Free(q))
	r, err := a.Alloc(4*mib, s1)
	require.NoError(t, err)
	assert.Contains(t, []device.Ptr{p, q}, r)
	require.NoError(t, a.Free(r))
	cudastub.HoldEvents(false)
	require.NoError(t, a.EmptyCache())
	assert.Zero(t, cudastub.Used())
}

// On a real GPU: a caller's context and stream, shared both ways, with a
// copy launched by the caller on the stream gpumem ordered the memory on.
func TestGPUAdoptContextAndStream(t *testing.T) {
	openGPU(t) // skips without a GPU
	ctx := makeContext(t)
	defer func() { _ = ctx.Destroy() }()
	d, err := OpenContext(ctx)
	require.NoError(t, err)
	defer func() { _ = d.Close() }()
	cs := driverStream(t, d)
	s, err := d.AdoptStream(cs)
	require.NoError(t, err)
	a, err := allocator.New(d, allocator.Config{})
	require.NoError(t, err)
	src, err := a.Alloc(mib, s)
	require.NoError(t, err)
	dst, err := a.Alloc(mib, s)
	require.NoError(t, err)
	launch, err := d.DriverStream(s)
	require.NoError(t, err)
	require.Equal(t, 0, d.call(func() int {
		if c := codeOf(cu.MemsetD32Async(DevicePtr(src), 0x3f800000, mib/4, launch)); c != 0 {
			return c
		}
		return codeOf(cu.MemcpyDtoDAsync(DevicePtr(dst), DevicePtr(src), mib, launch))
	}))
	require.NoError(t, a.Free(src))
	require.NoError(t, d.SynchronizeStream(s))
	out := make([]float32, 4)
	require.Equal(t, 0, d.call(func() int { return codeOf(cu.MemcpyDtoH(unsafe.Pointer(&out[0]), DevicePtr(dst), 16)) }))
	assert.Equal(t, []float32{1, 1, 1, 1}, out)
	require.NoError(t, a.Free(dst))
	require.NoError(t, a.EmptyCache())
	require.NoError(t, d.ReleaseStream(s))
	require.Equal(t, 0, d.call(func() int { return codeOf(cs.Destroy()) }))
}
