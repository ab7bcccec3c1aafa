//go:build cuda

// gpu_test.go: tests and benchmarks on a real GPU; they skip when the
// loaded libcuda is the stub or no device is present.

package cuda

import (
	"encoding/binary"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorgonia.org/cu"

	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/device/cuda/internal/cudastub"
	"github.com/gpumem/gpumem/device/internal/devicetest"
)

// openGPU opens device 0 of a real GPU or skips.
func openGPU(tb testing.TB) *Device {
	tb.Helper()
	if cudastub.Loaded() {
		tb.Skip("the stub driver is loaded, not a GPU's")
	}
	if !Available() {
		_, err := DeviceCount()
		tb.Skipf("no CUDA device: %v", err)
	}
	return open0(tb)
}

func TestGPUMallocFreeMemInfo(t *testing.T) {
	d := openGPU(t)
	t.Logf("device: %v", d)
	free0, total, err := d.MemInfo()
	require.NoError(t, err)
	assert.Equal(t, d.TotalMemory(), total, "cuMemGetInfo and cuDeviceTotalMem agree")
	assert.LessOrEqual(t, free0, total)

	const size = 256 << 20
	p, err := d.Malloc(size)
	require.NoError(t, err)
	assert.NotZero(t, p)
	free1, _, err := d.MemInfo()
	require.NoError(t, err)
	assert.GreaterOrEqual(t, free0-free1, uint64(size-(2<<20)), "free memory drops by the allocation")
	require.NoError(t, d.Free(p))
	free2, _, err := d.MemInfo()
	require.NoError(t, err)
	assert.Greater(t, free2, free1, "free memory comes back")
	assert.ErrorIs(t, d.Free(p), device.ErrInvalidPointer)

	_, err = d.Malloc(total + 1<<30)
	require.ErrorIs(t, err, device.ErrOutOfMemory)
	var de *device.Error
	require.ErrorAs(t, err, &de)
	assert.Equal(t, 2, de.Code)
	t.Logf("out of memory error: %v", err)
}

func TestGPUStreamsAndEvents(t *testing.T) {
	d := openGPU(t)
	s, err := d.NewStream()
	require.NoError(t, err)
	e, err := d.RecordEvent(s)
	require.NoError(t, err)
	require.NoError(t, d.SynchronizeEvent(e))
	done, err := d.EventDone(e)
	require.NoError(t, err)
	assert.True(t, done)
	require.NoError(t, d.SynchronizeStream(s))
	require.NoError(t, d.SynchronizeStream(device.DefaultStream))
	require.NoError(t, d.Synchronize())
	require.NoError(t, d.ReleaseEvent(e))
	assert.ErrorIs(t, d.ReleaseEvent(e), device.ErrInvalidEvent)
	assert.ErrorIs(t, d.SynchronizeStream(s+99), device.ErrInvalidStream)
}

// TestGPUWaitStream: a copy queued on stream b after WaitStream(b, a)
// reads what memsets queued on stream a before it wrote, though only b is
// synchronized (both streams are non-blocking, so nothing else orders
// them); waiting on oneself and on unknown streams behaves as documented.
func TestGPUWaitStream(t *testing.T) {
	d := openGPU(t)
	a, err := d.NewStream()
	require.NoError(t, err)
	b, err := d.NewStream()
	require.NoError(t, err)
	const n = 256 * mib
	src, err := d.Malloc(n)
	require.NoError(t, err)
	dst, err := d.Malloc(n)
	require.NoError(t, err)
	ca, err := d.DriverStream(a)
	require.NoError(t, err)
	cb, err := d.DriverStream(b)
	require.NoError(t, err)
	for round := uint(1); round <= 3; round++ {
		// Several passes over src keep a busy while b's copy is queued;
		// the last pass writes the value the copy must see.
		require.Equal(t, 0, d.call(func() int {
			for pass := uint(0); pass < 8; pass++ {
				if c := codeOf(cu.MemsetD32Async(DevicePtr(src), 100*round+pass, n/4, ca)); c != 0 {
					return c
				}
			}
			return 0
		}))
		require.NoError(t, d.WaitStream(b, a))
		require.Equal(t, 0, d.call(func() int { return codeOf(cu.MemcpyDtoDAsync(DevicePtr(dst), DevicePtr(src), n, cb)) }))
		require.NoError(t, d.SynchronizeStream(b))
		out := make([]byte, 4)
		require.NoError(t, d.CopyToHost(out, dst+n-4))
		assert.Equal(t, uint32(100*round+7), binary.LittleEndian.Uint32(out), "round %d: b's copy ran after a's memsets", round)
	}
	require.NoError(t, d.WaitStream(b, b))
	require.NoError(t, d.WaitStream(device.DefaultStream, b))
	assert.ErrorIs(t, d.WaitStream(b+99, a), device.ErrInvalidStream)
	assert.ErrorIs(t, d.WaitStream(a, b+99), device.ErrInvalidStream)
	require.NoError(t, d.Synchronize())
	require.NoError(t, d.Free(src))
	require.NoError(t, d.Free(dst))
}

func TestGPUVirtualMemory(t *testing.T) {
	d := openGPU(t)
	if !d.VirtualMemorySupported() {
		t.Skip("device without virtual memory management")
	}
	g := d.Granularity()
	t.Logf("granularity %d", g)
	base, err := d.Reserve(16 * g)
	require.NoError(t, err)
	free0, _, err := d.MemInfo()
	require.NoError(t, err)
	require.NoError(t, d.Map(base, 8*g))
	free1, _, err := d.MemInfo()
	require.NoError(t, err)
	assert.GreaterOrEqual(t, free0-free1, 8*g-g, "mapping uses physical memory")
	require.NoError(t, d.Unmap(base+device.Ptr(2*g), 4*g))
	require.ErrorIs(t, d.Release(base), device.ErrInvalidArgument)
	require.NoError(t, d.Unmap(base, 2*g))
	require.NoError(t, d.Unmap(base+device.Ptr(6*g), 2*g))
	require.NoError(t, d.Release(base))
}

func TestGPUHostMemory(t *testing.T) {
	d := openGPU(t)
	b, err := d.HostAlloc(1 << 20)
	require.NoError(t, err)
	for i := range b {
		b[i] = byte(i * 7)
	}
	assert.Equal(t, byte(1000*7%256), b[1000])
	require.NoError(t, d.HostFree(b))
	assert.ErrorIs(t, d.HostFree(b), device.ErrInvalidPointer)
}

// BenchmarkGPUDeviceMallocFree measures one cuMemAlloc plus cuMemFree of
// 1 MiB through the backend: the uncached cost the caching allocator saves.
func BenchmarkGPUDeviceMallocFree(b *testing.B) {
	d := openGPU(b)
	b.ReportAllocs()
	for b.Loop() {
		p, err := d.Malloc(1 << 20)
		if err != nil {
			b.Fatal(err)
		}
		if err := d.Free(p); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkGPUEventRecordQuery measures recording an event, querying it and
// releasing it, which the allocator does for blocks used across streams
// (device/sim's BenchmarkEventRecordQuery runs the same on the simulated
// device).
func BenchmarkGPUEventRecordQuery(b *testing.B) {
	devicetest.BenchEventRecordQuery(b, openGPU(b))
}
