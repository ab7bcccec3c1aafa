//go:build cuda

// stub_test.go: tests of the Go glue against the stub driver
// (device/cuda/internal/cudastub); they skip unless the stub is the loaded
// libcuda.

package cuda

import (
	"errors"
	"math"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/device/cuda/internal/cudastub"
)

const mib = 1 << 20

// stubMu serializes the tests that use the stub, whose state is global.
var stubMu sync.Mutex

// open0 opens device 0 and closes it when the test ends.
func open0(tb testing.TB) *Device {
	tb.Helper()
	d, err := Open(0)
	require.NoError(tb, err)
	tb.Cleanup(func() { _ = d.Close() })
	return d
}

// mustRecord records an event on stream s, failing the test on an error.
func mustRecord(t *testing.T, d *Device, s device.Stream) device.Event {
	t.Helper()
	e, err := d.RecordEvent(s)
	require.NoError(t, err)
	return e
}

// mustDone reports whether event e is done, failing the test on an
// error.
func mustDone(t *testing.T, d *Device, e device.Event) bool {
	t.Helper()
	done, err := d.EventDone(e)
	require.NoError(t, err)
	return done
}

// openStub resets the stub, lets setup configure it, and opens device 0.
func openStub(t *testing.T, setup ...func()) *Device {
	t.Helper()
	if !cudastub.Loaded() {
		t.Skip("the loaded libcuda.so.1 is not the stub (run scripts/ci-cuda.sh)")
	}
	stubMu.Lock()
	t.Cleanup(stubMu.Unlock)
	cudastub.Reset()
	for _, f := range setup {
		f()
	}
	return open0(t)
}

// requireDeviceError checks that err is a *device.Error of device 0 that
// wraps want and carries the driver code (0 when the driver was not
// called).
func requireDeviceError(t *testing.T, err error, want error, code int) {
	t.Helper()
	require.Error(t, err)
	require.ErrorIs(t, err, want)
	var de *device.Error
	require.ErrorAs(t, err, &de)
	assert.Equal(t, code, de.Code, "driver code in %v", err)
	if code != 0 {
		assert.NotEmpty(t, de.Message)
	}
}

func TestStubOpen(t *testing.T) {
	d := openStub(t)
	assert.Equal(t, 0, d.Ordinal())
	assert.Equal(t, "gpumem stub device 0", d.Name())
	assert.Equal(t, uint64(8<<30), d.TotalMemory())
	assert.True(t, d.VirtualMemorySupported())
	assert.Equal(t, uint64(2*mib), d.Granularity())
	assert.True(t, Available())
	n, err := DeviceCount()
	require.NoError(t, err)
	assert.Equal(t, 1, n)

	for _, ord := range []int{-1, 1, math.MaxInt} {
		_, err := Open(ord)
		requireDeviceError(t, err, ErrNoDevice, 0)
	}
	cudastub.SetDevices(2)
	d1, err := Open(1)
	require.NoError(t, err)
	assert.Equal(t, "gpumem stub device 1", d1.Name())
	require.NoError(t, d1.Close())

	// A driver failure while opening is reported with its code.
	cudastub.FailNext("cuDevicePrimaryCtxRetain", 101)
	_, err = Open(0)
	requireDeviceError(t, err, ErrNoDevice, 101)
	assert.Contains(t, err.Error(), "CUDA_ERROR_INVALID_DEVICE")
}

func TestStubMallocFree(t *testing.T) {
	d := openStub(t)
	free0, total, err := d.MemInfo()
	require.NoError(t, err)
	assert.Equal(t, uint64(8<<30), total)

	p, err := d.Malloc(3 * mib)
	require.NoError(t, err)
	assert.NotZero(t, p)
	free1, _, err := d.MemInfo()
	require.NoError(t, err)
	assert.Equal(t, free0-3*mib, free1)
	assert.Equal(t, 1, cudastub.Live("mem"))

	require.NoError(t, d.Free(p))
	free2, _, err := d.MemInfo()
	require.NoError(t, err)
	assert.Equal(t, free0, free2)
	assert.Equal(t, 0, cudastub.Live("mem"))

	// Double free, unknown and null pointers never reach the driver.
	frees := cudastub.Calls("cuMemFree")
	requireDeviceError(t, d.Free(p), device.ErrInvalidPointer, 0)
	requireDeviceError(t, d.Free(p+512), device.ErrInvalidPointer, 0)
	requireDeviceError(t, d.Free(0), device.ErrInvalidPointer, 0)
	assert.Equal(t, frees, cudastub.Calls("cuMemFree"))

	mallocs := cudastub.Calls("cuMemAlloc")
	for _, size := range []uint64{0, math.MaxInt64 + 1, math.MaxUint64} {
		_, err := d.Malloc(size)
		requireDeviceError(t, err, device.ErrInvalidSize, 0)
	}
	assert.Equal(t, mallocs, cudastub.Calls("cuMemAlloc"))
}

func TestStubOutOfMemory(t *testing.T) {
	d := openStub(t, func() { cudastub.SetCapacity(64 * mib) })
	p, err := d.Malloc(60 * mib)
	require.NoError(t, err)
	_, err = d.Malloc(8 * mib)
	requireDeviceError(t, err, device.ErrOutOfMemory, 2)
	assert.Contains(t, err.Error(), "CUDA_ERROR_OUT_OF_MEMORY: out of memory")
	assert.Equal(t, 1, cudastub.Live("mem"), "a failed Malloc allocates nothing")
	require.NoError(t, d.Free(p))
	q, err := d.Malloc(8 * mib)
	require.NoError(t, err)
	require.NoError(t, d.Free(q))
}

// TestStubErrorMapping injects driver error codes into each driver call the
// backend makes and checks the sentinel and code of the error it returns.
func TestStubErrorMapping(t *testing.T) {
	type op func(t *testing.T, d *Device) error
	malloc := func(t *testing.T, d *Device) error { _, err := d.Malloc(mib); return err }
	free := func(t *testing.T, d *Device) error {
		p, err := d.Malloc(mib)
		require.NoError(t, err)
		return d.Free(p)
	}
	memInfo := func(t *testing.T, d *Device) error { _, _, err := d.MemInfo(); return err }
	sync := func(t *testing.T, d *Device) error { return d.Synchronize() }
	newStream := func(t *testing.T, d *Device) error { _, err := d.NewStream(); return err }
	syncStream := func(t *testing.T, d *Device) error {
		s, err := d.NewStream()
		require.NoError(t, err)
		return d.SynchronizeStream(s)
	}
	record := func(t *testing.T, d *Device) error { _, err := d.RecordEvent(device.DefaultStream); return err }
	withEvent := func(f func(d *Device, e device.Event) error) op {
		return func(t *testing.T, d *Device) error {
			e := mustRecord(t, d, device.DefaultStream)
			return f(d, e)
		}
	}
	query := withEvent(func(d *Device, e device.Event) error { _, err := d.EventDone(e); return err })
	syncEvent := withEvent(func(d *Device, e device.Event) error { return d.SynchronizeEvent(e) })
	release := withEvent(func(d *Device, e device.Event) error { return d.ReleaseEvent(e) })
	hostAlloc := func(t *testing.T, d *Device) error { _, err := d.HostAlloc(4096); return err }
	hostFree := func(t *testing.T, d *Device) error {
		b, err := d.HostAlloc(4096)
		require.NoError(t, err)
		return d.HostFree(b)
	}
	reserve := func(t *testing.T, d *Device) error { _, err := d.Reserve(4 * mib); return err }
	mapRange := func(t *testing.T, d *Device) error {
		p, err := d.Reserve(4 * mib)
		require.NoError(t, err)
		return d.Map(p, 4*mib)
	}
	unmap := func(t *testing.T, d *Device) error {
		p, err := d.Reserve(4 * mib)
		require.NoError(t, err)
		require.NoError(t, d.Map(p, 4*mib))
		return d.Unmap(p, 4*mib)
	}
	releaseRange := func(t *testing.T, d *Device) error {
		p, err := d.Reserve(4 * mib)
		require.NoError(t, err)
		return d.Release(p)
	}

	cases := []struct {
		fn   string
		code int
		op   op
		want error
	}{
		{"cuMemAlloc", 2, malloc, device.ErrOutOfMemory},
		{"cuMemAlloc", 1, malloc, device.ErrInvalidSize},
		{"cuMemAlloc", 700, malloc, ErrDriver},
		{"cuMemAlloc", 801, malloc, device.ErrNotSupported},
		{"cuMemAlloc", 800, malloc, device.ErrNotSupported},
		{"cuMemAlloc", 4, malloc, ErrNoDevice},
		{"cuMemAlloc", 12345, malloc, ErrDriver},
		{"cuCtxPushCurrent", 201, malloc, ErrDriver},
		{"cuCtxPopCurrent", 201, malloc, ErrDriver},
		{"cuMemFree", 1, free, device.ErrInvalidPointer},
		{"cuMemFree", 400, free, device.ErrInvalidPointer},
		{"cuMemFree", 700, free, ErrDriver},
		{"cuMemGetInfo", 999, memInfo, ErrDriver},
		{"cuCtxSynchronize", 700, sync, ErrDriver},
		{"cuStreamCreate", 2, newStream, device.ErrOutOfMemory},
		{"cuStreamSynchronize", 400, syncStream, device.ErrInvalidStream},
		{"cuStreamSynchronize", 700, syncStream, ErrDriver},
		{"cuEventCreate", 2, record, device.ErrOutOfMemory},
		{"cuEventRecord", 400, record, device.ErrInvalidStream},
		{"cuEventQuery", 400, query, device.ErrInvalidEvent},
		{"cuEventQuery", 700, query, ErrDriver},
		{"cuEventSynchronize", 400, syncEvent, device.ErrInvalidEvent},
		{"cuEventDestroy", 400, release, device.ErrInvalidEvent},
		{"cuMemHostAlloc", 2, hostAlloc, device.ErrOutOfMemory},
		{"cuMemFreeHost", 1, hostFree, device.ErrInvalidPointer},
		{"cuMemAddressReserve", 2, reserve, device.ErrOutOfMemory},
		{"cuMemAddressReserve", 1, reserve, device.ErrInvalidSize},
		{"cuMemCreate", 2, mapRange, device.ErrOutOfMemory},
		{"cuMemMap", 1, mapRange, device.ErrInvalidArgument},
		{"cuMemSetAccess", 801, mapRange, device.ErrNotSupported},
		{"cuMemUnmap", 1, unmap, device.ErrInvalidArgument},
		{"cuMemRelease", 1, unmap, device.ErrInvalidArgument},
		{"cuMemAddressFree", 1, releaseRange, device.ErrInvalidPointer},
	}
	for _, c := range cases {
		t.Run(c.fn+"/"+strings.TrimPrefix(strings.SplitN(driverText(c.code), ":", 2)[0], "CUDA_ERROR_"), func(t *testing.T) {
			d := openStub(t)
			// The op's setup calls come first; the injected failure hits the
			// last call of fn, which is the one the op is about.
			calls := countCalls(t, c.op, c.fn)
			cudastub.Reset()
			d = reopen(t, d)
			require.True(t, cudastub.Fail(c.fn, c.code, calls-1, 1))
			err := c.op(t, d)
			requireDeviceError(t, err, c.want, c.code)
		})
	}
}

// countCalls runs op on a fresh device and returns how many times it
// called the driver function fn.
func countCalls(t *testing.T, o func(*testing.T, *Device) error, fn string) int {
	t.Helper()
	d, err := Open(0)
	require.NoError(t, err)
	before := cudastub.Calls(fn)
	require.NoError(t, o(t, d))
	n := cudastub.Calls(fn) - before
	require.NoError(t, d.Close())
	require.Positive(t, n, "the operation never calls %s", fn)
	return n
}

// reopen closes d and opens device 0 again.
func reopen(t *testing.T, d *Device) *Device {
	t.Helper()
	require.NoError(t, d.Close())
	return open0(t)
}

func TestStubFailedFreeKeepsPointer(t *testing.T) {
	d := openStub(t)
	p, err := d.Malloc(mib)
	require.NoError(t, err)
	cudastub.FailNext("cuMemFree", 700)
	requireDeviceError(t, d.Free(p), ErrDriver, 700)
	require.NoError(t, d.Free(p), "a failed Free leaves the pointer live")
	assert.Equal(t, 0, cudastub.Live("mem"))
}

func TestStubStreamsAndEvents(t *testing.T) {
	d := openStub(t)
	s1, err := d.NewStream()
	require.NoError(t, err)
	s2, err := d.NewStream()
	require.NoError(t, err)
	assert.NotEqual(t, device.DefaultStream, s1)
	assert.NotEqual(t, s1, s2)
	assert.Equal(t, 2, cudastub.Live("stream"))
	var checker device.StreamChecker = d
	assert.True(t, checker.HasStream(device.DefaultStream))
	assert.True(t, d.HasStream(s1))
	assert.False(t, d.HasStream(s2+1000))
	assert.False(t, d.HasStream(1<<32|s1), "a handle of device 1 is not a stream of device 0")
	require.NoError(t, d.SynchronizeStream(device.DefaultStream))
	require.NoError(t, d.SynchronizeStream(s1))

	// Unknown streams never reach the driver.
	before := cudastub.Calls("cuStreamSynchronize") + cudastub.Calls("cuEventCreate")
	requireDeviceError(t, d.SynchronizeStream(s2+1000), device.ErrInvalidStream, 0)
	_, err = d.RecordEvent(s2 + 1000)
	requireDeviceError(t, err, device.ErrInvalidStream, 0)
	assert.Equal(t, before, cudastub.Calls("cuStreamSynchronize")+cudastub.Calls("cuEventCreate"))

	cudastub.HoldEvents(true)
	e1 := mustRecord(t, d, s1)
	assert.NotZero(t, e1)
	done := mustDone(t, d, e1)
	assert.False(t, done, "CUDA_ERROR_NOT_READY is not done")
	require.NoError(t, d.SynchronizeEvent(e1))
	done = mustDone(t, d, e1)
	assert.True(t, done)

	e2 := mustRecord(t, d, s2)
	e3 := mustRecord(t, d, s1)
	require.NoError(t, d.SynchronizeStream(s2))
	done2 := mustDone(t, d, e2)
	done3 := mustDone(t, d, e3)
	assert.True(t, done2, "synchronizing the stream completes its events")
	assert.False(t, done3, "but not other streams' events")
	require.NoError(t, d.Synchronize())
	done3 = mustDone(t, d, e3)
	assert.True(t, done3)

	assert.Equal(t, 3, cudastub.Live("event"))
	assert.Zero(t, cudastub.TimedEvents(), "events are created with CU_EVENT_DISABLE_TIMING")
	for _, e := range []device.Event{e1, e2, e3} {
		require.NoError(t, d.ReleaseEvent(e))
	}
	assert.Equal(t, 0, cudastub.Live("event"))

	destroys := cudastub.Calls("cuEventDestroy")
	for _, e := range []device.Event{0, e1, e3 + 1} {
		requireDeviceError(t, d.ReleaseEvent(e), device.ErrInvalidEvent, 0)
		_, err := d.EventDone(e)
		requireDeviceError(t, err, device.ErrInvalidEvent, 0)
		requireDeviceError(t, d.SynchronizeEvent(e), device.ErrInvalidEvent, 0)
	}
	assert.Equal(t, destroys, cudastub.Calls("cuEventDestroy"))
}

// TestStubWaitEvent: WaitEvent reaches cuStreamWaitEvent with the
// driver's stream and event; the wait outlives the event's release;
// synchronizing the waiting stream completes the awaited work; unknown
// handles never reach the driver, and a driver error keeps its code.
func TestStubWaitEvent(t *testing.T) {
	d := openStub(t)
	var w device.StreamWaiter = d
	a, b := twoStreams(t, d)

	cudastub.HoldEvents(true)
	ea := mustRecord(t, d, a)
	require.NoError(t, w.WaitEvent(b, ea))
	require.NoError(t, w.WaitEvent(device.DefaultStream, ea))
	assert.EqualValues(t, 2, cudastub.Calls("cuStreamWaitEvent"))
	assert.Equal(t, 2, cudastub.Live("wait"))
	require.NoError(t, d.ReleaseEvent(ea), "the event may go; the wait stays")
	eb := mustRecord(t, d, b)
	ea2 := mustRecord(t, d, a)
	require.NoError(t, d.SynchronizeStream(b))
	done := mustDone(t, d, ea2)
	assert.True(t, done, "b waited for a: synchronizing b ran a's work")
	done = mustDone(t, d, eb)
	assert.True(t, done)
	assert.Equal(t, 1, cudastub.Live("wait"), "the default stream still waits")
	require.NoError(t, d.Synchronize())
	assert.Equal(t, 0, cudastub.Live("wait"))

	calls := cudastub.Calls("cuStreamWaitEvent")
	requireDeviceError(t, w.WaitEvent(b+1000, eb), device.ErrInvalidStream, 0)
	requireDeviceError(t, w.WaitEvent(b, 1<<40), device.ErrInvalidEvent, 0)
	requireDeviceError(t, w.WaitEvent(b, ea), device.ErrInvalidEvent, 0)
	assert.Equal(t, calls, cudastub.Calls("cuStreamWaitEvent"), "unknown handles never reach the driver")

	cudastub.Fail("cuStreamWaitEvent", 400, 0, 1) // CUDA_ERROR_INVALID_HANDLE
	err := w.WaitEvent(b, eb)
	requireDeviceError(t, err, device.ErrInvalidEvent, 400)
	require.NoError(t, w.WaitEvent(b, eb), "once only")
	for _, e := range []device.Event{eb, ea2} {
		require.NoError(t, d.ReleaseEvent(e))
	}
}

func TestStubFailedRecordLeaksNoEvent(t *testing.T) {
	d := openStub(t)
	cudastub.FailNext("cuEventRecord", 400)
	_, err := d.RecordEvent(device.DefaultStream)
	requireDeviceError(t, err, device.ErrInvalidStream, 400)
	assert.Equal(t, 0, cudastub.Live("event"))
}

// TestStubContextsAcrossGoroutines calls the device from many goroutines on
// many OS threads, none of which ever had a context current: the stub
// refuses any call made without the device's context, so every success
// shows that each call sets it.
func TestStubContextsAcrossGoroutines(t *testing.T) {
	d := openStub(t)
	assert.Equal(t, 201, cudastub.UnboundMalloc(), "the stub refuses calls without a current context")
	assert.Equal(t, 1, cudastub.ContextFailures())

	cudastub.InvalidateContexts()
	const goroutines, rounds = 16, 40
	var wg sync.WaitGroup
	errs := make(chan error, goroutines*rounds)
	for g := 0; g < goroutines; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			if g%2 == 0 {
				// Never unlocked: the thread exits with the goroutine, so
				// later goroutines run on fresh threads.
				runtime.LockOSThread()
			}
			s, err := d.NewStream()
			if err != nil {
				errs <- err
				return
			}
			for i := 0; i < rounds; i++ {
				p, err := d.Malloc(uint64(1+i) * 4096)
				if err != nil {
					errs <- err
					continue
				}
				e, err := d.RecordEvent(s)
				if err == nil {
					_, err = d.EventDone(e)
				}
				if err == nil {
					err = d.ReleaseEvent(e)
				}
				if err == nil {
					err = d.Free(p)
				}
				if err != nil {
					errs <- err
				}
				runtime.Gosched()
			}
		}(g)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	assert.Equal(t, 1, cudastub.ContextFailures(), "no call was made without the context")
	assert.GreaterOrEqual(t, cudastub.Threads(), goroutines/2, "calls came from many OS threads")
	assert.Equal(t, 0, cudastub.Live("mem"))
	assert.Equal(t, 0, cudastub.Live("event"))
}

func TestStubClose(t *testing.T) {
	d := openStub(t)
	_, err := d.Malloc(mib)
	require.NoError(t, err)
	s, err := d.NewStream()
	require.NoError(t, err)
	mustRecord(t, d, s)
	_, err = d.HostAlloc(100)
	require.NoError(t, err)
	base, err := d.Reserve(4 * d.Granularity())
	require.NoError(t, err)
	require.NoError(t, d.Map(base, 2*d.Granularity()))

	require.NoError(t, d.Close())
	for _, kind := range []string{"mem", "stream", "event", "host", "reservation", "handle", "mapping"} {
		assert.Equal(t, 0, cudastub.Live(kind), kind)
	}
	assert.Equal(t, uint64(0), cudastub.Used())
	require.NoError(t, d.Close(), "a second Close does nothing")

	_, err = d.Malloc(mib)
	requireDeviceError(t, err, ErrClosed, 0)
	requireDeviceError(t, d.Free(1), ErrClosed, 0)
	_, err = d.NewStream()
	requireDeviceError(t, err, ErrClosed, 0)
	_, err = d.RecordEvent(0)
	requireDeviceError(t, err, ErrClosed, 0)
	_, _, err = d.MemInfo()
	requireDeviceError(t, err, ErrClosed, 0)
	requireDeviceError(t, d.Map(base, d.Granularity()), ErrClosed, 0)
}

// TestStubCloseWhileBusy closes the device while goroutines use it: every
// call either succeeds or fails with ErrClosed, and nothing is left behind.
func TestStubCloseWhileBusy(t *testing.T) {
	d := openStub(t)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			for i := 0; i < 200; i++ {
				p, err := d.Malloc(4096)
				if err != nil {
					if !errors.Is(err, ErrClosed) {
						t.Error(err)
					}
					return
				}
				if err := d.Free(p); err != nil && !errors.Is(err, ErrClosed) {
					t.Error(err)
				}
			}
		}()
	}
	close(start)
	require.NoError(t, d.Close())
	wg.Wait()
	assert.Equal(t, 0, cudastub.Live("mem"))
}

// TestStubInitFailure runs this test binary again with the stub's cuInit
// failing: the process must survive gorgonia.org/cu's init, and the
// backend must report no device.
func TestStubInitFailure(t *testing.T) {
	if os.Getenv("GPUMEM_CUDA_INIT_CHILD") == "1" {
		called, err := DeviceCount()
		if Available() || called != 0 || err == nil {
			t.Fatalf("Available()=%v DeviceCount()=%d, %v; want no device", Available(), called, err)
		}
		requireDeviceError(t, err, ErrNoDevice, 100)
		_, err = Open(0)
		requireDeviceError(t, err, ErrNoDevice, 100)
		return
	}
	if !cudastub.Loaded() {
		t.Skip("the loaded libcuda.so.1 is not the stub")
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestStubInitFailure$", "-test.v")
	cmd.Env = append(os.Environ(), "GPUMEM_CUDA_INIT_CHILD=1", "CUDASTUB_INIT_ERROR=100")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "child failed:\n%s", out)
	assert.Contains(t, string(out), "--- PASS: TestStubInitFailure")
}
