// Tests of the copy capability and the contents model.

package sim

import (
	"bytes"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpumem/gpumem/device"
)

func pattern(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = seed + byte(i*7)
	}
	return b
}

// TestCopyRoundTrip: bytes written to device memory read back the same,
// unwritten bytes read as zeros, and a write touching part of a content
// page leaves the rest of it alone; in Malloc ranges, mapped pages and
// pool blocks alike.
func TestCopyRoundTrip(t *testing.T) {
	d := newDev(t, Config{Capacity: 64 * MiB})
	p := mustMalloc(t, d, 3*MiB)
	r, err := d.Reserve(4 * MiB)
	require.NoError(t, err)
	require.NoError(t, d.Map(r+device.Ptr(2*MiB), 2*MiB))
	q, err := d.MallocAsync(10000, device.DefaultStream)
	require.NoError(t, err)
	for _, at := range []device.Ptr{p + 5, r + device.Ptr(2*MiB) + 4096, q + 5} {
		src := pattern(9000, byte(at))
		require.NoError(t, d.CopyFromHost(at, src))
		got := make([]byte, 9000+10)
		require.NoError(t, d.CopyToHost(got, at-5))
		assert.Equal(t, make([]byte, 5), got[:5], "unwritten bytes read as zeros")
		assert.True(t, bytes.Equal(src, got[5:9005]))
		assert.Equal(t, make([]byte, 5), got[9005:])
	}
	assert.Equal(t, 3*3, d.ContentPages(), "each 9000-byte write touches three 4 KiB pages")
	c := d.Counters()
	assert.Equal(t, int64(6), c.Copies)
	assert.Equal(t, uint64(3*9000+3*9010), c.CopiedBytes)
}

// TestCopyIsSparse: a large device keeps only the pages written, and
// writing zeros to pages never written stores nothing.
func TestCopyIsSparse(t *testing.T) {
	d := newDev(t, Config{Capacity: 6 * GiB})
	p := mustMalloc(t, d, 6*GiB)
	require.NoError(t, d.CopyFromHost(p+device.Ptr(5*GiB), []byte{1}))
	require.NoError(t, d.CopyFromHost(p, make([]byte, 1<<20)))
	assert.Equal(t, 1, d.ContentPages())
	got := make([]byte, 2)
	require.NoError(t, d.CopyToHost(got, p+device.Ptr(5*GiB)))
	assert.Equal(t, []byte{1, 0}, got)
}

// TestFreeingDropsContents: memory freed, unmapped or returned to the
// pool reads as zeros once it is handed out again.
func TestFreeingDropsContents(t *testing.T) {
	d := newDev(t, Config{Capacity: 64 * MiB})
	ones := bytes.Repeat([]byte{1}, 100)
	zeros := make([]byte, 100)
	read := func(p device.Ptr) []byte {
		got := make([]byte, 100)
		require.NoError(t, d.CopyToHost(got, p))
		return got
	}

	p := mustMalloc(t, d, MiB)
	require.NoError(t, d.CopyFromHost(p+50, ones))
	mustFree(t, d, p)
	assert.Zero(t, d.ContentPages())
	require.Equal(t, p, mustMalloc(t, d, MiB), "the same address again")
	assert.Equal(t, zeros, read(p+50))

	r, err := d.Reserve(2 * MiB)
	require.NoError(t, err)
	require.NoError(t, d.Map(r, 2*MiB))
	require.NoError(t, d.CopyFromHost(r, ones))
	require.NoError(t, d.Unmap(r, 2*MiB))
	require.NoError(t, d.Map(r, 2*MiB))
	assert.Equal(t, zeros, read(r))

	// Two pool blocks share a content page: freeing one zeroes its bytes
	// alone.
	a, err := d.MallocAsync(512, device.DefaultStream)
	require.NoError(t, err)
	b, err := d.MallocAsync(512, device.DefaultStream)
	require.NoError(t, err)
	require.Equal(t, a+512, b)
	require.NoError(t, d.CopyFromHost(a, ones))
	require.NoError(t, d.CopyFromHost(b, ones))
	require.NoError(t, d.FreeAsync(a, device.DefaultStream))
	assert.Equal(t, ones, read(b))
	a2, err := d.MallocAsync(512, device.DefaultStream)
	require.NoError(t, err)
	require.Equal(t, a, a2)
	assert.Equal(t, zeros, read(a))
}

// TestCopyOutsideHandedOutMemoryFails: a copy must lie inside one live
// allocation, mapped range or pool block; one that does not fails with a
// clear error and copies nothing.
func TestCopyOutsideHandedOutMemoryFails(t *testing.T) {
	d := newDev(t, Config{Capacity: 64 * MiB})
	p := mustMalloc(t, d, 3000) // one 2 MiB page charged, 3000 bytes handed out
	r, err := d.Reserve(4 * MiB)
	require.NoError(t, err)
	require.NoError(t, d.Map(r, 2*MiB))
	q, err := d.MallocAsync(1000, device.DefaultStream)
	require.NoError(t, err)
	freed := mustMalloc(t, d, 1000)
	mustFree(t, d, freed)
	buf := make([]byte, 100)
	for name, c := range map[string]struct {
		at       device.Ptr
		n        int
		sentinel error
	}{
		"past the allocation's bytes": {p + 2950, 100, device.ErrInvalidPointer},
		"before the allocation":       {p - 1, 10, device.ErrInvalidPointer},
		"null":                        {0, 10, device.ErrInvalidPointer},
		"freed memory":                {freed, 10, device.ErrInvalidPointer},
		"unmapped page":               {r + device.Ptr(2*MiB), 10, device.ErrInvalidPointer},
		"across the mapped end":       {r + device.Ptr(2*MiB) - 5, 10, device.ErrInvalidPointer},
		"past the pool block":         {q + 1000, 100, device.ErrInvalidPointer},
		"overflowing range":           {device.Ptr(^uint64(0) - 5), 10, device.ErrInvalidArgument},
	} {
		before := stateOf(d)
		err := d.CopyToHost(buf[:c.n], c.at)
		requireDeviceError(t, err, "copy to host", 0, c.sentinel)
		requireUnchanged(t, d, before, func(c *Counters) { c.FailedCopies++ })
		err = d.CopyFromHost(c.at, bytes.Repeat([]byte{9}, c.n))
		requireDeviceError(t, err, "copy from host", 0, c.sentinel)
		requireUnchanged(t, d, before, func(c *Counters) { c.FailedCopies += 2 })
		_ = name
	}
	require.NoError(t, d.CopyToHost(buf, p+2900), "the last bytes handed out")
	require.NoError(t, d.CopyToHost(nil, 0), "an empty copy")
}

// TestCopyCostsTime: a copy advances the clock by its fixed cost and its
// transfer time.
func TestCopyCostsTime(t *testing.T) {
	d := mustNew(t, Config{Capacity: 2 * GiB, Costs: Costs{Copy: 5, CopyPerGiB: time.Second}})
	p := mustMalloc(t, d, GiB)
	before := d.Clock()
	require.NoError(t, d.CopyFromHost(p, make([]byte, 256<<20)))
	assert.Equal(t, 5+time.Second/4, d.Clock()-before)
}
