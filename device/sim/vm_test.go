// Tests of reservations, mapping and pinned host memory.

package sim

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpumem/gpumem/device"
)

func TestReserveMapUnmapRelease(t *testing.T) {
	d := newDev(t, Config{Capacity: 16 * MiB, PageSize: 2 * MiB})
	vmBase := d.MemoryBase() + MemoryRegionSize

	r, err := d.Reserve(64 * MiB) // more than capacity: address space only
	require.NoError(t, err)
	assert.Equal(t, vmBase, r)
	r2, err := d.Reserve(4 * MiB)
	require.NoError(t, err)
	assert.Equal(t, vmBase+device.Ptr(64*MiB), r2, "reservations are first fit in their own region")
	free, _, _ := d.MemInfo()
	assert.Equal(t, 16*MiB, free, "reserving charges nothing")

	require.NoError(t, d.Map(r, 4*MiB))
	require.NoError(t, d.Map(r+device.Ptr(4*MiB), 2*MiB)) // touches the first: merges
	require.NoError(t, d.Map(r+device.Ptr(10*MiB), 2*MiB))
	assert.Equal(t, []Range{
		{Ptr: r, Size: 6 * MiB, Pages: 6 * MiB},
		{Ptr: r + device.Ptr(10*MiB), Size: 2 * MiB, Pages: 2 * MiB},
	}, d.Mapped(r))
	free, _, _ = d.MemInfo()
	assert.Equal(t, 8*MiB, free, "mapped pages are charged like Malloc pages")
	assert.Equal(t, []Reservation{{Ptr: r, Size: 64 * MiB, Mapped: 8 * MiB}, {Ptr: r2, Size: 4 * MiB}}, d.Reservations())

	// Malloc and Map share the capacity.
	p, err := d.Malloc(6 * MiB)
	require.NoError(t, err)
	err = d.Map(r+device.Ptr(20*MiB), 4*MiB)
	require.ErrorIs(t, err, device.ErrOutOfMemory)
	require.NoError(t, d.Free(p))

	// Unmap the middle page of the merged range, then the rest in pieces
	// that span what two Maps mapped.
	require.NoError(t, d.Unmap(r+device.Ptr(2*MiB), 2*MiB))
	assert.Equal(t, []Range{
		{Ptr: r, Size: 2 * MiB, Pages: 2 * MiB},
		{Ptr: r + device.Ptr(4*MiB), Size: 2 * MiB, Pages: 2 * MiB},
		{Ptr: r + device.Ptr(10*MiB), Size: 2 * MiB, Pages: 2 * MiB},
	}, d.Mapped(r))
	assert.ErrorIs(t, d.Release(r), device.ErrInvalidArgument, "pages still mapped")
	require.NoError(t, d.Unmap(r, 2*MiB))
	require.NoError(t, d.Unmap(r+device.Ptr(4*MiB), 2*MiB))
	require.NoError(t, d.Unmap(r+device.Ptr(10*MiB), 2*MiB))
	require.NoError(t, d.Release(r))
	require.NoError(t, d.Release(r2))
	assert.Empty(t, d.Reservations())
	assert.Nil(t, d.Mapped(r))

	c := d.Counters()
	assert.Equal(t, int64(2), c.Reserves)
	assert.Equal(t, int64(2), c.Releases)
	assert.Equal(t, int64(3), c.Maps)
	assert.Equal(t, int64(4), c.Unmaps)
	assert.Equal(t, int64(1), c.FailedMaps)
	assert.Zero(t, c.MappedBytes)
	assert.Zero(t, c.BytesInUse)
	assert.Equal(t, 14*MiB, c.PeakBytesInUse)

	again, err := d.Reserve(2 * MiB)
	require.NoError(t, err)
	assert.Equal(t, vmBase, again, "released address space is reused")
}

func TestVirtualMemoryMisuseChangesNothing(t *testing.T) {
	d := newDev(t, Config{Capacity: 64 * MiB, PageSize: 2 * MiB})
	r, err := d.Reserve(8 * MiB)
	require.NoError(t, err)
	next, err := d.Reserve(8 * MiB)
	require.NoError(t, err)
	require.NoError(t, d.Map(r+device.Ptr(2*MiB), 2*MiB))
	p, err := d.Malloc(2 * MiB)
	require.NoError(t, err)
	before := stateOf(d)

	_, err = d.Reserve(0)
	assert.ErrorIs(t, err, device.ErrInvalidSize)
	_, err = d.Reserve(3 * MiB)
	assert.ErrorIs(t, err, device.ErrInvalidArgument)
	_, err = d.Reserve(1 << 44)
	assert.ErrorIs(t, err, device.ErrOutOfMemory, "larger than the region")

	page := device.Ptr(2 * MiB)
	for name, c := range map[string]struct {
		p    device.Ptr
		size uint64
	}{
		"size 0":                 {r, 0},
		"misaligned address":     {r + 4096, 2 * MiB},
		"misaligned size":        {r, 3 * MiB},
		"outside reservations":   {p, 2 * MiB},
		"below the first":        {r - page, 2 * MiB},
		"past the end":           {next + 3*page, 4 * MiB},
		"across two":             {r + 3*page, 4 * MiB},
		"already mapped":         {r + page, 2 * MiB},
		"overlapping mapped":     {r, 4 * MiB},
		"huge size":              {r, ^uint64(0) &^ (2*MiB - 1)},
		"address past the space": {^device.Ptr(0) &^ (page - 1), 2 * MiB},
	} {
		assert.ErrorIs(t, d.Map(c.p, c.size), device.ErrInvalidArgument, "map: %s", name)
	}
	for name, c := range map[string]struct {
		p    device.Ptr
		size uint64
	}{
		"size 0":            {r, 0},
		"misaligned":        {r + 4096, 2 * MiB},
		"never mapped":      {r, 2 * MiB},
		"partly mapped":     {r + page, 4 * MiB},
		"other reservation": {next, 2 * MiB},
		"malloc memory":     {p, 2 * MiB},
	} {
		err := d.Unmap(c.p, c.size)
		assert.ErrorIs(t, err, device.ErrInvalidArgument, "unmap: %s", name)
		var de *device.Error
		assert.True(t, errors.As(err, &de))
	}
	for _, bad := range []device.Ptr{r + page, p, 0} {
		assert.ErrorIs(t, d.Release(bad), device.ErrInvalidArgument)
	}
	assert.ErrorIs(t, d.Release(r), device.ErrInvalidArgument, "mapped pages remain")
	assert.ErrorIs(t, d.Free(r), device.ErrInvalidPointer, "a reservation is not a Malloc")
	assert.Equal(t, before, stateOf(d))
}

func TestMapRunsOutOfMemoryAndMapsNothing(t *testing.T) {
	d := newDev(t, Config{Capacity: 8 * MiB, PageSize: 2 * MiB})
	r, _ := d.Reserve(32 * MiB)
	require.NoError(t, d.Map(r, 6*MiB))
	before := stateOf(d)
	err := d.Map(r+device.Ptr(6*MiB), 4*MiB)
	require.ErrorIs(t, err, device.ErrOutOfMemory)
	assert.Contains(t, err.Error(), "2 MiB free of 8 MiB")
	assert.Equal(t, before, stateOf(d))
	assert.Equal(t, int64(1), d.Counters().FailedMaps)
}

func TestHostMemory(t *testing.T) {
	d := newDev(t, Config{HostCapacity: 3 * MiB})
	b, err := d.HostAlloc(MiB)
	require.NoError(t, err)
	require.Len(t, b, int(MiB))
	b[0], b[len(b)-1] = 1, 2 // real memory
	c, err := d.HostAlloc(2 * MiB)
	require.NoError(t, err)
	assert.Equal(t, 3*MiB, d.Counters().HostBytesInUse)

	before := stateOf(d)
	_, err = d.HostAlloc(1)
	assert.ErrorIs(t, err, device.ErrOutOfMemory, "host capacity reached")
	_, err = d.HostAlloc(0)
	assert.ErrorIs(t, err, device.ErrInvalidSize)
	assert.ErrorIs(t, d.HostFree(nil), device.ErrInvalidPointer)
	assert.ErrorIs(t, d.HostFree(make([]byte, 10)), device.ErrInvalidPointer, "not from HostAlloc")
	assert.ErrorIs(t, d.HostFree(b[1:]), device.ErrInvalidPointer, "not the first byte")
	assert.Equal(t, before, stateOf(d))
	free, _, _ := d.MemInfo()
	assert.Equal(t, d.Capacity(), free, "host memory is not device memory")

	require.NoError(t, d.HostFree(b[:1]), "identified by the first byte")
	assert.ErrorIs(t, d.HostFree(b), device.ErrInvalidPointer, "double free")
	require.NoError(t, d.HostFree(c))
	counters := d.Counters()
	assert.Equal(t, int64(2), counters.HostAllocs)
	assert.Equal(t, int64(2), counters.HostFrees)
	assert.Zero(t, counters.HostBytesInUse)
}
