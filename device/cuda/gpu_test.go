//go:build cuda

// gpu_test.go: tests and benchmarks on a real GPU; they skip when the
// loaded libcuda is the stub or no device is present.

package cuda

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

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
