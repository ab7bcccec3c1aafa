//go:build cuda

// pool_stub_test.go: copies and the default memory pool on the stub
// driver: the calls reach the driver with the context current, bad
// arguments are refused before it, and a device without memory pools
// refuses the pool's calls.

package cuda

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/device/cuda/internal/cudadrv"
	"github.com/gpumem/gpumem/device/cuda/internal/cudastub"
)

func TestStubCopyRoundTrip(t *testing.T) {
	d := openStub(t)
	p, err := d.Malloc(mib)
	require.NoError(t, err)
	q, err := d.MallocAsync(4096, device.DefaultStream)
	require.NoError(t, err)
	r, err := d.Reserve(4 * mib)
	require.NoError(t, err)
	require.NoError(t, d.Map(r, 4*mib))
	for _, at := range []device.Ptr{p + 100, q + 1, r + device.Ptr(2*mib) - 3} { // the last spans two pages
		src := []byte("stream-ordered")
		require.NoError(t, d.CopyFromHost(at, src))
		got := make([]byte, len(src)+2)
		require.NoError(t, d.CopyToHost(got, at-1))
		assert.Equal(t, append(append([]byte{0}, src...), 0), got)
	}
	assert.Equal(t, 3, cudastub.Calls("cuMemcpyHtoD"))
	assert.Equal(t, 3, cudastub.Calls("cuMemcpyDtoH"))
	assert.Zero(t, cudastub.ContextFailures(), "each copy had the context current")

	// Freeing drops what was written: the same address reads zeros again.
	require.NoError(t, d.Free(p))
	assert.Equal(t, 2, cudastub.Live("write"))

	for name, c := range map[string]struct {
		at device.Ptr
		n  int
	}{
		"freed memory":        {p + 100, 4},
		"past the pool block": {q + 4090, 10},
		"unmapped page":       {r + device.Ptr(4*mib), 1},
		"null":                {0, 1},
	} {
		err := d.CopyToHost(make([]byte, c.n), c.at)
		requireDeviceError(t, err, device.ErrInvalidPointer, 0)
		err = d.CopyFromHost(c.at, bytes.Repeat([]byte{1}, c.n))
		requireDeviceError(t, err, device.ErrInvalidPointer, 0)
		_ = name
	}
	assert.Equal(t, 3, cudastub.Calls("cuMemcpyHtoD"), "refused before the driver")
	require.NoError(t, d.CopyToHost(nil, 0), "an empty copy")
}

func TestStubMemoryPool(t *testing.T) {
	d := openStub(t)
	require.True(t, d.MemoryPoolsSupported())
	s, err := d.NewStream()
	require.NoError(t, err)
	a, err := d.MallocAsync(3*mib, s)
	require.NoError(t, err)
	b, err := d.MallocAsync(mib, device.DefaultStream)
	require.NoError(t, err)
	u, err := d.PoolUsage()
	require.NoError(t, err)
	assert.Equal(t, device.PoolUsage{Reserved: 4 * mib, ReservedPeak: 4 * mib, Used: 4 * mib, UsedPeak: 4 * mib}, u)
	assert.Equal(t, uint64(4*mib), cudastub.Used(), "the pool's reservation is the device's")

	require.NoError(t, d.SetReleaseThreshold(^uint64(0)))
	require.NoError(t, d.FreeAsync(a, s))
	require.NoError(t, d.Synchronize())
	u, err = d.PoolUsage()
	require.NoError(t, err)
	assert.Equal(t, uint64(4*mib), u.Reserved, "the threshold keeps the memory")
	assert.Equal(t, uint64(mib), u.Used)

	require.NoError(t, d.TrimPool(0))
	require.NoError(t, d.ResetPoolPeaks())
	u, err = d.PoolUsage()
	require.NoError(t, err)
	assert.Equal(t, device.PoolUsage{Reserved: 2 * mib, ReservedPeak: 2 * mib, Used: mib, UsedPeak: mib}, u)

	require.NoError(t, d.SetReleaseThreshold(0))
	require.NoError(t, d.FreeAsync(b, device.DefaultStream))
	require.NoError(t, d.SynchronizeStream(device.DefaultStream))
	u, err = d.PoolUsage()
	require.NoError(t, err)
	assert.Zero(t, u.Reserved, "threshold 0: a synchronization returns everything")
	assert.Zero(t, cudastub.ContextFailures())

	// Bad arguments never reach the driver.
	calls := cudastub.Calls("cuMemFreeAsync")
	requireDeviceError(t, d.FreeAsync(b, device.DefaultStream), device.ErrInvalidPointer, 0)
	requireDeviceError(t, d.FreeAsync(a, 12345), device.ErrInvalidStream, 0)
	_, err = d.MallocAsync(0, s)
	requireDeviceError(t, err, device.ErrInvalidSize, 0)
	_, err = d.MallocAsync(1, 12345)
	requireDeviceError(t, err, device.ErrInvalidStream, 0)
	assert.Equal(t, calls, cudastub.Calls("cuMemFreeAsync"))

	// The driver's out of memory is the device's.
	_, err = d.MallocAsync(64<<30, s)
	requireDeviceError(t, err, device.ErrOutOfMemory, cudadrv.ErrOutOfMemory)
}

// TestStubCloseFreesPoolBlocks: Close frees the blocks still live.
func TestStubCloseFreesPoolBlocks(t *testing.T) {
	d := openStub(t)
	_, err := d.MallocAsync(mib, device.DefaultStream)
	require.NoError(t, err)
	require.Equal(t, 1, cudastub.Live("async"))
	require.NoError(t, d.Close())
	assert.Zero(t, cudastub.Live("async"))
}

func TestStubNoMemoryPools(t *testing.T) {
	d := openStub(t, func() { cudastub.SetMemoryPools(false) })
	assert.False(t, d.MemoryPoolsSupported())
	assert.Zero(t, cudastub.Calls("cuDeviceGetDefaultMemPool"))
	_, err := d.MallocAsync(mib, device.DefaultStream)
	requireDeviceError(t, err, device.ErrNotSupported, 0)
	for _, f := range []func() error{
		func() error { return d.FreeAsync(1, device.DefaultStream) },
		func() error { return d.SetReleaseThreshold(0) },
		func() error { return d.TrimPool(0) },
		func() error { _, err := d.PoolUsage(); return err },
		d.ResetPoolPeaks,
	} {
		requireDeviceError(t, f(), device.ErrNotSupported, 0)
	}
	assert.Zero(t, cudastub.Calls("cuMemAllocFromPoolAsync")+cudastub.Calls("cuMemPoolSetAttribute")+
		cudastub.Calls("cuMemPoolGetAttribute")+cudastub.Calls("cuMemPoolTrimTo")+cudastub.Calls("cuMemFreeAsync"))
}
