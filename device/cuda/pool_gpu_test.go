//go:build cuda

// pool_gpu_test.go: copies and the default memory pool on a real GPU;
// skipped on the stub driver and without a device.

package cuda

import (
	"bytes"
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpumem/gpumem/device"
)

// TestGPUCopyRoundTrip: bytes copied to device memory of each kind read
// back the same.
func TestGPUCopyRoundTrip(t *testing.T) {
	d := openGPU(t)
	src := bytes.Repeat([]byte("gpumem pool "), 100000)
	p, err := d.Malloc(uint64(len(src)) + 100)
	require.NoError(t, err)
	targets := []device.Ptr{p + 100}
	if d.MemoryPoolsSupported() {
		q, err := d.MallocAsync(uint64(len(src)), device.DefaultStream)
		require.NoError(t, err)
		targets = append(targets, q)
	}
	if g := d.Granularity(); g != 0 {
		r, err := d.Reserve(4 * g)
		require.NoError(t, err)
		require.NoError(t, d.Map(r, 4*g))
		targets = append(targets, r+device.Ptr(g)-7) // across a page boundary
	}
	for _, at := range targets {
		require.NoError(t, d.CopyFromHost(at, src))
		got := make([]byte, len(src))
		require.NoError(t, d.CopyToHost(got, at))
		assert.True(t, bytes.Equal(src, got), "round trip at %v", at)
	}
}

// TestGPUMemoryPool: the default pool's figures follow allocations, a
// maximal release threshold keeps memory across a synchronization, and
// trimming returns it.
func TestGPUMemoryPool(t *testing.T) {
	d := openGPU(t)
	if !d.MemoryPoolsSupported() {
		t.Skip("the device has no memory pools")
	}
	require.NoError(t, d.TrimPool(0))
	require.NoError(t, d.ResetPoolPeaks())
	require.NoError(t, d.SetReleaseThreshold(math.MaxUint64))
	t.Cleanup(func() { _ = d.SetReleaseThreshold(0) })
	s, err := d.NewStream()
	require.NoError(t, err)
	const size = 64 << 20
	p, err := d.MallocAsync(size, s)
	require.NoError(t, err)
	u, err := d.PoolUsage()
	require.NoError(t, err)
	t.Logf("after one 64 MiB block: %+v", u)
	assert.GreaterOrEqual(t, u.Used, uint64(size))
	assert.GreaterOrEqual(t, u.Reserved, u.Used)
	require.NoError(t, d.FreeAsync(p, s))
	require.NoError(t, d.Synchronize())
	u, err = d.PoolUsage()
	require.NoError(t, err)
	assert.Zero(t, u.Used)
	assert.GreaterOrEqual(t, u.Reserved, uint64(size), "the threshold keeps the memory")
	assert.GreaterOrEqual(t, u.UsedPeak, uint64(size))
	require.NoError(t, d.TrimPool(0))
	require.NoError(t, d.ResetPoolPeaks())
	u, err = d.PoolUsage()
	require.NoError(t, err)
	assert.Zero(t, u.Reserved, "trimmed")
	assert.Zero(t, u.UsedPeak, "peaks reset to the current values")
	_, err = d.MallocAsync(d.TotalMemory()+1<<30, s)
	require.ErrorIs(t, err, device.ErrOutOfMemory)
}
