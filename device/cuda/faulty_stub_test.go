//go:build cuda

// faulty_stub_test.go: the CUDA backend behind the fault-injecting
// adaptor (device/faulty), on the stub driver: the adaptor keeps the
// backend's capabilities, a failed call never reaches the driver, and the
// caching allocator survives injected failures on this backend too.

package cuda

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpumem/gpumem/allocator"
	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/device/cuda/internal/cudastub"
	"github.com/gpumem/gpumem/device/faulty"
	"github.com/gpumem/gpumem/gpumemtest"
)

// driverFuncs are the stub's driver functions that the backend calls
// after Open.
var driverFuncs = []string{
	"cuCtxGetCurrent", "cuCtxPopCurrent", "cuCtxPushCurrent", "cuCtxSetCurrent", "cuCtxSynchronize",
	"cuEventCreate", "cuEventDestroy", "cuEventQuery", "cuEventRecord", "cuEventSynchronize",
	"cuMemAddressFree", "cuMemAddressReserve", "cuMemAlloc", "cuMemCreate", "cuMemFree", "cuMemFreeHost",
	"cuMemGetInfo", "cuMemHostAlloc", "cuMemMap", "cuMemRelease", "cuMemSetAccess", "cuMemUnmap",
	"cuStreamCreate", "cuStreamDestroy", "cuStreamSynchronize", "cuStreamWaitEvent",
	"cuMemcpyDtoH", "cuMemcpyHtoD", "cuMemAllocFromPoolAsync", "cuMemFreeAsync",
	"cuMemPoolSetAttribute", "cuMemPoolGetAttribute", "cuMemPoolTrimTo",
}

// driverState is what the stub driver has seen and holds.
type driverState struct {
	Calls map[string]int
	Live  map[string]int
	Used  uint64
}

func stubState() driverState {
	s := driverState{Calls: map[string]int{}, Live: map[string]int{}, Used: cudastub.Used()}
	for _, f := range driverFuncs {
		s.Calls[f] = cudastub.Calls(f)
	}
	for _, k := range []string{"mem", "stream", "event", "host", "reservation", "handle", "mapping", "async", "write"} {
		s.Live[k] = cudastub.Live(k)
	}
	return s
}

func TestStubFaultyCapabilities(t *testing.T) {
	d := openStub(t)
	w := faulty.New(d).Device()
	for _, c := range []struct {
		name      string
		dev, wrap bool
	}{
		{"virtual memory", isVM(d), isVM(w)},
		{"host memory", isHost(d), isHost(w)},
		{"stream checker", isChecker(d), isChecker(w)},
		{"usage reporter", isUsage(d), isUsage(w)},
		{"stream waiter", isWaiter(d), isWaiter(w)},
		{"copier", isCopier(d), isCopier(w)},
		{"stream-ordered memory", isPool(d), isPool(w)},
	} {
		assert.Equal(t, c.dev, c.wrap, c.name)
	}
	assert.True(t, isVM(w) && isHost(w) && isChecker(w) && isWaiter(w) && isCopier(w) && isPool(w))
	assert.False(t, isUsage(w), "the CUDA backend reports no usage, and neither does its wrapper")
	assert.Equal(t, d.Granularity(), w.(device.VirtualMemory).Granularity())
}

// TestStubNoVirtualMemoryRefusesExpandableSegments: on a device without
// virtual memory management the backend reports granularity 0, so the
// allocator refuses expandable segments up front, wrapped or not.
func TestStubNoVirtualMemoryRefusesExpandableSegments(t *testing.T) {
	d := openStub(t, func() { cudastub.SetVirtualMemory(false) })
	for _, dev := range []device.Device{d, faulty.New(d).Device()} {
		_, err := allocator.New(dev, allocator.Config{ExpandableSegments: true})
		require.ErrorIs(t, err, device.ErrNotSupported)
		_, err = allocator.New(dev, allocator.Config{})
		require.NoError(t, err)
	}
	assert.Zero(t, cudastub.Calls("cuMemAddressReserve"))
}

func isVM(d device.Device) bool      { _, ok := d.(device.VirtualMemory); return ok }
func isHost(d device.Device) bool    { _, ok := d.(device.HostMemory); return ok }
func isChecker(d device.Device) bool { _, ok := d.(device.StreamChecker); return ok }
func isUsage(d device.Device) bool   { _, ok := d.(device.UsageReporter); return ok }
func isWaiter(d device.Device) bool  { _, ok := d.(device.StreamWaiter); return ok }
func isCopier(d device.Device) bool  { _, ok := d.(device.Copier); return ok }
func isPool(d device.Device) bool    { _, ok := d.(device.StreamOrderedMemory); return ok }

// TestStubFaultyEveryCall fails the second call of each kind on the CUDA
// backend: the failure wraps the rule's error, the driver is not called
// and holds what it held, and the same call made on the backend itself
// then succeeds.
func TestStubFaultyEveryCall(t *testing.T) {
	const g = 2 * mib
	vm := func(d device.Device) device.VirtualMemory { return d.(device.VirtualMemory) }
	host := func(d device.Device) device.HostMemory { return d.(device.HostMemory) }
	copier := func(d device.Device) device.Copier { return d.(device.Copier) }
	pool := func(d device.Device) device.StreamOrderedMemory { return d.(device.StreamOrderedMemory) }
	type call func(d device.Device, i int) error
	// Each case readies three calls on the backend d.
	cases := map[device.Call]func(t *testing.T, d *Device) call{
		device.CallMalloc: func(*testing.T, *Device) call {
			return func(d device.Device, _ int) error { _, err := d.Malloc(mib); return err }
		},
		device.CallFree: func(t *testing.T, d *Device) call {
			ps := make([]device.Ptr, 3)
			for i := range ps {
				var err error
				ps[i], err = d.Malloc(mib)
				require.NoError(t, err)
			}
			return func(d device.Device, i int) error { return d.Free(ps[i]) }
		},
		device.CallMemInfo: func(*testing.T, *Device) call {
			return func(d device.Device, _ int) error { _, _, err := d.MemInfo(); return err }
		},
		device.CallSynchronize: func(*testing.T, *Device) call {
			return func(d device.Device, _ int) error { return d.Synchronize() }
		},
		device.CallNewStream: func(*testing.T, *Device) call {
			return func(d device.Device, _ int) error { _, err := d.NewStream(); return err }
		},
		device.CallSynchronizeStream: func(t *testing.T, d *Device) call {
			s, err := d.NewStream()
			require.NoError(t, err)
			return func(d device.Device, _ int) error { return d.SynchronizeStream(s) }
		},
		device.CallRecordEvent: func(*testing.T, *Device) call {
			return func(d device.Device, _ int) error { _, err := d.RecordEvent(device.DefaultStream); return err }
		},
		device.CallEventDone: func(t *testing.T, d *Device) call {
			es := stubEvents(t, d, 3)
			return func(d device.Device, i int) error { _, err := d.EventDone(es[i]); return err }
		},
		device.CallSynchronizeEvent: func(t *testing.T, d *Device) call {
			es := stubEvents(t, d, 3)
			return func(d device.Device, i int) error { return d.SynchronizeEvent(es[i]) }
		},
		device.CallReleaseEvent: func(t *testing.T, d *Device) call {
			es := stubEvents(t, d, 3)
			return func(d device.Device, i int) error { return d.ReleaseEvent(es[i]) }
		},
		device.CallWaitEvent: func(t *testing.T, d *Device) call {
			es := stubEvents(t, d, 3)
			s, err := d.NewStream()
			require.NoError(t, err)
			return func(dev device.Device, i int) error { return dev.(device.StreamWaiter).WaitEvent(s, es[i]) }
		},
		device.CallWaitStream: func(t *testing.T, d *Device) call {
			cudastub.HoldEvents(true) // u's work stays pending, so each wait is a real one
			s, err := d.NewStream()
			require.NoError(t, err)
			u, err := d.NewStream()
			require.NoError(t, err)
			return func(dev device.Device, _ int) error { return dev.(device.StreamWaiter).WaitStream(s, u) }
		},
		device.CallReserve: func(*testing.T, *Device) call {
			return func(d device.Device, _ int) error { _, err := vm(d).Reserve(g); return err }
		},
		device.CallMap: func(t *testing.T, d *Device) call {
			r, err := d.Reserve(3 * g)
			require.NoError(t, err)
			return func(d device.Device, i int) error { return vm(d).Map(r+device.Ptr(i*g), g) }
		},
		device.CallUnmap: func(t *testing.T, d *Device) call {
			r, err := d.Reserve(3 * g)
			require.NoError(t, err)
			require.NoError(t, d.Map(r, 3*g))
			return func(d device.Device, i int) error { return vm(d).Unmap(r+device.Ptr(i*g), g) }
		},
		device.CallRelease: func(t *testing.T, d *Device) call {
			rs := make([]device.Ptr, 3)
			for i := range rs {
				var err error
				rs[i], err = d.Reserve(g)
				require.NoError(t, err)
			}
			return func(d device.Device, i int) error { return vm(d).Release(rs[i]) }
		},
		device.CallCopyToHost: func(t *testing.T, d *Device) call {
			p, err := d.Malloc(mib)
			require.NoError(t, err)
			buf := make([]byte, 64)
			return func(d device.Device, i int) error { return copier(d).CopyToHost(buf, p+device.Ptr(i*64)) }
		},
		device.CallCopyFromHost: func(t *testing.T, d *Device) call {
			p, err := d.Malloc(mib)
			require.NoError(t, err)
			return func(d device.Device, i int) error { return copier(d).CopyFromHost(p+device.Ptr(i*64), []byte{1, 2, 3}) }
		},
		device.CallMallocAsync: func(*testing.T, *Device) call {
			return func(d device.Device, _ int) error { _, err := pool(d).MallocAsync(mib, 0); return err }
		},
		device.CallFreeAsync: func(t *testing.T, d *Device) call {
			ps := make([]device.Ptr, 3)
			for i := range ps {
				var err error
				ps[i], err = d.MallocAsync(mib, 0)
				require.NoError(t, err)
			}
			return func(d device.Device, i int) error { return pool(d).FreeAsync(ps[i], 0) }
		},
		device.CallSetReleaseThreshold: func(*testing.T, *Device) call {
			return func(d device.Device, i int) error { return pool(d).SetReleaseThreshold(uint64(i) * mib) }
		},
		device.CallTrimPool: func(*testing.T, *Device) call {
			return func(d device.Device, _ int) error { return pool(d).TrimPool(0) }
		},
		device.CallPoolUsage: func(*testing.T, *Device) call {
			return func(d device.Device, _ int) error { _, err := pool(d).PoolUsage(); return err }
		},
		device.CallResetPoolPeaks: func(*testing.T, *Device) call {
			return func(d device.Device, _ int) error { return pool(d).ResetPoolPeaks() }
		},
		device.CallHostAlloc: func(*testing.T, *Device) call {
			return func(d device.Device, _ int) error { _, err := host(d).HostAlloc(4096); return err }
		},
		device.CallHostFree: func(t *testing.T, d *Device) call {
			bs := make([][]byte, 3)
			for i := range bs {
				var err error
				bs[i], err = d.HostAlloc(4096)
				require.NoError(t, err)
			}
			return func(d device.Device, i int) error { return host(d).HostFree(bs[i]) }
		},
	}
	require.Len(t, cases, int(device.NumCalls))
	for k := range device.NumCalls {
		t.Run(k.String(), func(t *testing.T) {
			d := openStub(t)
			do := cases[k](t, d)
			j := faulty.New(d)
			_, err := j.Add(faulty.Rule{Call: k, Nth: 2, Err: device.ErrOutOfMemory})
			require.NoError(t, err)
			require.NoError(t, do(j.Device(), 0))
			before := stubState()
			err = do(j.Device(), 1)
			require.ErrorIs(t, err, device.ErrOutOfMemory)
			require.ErrorIs(t, err, faulty.ErrInjected)
			require.Equal(t, before, stubState(), "the driver saw nothing of the failed call")
			require.NoError(t, do(d, 1), "the same call on the backend")
			require.NoError(t, do(j.Device(), 2), "once only")
			require.Len(t, j.Fired(), 1)
		})
	}
}

// stubEvents records n events on a stream of d, held not ready.
func stubEvents(t *testing.T, d *Device, n int) []device.Event {
	t.Helper()
	cudastub.HoldEvents(true)
	s, err := d.NewStream()
	require.NoError(t, err)
	es := make([]device.Event, n)
	for i := range es {
		es[i], err = d.RecordEvent(s)
		require.NoError(t, err)
	}
	return es
}

// TestStubFaultyAllocator runs the caching allocator over the faulty CUDA
// backend, failing device allocations and mappings: out-of-memory errors,
// intact invariants, and nothing left on the driver at the end.
func TestStubFaultyAllocator(t *testing.T) {
	for _, c := range []struct {
		name string
		cfg  allocator.Config
		call device.Call
	}{
		{"malloc", allocator.Config{}, device.CallMalloc},
		{"map", allocator.Config{ExpandableSegments: true}, device.CallMap},
	} {
		t.Run(c.name, func(t *testing.T) {
			d := openStub(t, func() { cudastub.SetCapacity(256 * mib) })
			j := faulty.New(d)
			a := gpumemtest.NewOn(t, j.Device(), gpumemtest.WithConfig(c.cfg))
			p, err := a.Alloc(mib, device.DefaultStream)
			require.NoError(t, err)

			_, err = j.Add(faulty.Rule{Call: c.call, Count: faulty.Always, Err: device.ErrOutOfMemory})
			require.NoError(t, err)
			_, err = a.Alloc(40*mib, device.DefaultStream)
			require.ErrorIs(t, err, device.ErrOutOfMemory)
			var oom *allocator.OutOfMemoryError
			require.ErrorAs(t, err, &oom)
			require.NotEmpty(t, j.Fired())
			require.NoError(t, a.CheckInvariants())

			j.Clear()
			q, err := a.Alloc(40*mib, device.DefaultStream)
			require.NoError(t, err)
			require.NoError(t, a.Free(p))
			require.NoError(t, a.Free(q))
			require.NoError(t, a.EmptyCache())
			require.NoError(t, a.CheckInvariants())
			assert.Zero(t, cudastub.Used(), "the driver holds no memory")
			assert.Zero(t, cudastub.Live("mem"))
			assert.Zero(t, cudastub.Live("mapping"))
		})
	}
}

// TestStubPolicyLendsWithStreamWaits: under the low_fragmentation policy
// a block freed on one stream serves a request on another through
// WaitStream (a record and a cuStreamWaitEvent on the driver, on the one
// event the backend keeps), wrapped or not, and nothing but that event is
// left on the driver at the end.
func TestStubPolicyLendsWithStreamWaits(t *testing.T) {
	for _, wrap := range []bool{false, true} {
		t.Run(map[bool]string{false: "bare", true: "wrapped"}[wrap], func(t *testing.T) {
			d := openStub(t)
			var dev device.Device = d
			if wrap {
				dev = faulty.New(d).Device()
			}
			a := gpumemtest.NewOn(t, dev, gpumemtest.WithConfig(lowFragmentation))
			s1, err := d.NewStream()
			require.NoError(t, err)
			s2, err := d.NewStream()
			require.NoError(t, err)
			p, err := a.Alloc(8*mib, s1)
			require.NoError(t, err)
			require.NoError(t, a.Free(p))
			q, err := a.Alloc(8*mib, s2)
			require.NoError(t, err)
			assert.Equal(t, p, q, "lent from s1's cache")
			assert.Equal(t, 1, cudastub.Calls("cuStreamWaitEvent"))
			require.NoError(t, a.Free(q))
			assert.Equal(t, 2, cudastub.Calls("cuStreamWaitEvent"), "the lender waits for the borrower")
			assert.Equal(t, 2, cudastub.Calls("cuEventRecord"), "one record per wait")
			assert.Equal(t, 1, cudastub.Calls("cuEventCreate"), "both waits record the same event")
			assert.Equal(t, 1, cudastub.Live("event"), "no event is left but the one the backend keeps until Close")
			assert.Positive(t, cudastub.Calls("cuMemMap"), "expandable segments on the driver's virtual memory")
			require.NoError(t, a.CheckInvariants())
			require.NoError(t, a.EmptyCache())
			assert.Zero(t, cudastub.Used())
		})
	}

	t.Run("no virtual memory", func(t *testing.T) {
		d := openStub(t, func() { cudastub.SetVirtualMemory(false) })
		a := gpumemtest.NewOn(t, d, gpumemtest.WithConfig(lowFragmentation))
		p, err := a.Alloc(3*mib, device.DefaultStream)
		require.NoError(t, err)
		require.NoError(t, a.Free(p))
		require.NoError(t, a.EmptyCache())
		assert.Zero(t, cudastub.Calls("cuMemMap"), "plain segments")
		assert.Positive(t, cudastub.Calls("cuMemAlloc"))
	})
}
