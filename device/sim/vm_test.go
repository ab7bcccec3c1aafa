// Tests of reservations and the pages mapped into them.

package sim

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpumem/gpumem/device"
)

func TestReserveMapUnmapRelease(t *testing.T) {
	d := newDev(t, Config{Capacity: 16 * MiB, PageSize: 2 * MiB})
	vmBase := d.VirtualBase()

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
		{Ptr: r, Size: 6 * MiB, Charged: 6 * MiB},
		{Ptr: r + device.Ptr(10*MiB), Size: 2 * MiB, Charged: 2 * MiB},
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
		{Ptr: r, Size: 2 * MiB, Charged: 2 * MiB},
		{Ptr: r + device.Ptr(4*MiB), Size: 2 * MiB, Charged: 2 * MiB},
		{Ptr: r + device.Ptr(10*MiB), Size: 2 * MiB, Charged: 2 * MiB},
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

func TestReserve(t *testing.T) {
	const page = 2 << 20
	d := newDev(t, Config{Ordinal: 4, Capacity: 8 * page})
	vbase := device.Ptr(1)<<56 + device.Ptr(4)<<50
	assert.Equal(t, uint64(page), d.Granularity())
	for _, c := range []struct {
		size uint64
		err  error
	}{
		{0, device.ErrInvalidSize},
		{1, device.ErrInvalidArgument},
		{page - 1, device.ErrInvalidArgument},
		{page + 1, device.ErrInvalidArgument},
		{3 * page / 2, device.ErrInvalidArgument},
	} {
		before := stateOf(d)
		p, err := d.Reserve(c.size)
		assert.Zero(t, p)
		requireDeviceError(t, err, "reserve", 4, c.err)
		requireUnchanged(t, d, before, nil)
	}
	// Address space is not memory: reservations far beyond capacity are fine.
	a, err := d.Reserve(100 * page)
	require.NoError(t, err)
	assert.Equal(t, vbase, a)
	b, err := d.Reserve(page)
	require.NoError(t, err)
	assert.Equal(t, vbase+100*page, b)
	free, _, err := d.MemInfo()
	require.NoError(t, err)
	assert.Equal(t, 8*uint64(page), free, "reserving charges nothing")
	assert.Zero(t, d.BytesInUse())
	assert.Equal(t, []Reservation{{Ptr: a, Size: 100 * page}, {Ptr: b, Size: page}}, d.Reservations())

	// More than the region has left.
	for _, size := range []uint64{VirtualRegionSize, 1 << 51, ^uint64(0) - page + 1} {
		before := stateOf(d)
		_, err = d.Reserve(size)
		requireDeviceError(t, err, "reserve", 4, device.ErrOutOfMemory)
		requireUnchanged(t, d, before, nil)
	}

	// Release, then reuse by the same rule.
	require.NoError(t, d.Release(a))
	c, err := d.Reserve(10 * page)
	require.NoError(t, err)
	assert.Equal(t, vbase, c)
	e, err := d.Reserve(89 * page)
	require.NoError(t, err)
	assert.Equal(t, vbase+10*page, e, "fills what is left of the hole but a page")
	f, err := d.Reserve(2 * page)
	require.NoError(t, err)
	assert.Equal(t, b+page, f, "the one-page hole is too small")
	g, err := d.Reserve(page)
	require.NoError(t, err)
	assert.Equal(t, vbase+99*page, g)
	assert.Equal(t, int64(6), d.Counters().Reserves)
	assert.Equal(t, int64(1), d.Counters().Releases)
	// A whole empty region can be reserved at once.
	other := mustNew(t, Config{Capacity: GiB})
	whole, err := other.Reserve(VirtualRegionSize)
	require.NoError(t, err)
	assert.Equal(t, other.VirtualBase(), whole)
	_, err = other.Reserve(2 * MiB)
	require.ErrorIs(t, err, device.ErrOutOfMemory)
}

func TestMap(t *testing.T) {
	const page = 2 << 20
	d := newDev(t, Config{Ordinal: 1, Capacity: 8 * page})
	r, err := d.Reserve(6 * page)
	require.NoError(t, err)
	other, err := d.Reserve(2 * page)
	require.NoError(t, err)

	require.NoError(t, d.Map(r+page, 2*page))
	assert.Equal(t, uint64(2*page), d.BytesInUse())
	free, _, err := d.MemInfo()
	require.NoError(t, err)
	assert.Equal(t, uint64(6*page), free)
	assert.Empty(t, d.Allocations(), "mappings are not Malloc ranges")
	assert.Equal(t, []Range{{Ptr: r + page, Size: 2 * page, Charged: 2 * page}}, d.Mapped(r))
	assert.Equal(t, []Reservation{{Ptr: r, Size: 6 * page, Mapped: 2 * page}, {Ptr: other, Size: 2 * page}}, d.Reservations())
	assert.Nil(t, d.Mapped(r+page), "not a reservation's base")

	bad := []struct {
		name string
		p    device.Ptr
		size uint64
	}{
		{"misaligned pointer", r + 1, page},
		{"pointer misaligned by a small page", r + 4096, page},
		{"misaligned size", r, page + 1},
		{"size of one and a half pages", r, 3 * page / 2},
		{"zero size", r, 0},
		{"outside any reservation", r - 2*page, page},
		{"below the first reservation", r - page, page},
		{"device memory", device.Ptr(2) << 44, page},
		{"past the end", other + 2*page, page},
		{"overlapping the end of the last", other + page, 2 * page},
		{"spanning two reservations", r + 5*page, 2 * page},
		{"already mapped", r + page, page},
		{"partly mapped", r, 2 * page},
		{"overlapping the end of a mapping", r + 2*page, 2 * page},
		{"covering a mapping", r, 4 * page},
		{"huge size", r + page, ^uint64(0) - page + 1},
		{"huge size from the base", r, ^uint64(0) - page + 1},
		{"huge pointer", ^device.Ptr(0) - page + 1, page},
	}
	for _, c := range bad {
		t.Run("map "+c.name, func(t *testing.T) {
			before := stateOf(d)
			err := d.Map(c.p, c.size)
			requireDeviceError(t, err, "map", 1, device.ErrInvalidArgument)
			requireUnchanged(t, d, before, nil)
		})
	}

	// Mapping next to a mapping merges in Mapped.
	require.NoError(t, d.Map(r+3*page, page))
	assert.Equal(t, []Range{{Ptr: r + page, Size: 3 * page, Charged: 3 * page}}, d.Mapped(r))

	// Short of memory: nothing is mapped.
	mustMalloc(t, d, 4*page)
	before := stateOf(d)
	err = d.Map(r+4*page, 2*page)
	requireDeviceError(t, err, "map", 1, device.ErrOutOfMemory)
	assert.Contains(t, err.Error(), "4 MiB requested, 2 MiB free of 16 MiB")
	requireUnchanged(t, d, before, failedMap)
	require.ErrorIs(t, d.Unmap(r+4*page, page), device.ErrInvalidArgument, "nothing was mapped")
	require.NoError(t, d.Map(r+4*page, page), "exactly what is free")
	require.ErrorIs(t, d.Map(other, page), device.ErrOutOfMemory)
	_, err = d.Malloc(1)
	require.ErrorIs(t, err, device.ErrOutOfMemory, "Malloc and Map share the capacity")
	assert.Equal(t, uint64(8*page), d.BytesInUse())
	assert.Equal(t, uint64(8*page), d.Counters().PeakBytesInUse)
	assert.Equal(t, uint64(4*page), d.Counters().MappedBytes)
	assert.Equal(t, int64(2), d.Counters().FailedMaps)
}

func TestUnmapAndRelease(t *testing.T) {
	const page = 64 << 10
	d := newDev(t, Config{Ordinal: 2, Capacity: 16 * page, PageSize: page})
	r, err := d.Reserve(4 * page)
	require.NoError(t, err)
	next, err := d.Reserve(2 * page)
	require.NoError(t, err)
	require.NoError(t, d.Map(r, page))
	require.NoError(t, d.Map(r+2*page, 2*page))
	p := mustMalloc(t, d, page)

	for _, c := range []struct {
		name string
		p    device.Ptr
		size uint64
	}{
		{"partly mapped", r, 2 * page},
		{"partly mapped at the end", r + page, 3 * page},
		{"not mapped", r + page, page},
		{"never mapped reservation", next, page},
		{"across a gap", r, 4 * page},
		{"misaligned", r + 1, page},
		{"zero size", r, 0},
		{"outside", r + 6*page, page},
		{"across two reservations", r + 3*page, 2 * page},
		{"malloc memory", p, page},
		{"huge", r + 2*page, ^uint64(0) - page + 1},
	} {
		before := stateOf(d)
		requireDeviceError(t, d.Unmap(c.p, c.size), "unmap", 2, device.ErrInvalidArgument)
		requireUnchanged(t, d, before, nil)
	}

	// Release with mapped pages fails; so does releasing an inner address,
	// a Malloc address or an unknown one. A reservation is not a Malloc.
	before := stateOf(d)
	requireDeviceError(t, d.Release(r), "release", 2, device.ErrInvalidArgument)
	requireDeviceError(t, d.Release(r+page), "release", 2, device.ErrInvalidArgument)
	requireDeviceError(t, d.Release(p), "release", 2, device.ErrInvalidArgument)
	requireDeviceError(t, d.Release(0), "release", 2, device.ErrInvalidArgument)
	requireUnchanged(t, d, before, nil)
	require.ErrorIs(t, d.Free(r), device.ErrInvalidPointer)
	require.NoError(t, d.Free(p))
	require.NoError(t, d.Release(next))

	// Unmapping part of a mapping, or several mappings at once, is fine.
	require.NoError(t, d.Unmap(r+3*page, page))
	assert.Equal(t, uint64(2*page), d.BytesInUse())
	assert.Equal(t, []Range{{Ptr: r, Size: page, Charged: page}, {Ptr: r + 2*page, Size: page, Charged: page}}, d.Mapped(r))
	require.ErrorIs(t, d.Release(r), device.ErrInvalidArgument)
	require.NoError(t, d.Map(r+page, page))
	require.NoError(t, d.Unmap(r, 3*page), "three pages of three Maps")
	assert.Zero(t, d.BytesInUse())
	assert.Empty(t, d.Mapped(r))
	require.NoError(t, d.Release(r))
	require.ErrorIs(t, d.Release(r), device.ErrInvalidArgument, "released twice")
	require.ErrorIs(t, d.Map(r, page), device.ErrInvalidArgument, "released range")
	assert.Empty(t, d.Reservations())

	// The range is reused.
	r2, err := d.Reserve(2 * page)
	require.NoError(t, err)
	assert.Equal(t, r, r2)
	require.NoError(t, d.Map(r2, 2*page))
	c := d.Counters()
	assert.Equal(t, int64(4), c.Maps)
	assert.Equal(t, int64(2), c.Unmaps)
	assert.Equal(t, int64(2), c.Releases)
	assert.Equal(t, int64(3), c.Reserves)
}
