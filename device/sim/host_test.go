// Tests of pinned host memory.

package sim

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpumem/gpumem/device"
)

func TestHostMemory(t *testing.T) {
	d := newDev(t, Config{Ordinal: 6, Capacity: GiB, HostCapacity: 64 * KiB})
	b, err := d.HostAlloc(4096)
	require.NoError(t, err)
	require.Len(t, b, 4096)
	for i := range b { // real memory
		b[i] = byte(i)
	}
	for i := range b {
		require.Equal(t, byte(i), b[i])
	}
	assert.Zero(t, d.BytesInUse(), "host memory is not device memory")
	free, _, err := d.MemInfo()
	require.NoError(t, err)
	assert.Equal(t, d.Capacity(), free)
	assert.Equal(t, uint64(4096), d.Counters().HostBytesInUse)

	before := stateOf(d)
	_, err = d.HostAlloc(0)
	requireDeviceError(t, err, "host alloc", 6, device.ErrInvalidSize)
	for _, size := range []uint64{60*KiB + 1, 1 << 40, ^uint64(0)} {
		_, err := d.HostAlloc(size)
		requireDeviceError(t, err, "host alloc", 6, device.ErrOutOfMemory)
	}
	requireUnchanged(t, d, before, nil)
	c, err := d.HostAlloc(60 * KiB)
	require.NoError(t, err, "exactly what is left")
	assert.Equal(t, 64*KiB, d.Counters().HostBytesInUse)
	_, err = d.HostAlloc(1)
	require.ErrorIs(t, err, device.ErrOutOfMemory, "host capacity reached")

	otherDev := newDev(t, Config{Capacity: GiB})
	foreign, err := otherDev.HostAlloc(16)
	require.NoError(t, err)
	for name, s := range map[string][]byte{
		"nil":                nil,
		"empty":              b[:0],
		"go memory":          make([]byte, 4096),
		"tail":               b[1:],
		"other device's":     foreign,
		"copy of allocation": append([]byte(nil), c...),
	} {
		t.Run(name, func(t *testing.T) {
			before := stateOf(d)
			requireDeviceError(t, d.HostFree(s), "host free", 6, device.ErrInvalidPointer)
			requireUnchanged(t, d, before, nil)
		})
	}
	require.NoError(t, d.HostFree(b[:1]), "identified by the first byte")
	requireDeviceError(t, d.HostFree(b), "host free", 6, device.ErrInvalidPointer)
	// The freed bytes can be allocated again.
	b2, err := d.HostAlloc(4096)
	require.NoError(t, err)
	require.NoError(t, d.HostFree(b2))
	require.NoError(t, d.HostFree(c))
	cnt := d.Counters()
	assert.Equal(t, int64(3), cnt.HostAllocs)
	assert.Equal(t, int64(3), cnt.HostFrees)
	assert.Zero(t, cnt.HostBytesInUse)
	require.NoError(t, otherDev.HostFree(foreign))
}
