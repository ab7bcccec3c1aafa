// Tests of the address rule: where device memory and reservations are
// placed, on each ordinal, in a fragmented region.

package sim

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpumem/gpumem/device"
)

func TestRegionBases(t *testing.T) {
	assert.Equal(t, uint64(1)<<43, uint64(MemoryRegionSize))
	assert.Equal(t, uint64(1)<<50, uint64(VirtualRegionSize))
	for _, o := range []int{0, 1, 5, MaxOrdinal} {
		d := mustNew(t, Config{Ordinal: o, Capacity: GiB})
		assert.Equal(t, device.Ptr(o+1)<<44, d.MemoryBase())
		p := mustMalloc(t, d, 1)
		assert.Equal(t, device.Ptr(o+1)<<44, p, "ordinal %d malloc", o)
		r, err := d.Reserve(d.Granularity())
		require.NoError(t, err)
		assert.Equal(t, device.Ptr(1)<<56+device.Ptr(o)<<50, r, "ordinal %d reserve", o)
		assert.Equal(t, r, d.VirtualBase())
		// Reservations do not move device memory, nor the reverse.
		assert.Equal(t, p+device.Ptr(2*MiB), mustMalloc(t, d, 1))
		r2, err := d.Reserve(2 * d.Granularity())
		require.NoError(t, err)
		assert.Equal(t, r+device.Ptr(2*MiB), r2)
	}
}

func TestAddressRule(t *testing.T) {
	const page = 64 * KiB
	pg := func(n uint64) device.Ptr { return device.Ptr(n * page) }
	base := device.Ptr(1) << 44
	small := func(t *testing.T, pages uint64) *Device {
		return newDev(t, Config{Capacity: pages * page, PageSize: page})
	}

	t.Run("consecutive", func(t *testing.T) {
		d := small(t, 64)
		a := mustMalloc(t, d, page)
		b := mustMalloc(t, d, 2*page+1) // three pages
		c := mustMalloc(t, d, 7)
		assert.Equal(t, base, a)
		assert.Equal(t, base+pg(1), b)
		assert.Equal(t, base+pg(4), c)
		for _, p := range []device.Ptr{a, b, c} {
			assert.Zero(t, uint64(p)%page, "page aligned")
		}
	})

	t.Run("mixed sizes", func(t *testing.T) {
		d := newDev(t, Config{PageSize: 2 * MiB})
		at := func(pages uint64) device.Ptr { return d.MemoryBase() + device.Ptr(pages*2*MiB) }
		var ps []device.Ptr
		for _, size := range []uint64{2 * MiB, 4 * MiB, 2 * MiB, 6 * MiB, 2 * MiB} {
			ps = append(ps, mustMalloc(t, d, size))
		}
		// Pages: [0] [1 2] [3] [4 5 6] [7]
		assert.Equal(t, []device.Ptr{at(0), at(1), at(3), at(4), at(7)}, ps)
		require.NoError(t, d.Free(ps[1]))               // hole of 2 pages at 1
		require.NoError(t, d.Free(ps[3]))               // hole of 3 pages at 4
		assert.Equal(t, at(4), mustMalloc(t, d, 5*MiB)) // 3 pages: only the hole at 4 fits
		assert.Equal(t, at(1), mustMalloc(t, d, 1))     // lowest hole
		assert.Equal(t, at(8), mustMalloc(t, d, 4*MiB)) // no hole fits: the top
		require.NoError(t, d.Free(ps[2]))               // page 3 merges with free page 2
		assert.Equal(t, at(2), mustMalloc(t, d, 4*MiB), "freed neighbours merge into one hole")
	})

	t.Run("hole reused by a smaller request", func(t *testing.T) {
		d := small(t, 64)
		mustMalloc(t, d, page)
		b := mustMalloc(t, d, 3*page)
		c := mustMalloc(t, d, page)
		require.NoError(t, d.Free(b))
		assert.Equal(t, b, mustMalloc(t, d, page), "lowest hole first")
		assert.Equal(t, b+pg(1), mustMalloc(t, d, 1), "what is left of the hole")
		// One page left in the hole: two pages go above c.
		assert.Equal(t, c+pg(1), mustMalloc(t, d, 2*page))
		assert.Equal(t, b+pg(2), mustMalloc(t, d, page), "the last page of the hole")
	})

	t.Run("first fit, not best fit", func(t *testing.T) {
		d := small(t, 64)
		ps := mallocPages(t, d, 3, 1, 1, 1, 1, 1)
		mustFree(t, d, ps[0]) // a three-page hole at the bottom
		mustFree(t, d, ps[2]) // an exact one-page hole above it
		assert.Equal(t, ps[0], mustMalloc(t, d, page))
	})

	t.Run("lowest hole that fits, skipping smaller ones", func(t *testing.T) {
		d := small(t, 64)
		ps := mallocPages(t, d, 1, 1, 2, 1, 4, 1, 3, 1)
		mustFree(t, d, ps[0], ps[2], ps[4], ps[6]) // holes of 1, 2, 4 and 3 pages
		assert.Equal(t, ps[4], mustMalloc(t, d, 3*page), "the 4-page hole is the lowest that fits")
		assert.Equal(t, ps[6], mustMalloc(t, d, 3*page), "then the 3-page one")
		assert.Equal(t, ps[2], mustMalloc(t, d, 2*page))
		assert.Equal(t, ps[0], mustMalloc(t, d, page))
		assert.Equal(t, ps[4]+pg(3), mustMalloc(t, d, page))
		assert.Equal(t, ps[7]+pg(1), mustMalloc(t, d, page), "no hole left")
	})

	t.Run("free middle then neighbours", func(t *testing.T) {
		d := small(t, 64)
		ps := mallocPages(t, d, 1, 1, 1, 1, 1)
		mustFree(t, d, ps[2])
		mustFree(t, d, ps[1]) // merges with the hole above
		mustFree(t, d, ps[3]) // merges with the hole below
		// One hole of three pages: a three-page request fits there.
		assert.Equal(t, ps[1], mustMalloc(t, d, 3*page))
		assert.Equal(t, ps[4]+pg(1), mustMalloc(t, d, page))
	})

	t.Run("merge on both sides at once", func(t *testing.T) {
		d := small(t, 64)
		ps := mallocPages(t, d, 1, 1, 1, 1)
		mustFree(t, d, ps[0], ps[2])
		mustFree(t, d, ps[1]) // joins [0] and [2]
		assert.Equal(t, ps[0], mustMalloc(t, d, 3*page))
	})

	t.Run("top shrinks when the highest range is freed", func(t *testing.T) {
		d := small(t, 64)
		a := mustMalloc(t, d, page)
		b := mustMalloc(t, d, page)
		c := mustMalloc(t, d, page)
		require.NoError(t, d.Free(c))
		// c's pages are free again and contiguous with the space above.
		assert.Equal(t, c, mustMalloc(t, d, 10*page))
		require.NoError(t, d.Free(b))
		require.NoError(t, d.Free(c))
		assert.Equal(t, b, mustMalloc(t, d, 20*page))
		require.NoError(t, d.Free(a))
		require.NoError(t, d.Free(b))
		// Everything free: back to the base.
		assert.Equal(t, base, mustMalloc(t, d, 40*page))
	})

	t.Run("hole below the top merges into it", func(t *testing.T) {
		d := small(t, 64)
		mustMalloc(t, d, page)
		b := mustMalloc(t, d, page)
		c := mustMalloc(t, d, page)
		require.NoError(t, d.Free(b))
		require.NoError(t, d.Free(c)) // b's hole, c and the space above are one
		assert.Equal(t, b, mustMalloc(t, d, 5*page))
	})

	t.Run("address space is not bounded by capacity", func(t *testing.T) {
		d := small(t, 4)
		a := mustMalloc(t, d, page)
		b := mustMalloc(t, d, page)
		require.NoError(t, d.Free(a))
		// Three pages free in total but no two-page hole below b: the
		// allocation goes above b.
		assert.Equal(t, b+pg(1), mustMalloc(t, d, 2*page))
		// One page left, and a one-page hole at the bottom.
		assert.Equal(t, a, mustMalloc(t, d, 1))
		_, err := d.Malloc(1)
		require.ErrorIs(t, err, device.ErrOutOfMemory)
	})

	t.Run("every other page of a full device free", func(t *testing.T) {
		// Half is free but no two free pages touch: a two-page Malloc
		// still succeeds, above the others.
		d := small(t, 8)
		var ps []device.Ptr
		for range 8 {
			ps = append(ps, mustMalloc(t, d, page))
		}
		for i := 0; i < 8; i += 2 {
			require.NoError(t, d.Free(ps[i]))
		}
		assert.Equal(t, base+pg(8), mustMalloc(t, d, 2*page))
		free, _, _ := d.MemInfo()
		assert.Equal(t, 2*page, free)
	})
}

// TestFragmentedRegion: the 8 TiB region runs out of holes only when a
// device nearly as large as the region is fragmented on purpose; the
// Malloc then fails with ErrOutOfMemory and changes nothing.
func TestFragmentedRegion(t *testing.T) {
	const page = MaxPageSize // 1 GiB: the region holds 8192 pages
	d := newDev(t, Config{Ordinal: 1, Capacity: MaxCapacity, PageSize: page})
	base := d.MemoryBase()
	require.Equal(t, base, mustMalloc(t, d, page))
	b := mustMalloc(t, d, 4095*page)
	c := mustMalloc(t, d, page)
	require.Equal(t, base+4096*page, c)
	require.NoError(t, d.Free(b))
	// 8190 pages are free, but the largest free range is 4095 pages.
	before := stateOf(d)
	_, err := d.Malloc(4096 * page)
	requireDeviceError(t, err, "malloc", 1, device.ErrOutOfMemory)
	assert.Contains(t, err.Error(), "fragmented")
	requireUnchanged(t, d, before, failedMalloc)
	assert.Equal(t, base+page, mustMalloc(t, d, 4095*page), "the hole")
	assert.Equal(t, c+page, mustMalloc(t, d, 4095*page), "the rest of the region")
	free, _, err := d.MemInfo()
	require.NoError(t, err)
	assert.Zero(t, free)
}
