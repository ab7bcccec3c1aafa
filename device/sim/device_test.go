// Black-box tests of the simulated device through its exported API:
// configuration, memory and the address rule, counters, costs, streams,
// events, faults, virtual memory, host memory and concurrent use.

package sim_test

import (
	"errors"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/device/sim"
)

const (
	kib = uint64(1) << 10
	mib = uint64(1) << 20
	gib = uint64(1) << 30
)

// The simulated device offers every capability.
var (
	_ device.Device        = (*sim.Device)(nil)
	_ device.VirtualMemory = (*sim.Device)(nil)
	_ device.HostMemory    = (*sim.Device)(nil)
)

// tb is what both *testing.T and *rapid.T offer.
type tb interface {
	Helper()
	require.TestingT
}

func newDevice(t tb, cfg sim.Config) *sim.Device {
	t.Helper()
	d, err := sim.New(cfg)
	require.NoError(t, err)
	return d
}

// small returns a device of pages pages of page bytes on which every call
// is free.
func small(t tb, pages, page uint64) *sim.Device {
	t.Helper()
	return newDevice(t, sim.Config{Capacity: pages * page, PageSize: page, Costs: sim.NoCosts()})
}

func mustMalloc(t tb, d *sim.Device, size uint64) device.Ptr {
	t.Helper()
	p, err := d.Malloc(size)
	require.NoError(t, err)
	return p
}

// snapshot is everything observable about a device's memory and work, to
// check that a failed call changed nothing it should not have.
type snapshot struct {
	free, total uint64
	inUse       uint64
	allocs      []sim.Range
	resv        []sim.Reservation
	mapped      map[device.Ptr][]sim.Range
	pending     []uint64 // per stream
	counters    sim.Counters
}

func snap(t tb, d *sim.Device) snapshot {
	t.Helper()
	s := snapshot{inUse: d.BytesInUse(), allocs: d.Allocations(), resv: d.Reservations(), mapped: map[device.Ptr][]sim.Range{}}
	for _, r := range s.resv {
		s.mapped[r.Ptr] = d.Mapped(r.Ptr)
	}
	for st := range d.Streams() {
		h := device.Stream(st) // stream handles: ordinal<<32 | n
		if st > 0 {
			h |= device.Stream(uint64(d.Ordinal()) << 32)
		}
		n, err := d.PendingWork(h)
		require.NoError(t, err)
		s.pending = append(s.pending, n)
	}
	var err error
	s.free, s.total, err = d.MemInfo()
	require.NoError(t, err)
	s.counters = d.Counters()
	return s
}

// requireUnchanged checks that nothing moved between two snapshots except
// the failure counters, which must have moved as failed says.
func requireUnchanged(t tb, before, after snapshot, failed func(c *sim.Counters)) {
	t.Helper()
	want := before.counters
	want.MemInfos++ // the second snapshot's own MemInfo
	if failed != nil {
		failed(&want)
	}
	require.Equal(t, want, after.counters, "counters")
	require.Equal(t, before.free, after.free, "free memory")
	require.Equal(t, before.total, after.total, "total memory")
	require.Equal(t, before.inUse, after.inUse, "bytes in use")
	require.Equal(t, before.allocs, after.allocs, "allocations")
	require.Equal(t, before.resv, after.resv, "reservations")
	require.Equal(t, before.mapped, after.mapped, "mapped pages")
	require.Equal(t, before.pending, after.pending, "pending work")
}

func failedMalloc(c *sim.Counters) { c.FailedMallocs++ }
func failedFree(c *sim.Counters)   { c.FailedFrees++ }
func failedMap(c *sim.Counters)    { c.FailedMaps++ }

func requireDeviceError(t tb, err error, op string, ordinal int, sentinel error) {
	t.Helper()
	require.ErrorIs(t, err, sentinel)
	var de *device.Error
	require.ErrorAs(t, err, &de)
	require.Equal(t, op, de.Op)
	require.Equal(t, ordinal, de.Device)
	require.Equal(t, sentinel, de.Err)
	require.NotEmpty(t, de.Message)
	require.Contains(t, err.Error(), op)
}

func TestNewDefaults(t *testing.T) {
	d := newDevice(t, sim.Config{})
	assert.Equal(t, 0, d.Ordinal())
	assert.Equal(t, sim.DefaultName, d.Name())
	assert.Equal(t, uint64(sim.DefaultCapacity), d.Capacity())
	assert.Equal(t, 80*gib, d.Capacity())
	assert.Equal(t, uint64(sim.DefaultPageSize), d.PageSize())
	assert.Equal(t, 2*mib, d.PageSize())
	assert.Equal(t, d.PageSize(), d.Granularity())
	assert.Equal(t, sim.DefaultCosts(), d.Costs())
	assert.Equal(t, device.Ptr(1)<<44, d.MemoryBase())
	free, total, err := d.MemInfo()
	require.NoError(t, err)
	assert.Equal(t, 80*gib, total)
	assert.Equal(t, 80*gib, free)
	assert.Contains(t, d.String(), sim.DefaultName)
	assert.Contains(t, d.String(), "80 GiB")
	assert.Equal(t, sim.Counters{MemInfos: 1}, d.Counters())
	assert.Empty(t, d.Allocations())
	assert.Empty(t, d.Reservations())
	assert.Equal(t, 1, d.Streams())
	// Host memory defaults to 4 GiB: more fails, without allocating it.
	_, err = d.HostAlloc(sim.DefaultHostCapacity + 1)
	require.ErrorIs(t, err, device.ErrOutOfMemory)
}

func TestNewKeepsConfig(t *testing.T) {
	d := newDevice(t, sim.Config{Ordinal: 7, Name: "test card", Capacity: 3*gib + 5, PageSize: 64 * kib})
	assert.Equal(t, 7, d.Ordinal())
	assert.Equal(t, "test card", d.Name())
	assert.Equal(t, 3*gib+5, d.Capacity())
	assert.Equal(t, 64*kib, d.PageSize())
	assert.Equal(t, 64*kib, d.Granularity())
	assert.Equal(t, device.Ptr(8)<<44, d.MemoryBase())
	_, total, err := d.MemInfo()
	require.NoError(t, err)
	assert.Equal(t, 3*gib+5, total)
	assert.Contains(t, d.String(), "test card")
}

func TestNewValidation(t *testing.T) {
	bad := []struct {
		name string
		cfg  sim.Config
	}{
		{"negative ordinal", sim.Config{Ordinal: -1}},
		{"ordinal above max", sim.Config{Ordinal: sim.MaxOrdinal + 1}},
		{"capacity above max", sim.Config{Capacity: sim.MaxCapacity + 1}},
		{"capacity far above max", sim.Config{Capacity: ^uint64(0)}},
		{"capacity below a page", sim.Config{Capacity: 2*mib - 1}},
		{"capacity below a small page", sim.Config{Capacity: 100, PageSize: 4096}},
		{"page not a power of two", sim.Config{PageSize: 3 * mib}},
		{"page of three bytes", sim.Config{PageSize: 3}},
		{"page of one byte", sim.Config{PageSize: 1}},
		{"page below min", sim.Config{PageSize: sim.MinPageSize / 2}},
		{"page above max", sim.Config{PageSize: sim.MaxPageSize * 2}},
		{"page of all ones", sim.Config{PageSize: ^uint64(0)}},
		{"host capacity above max", sim.Config{HostCapacity: sim.MaxHostCapacity + 1}},
	}
	for _, c := range bad {
		t.Run(c.name, func(t *testing.T) {
			d, err := sim.New(c.cfg)
			require.ErrorIs(t, err, device.ErrInvalidArgument)
			assert.Nil(t, d)
			assert.True(t, strings.HasPrefix(err.Error(), "sim: "), err.Error())
		})
	}
	good := []sim.Config{
		{Ordinal: sim.MaxOrdinal},
		{Capacity: sim.MaxCapacity},
		{PageSize: sim.MinPageSize},
		{PageSize: sim.MaxPageSize, Capacity: sim.MaxPageSize},
		{Capacity: 4096, PageSize: 4096},
		{Capacity: 4097, PageSize: 4096},
		{HostCapacity: sim.MaxHostCapacity},
	}
	for _, cfg := range good {
		d, err := sim.New(cfg)
		require.NoError(t, err, "%+v", cfg)
		require.NotNil(t, d)
	}
}

func TestMallocChargesWholePages(t *testing.T) {
	d := small(t, 8, 2*mib)
	cases := []struct {
		size, charged uint64
	}{
		{1, 2 * mib},
		{2 * mib, 2 * mib},
		{2*mib + 1, 4 * mib},
		{512, 2 * mib},
	}
	var want uint64
	for _, c := range cases {
		p := mustMalloc(t, d, c.size)
		want += c.charged
		assert.Equal(t, want, d.BytesInUse())
		free, total, err := d.MemInfo()
		require.NoError(t, err)
		assert.Equal(t, 16*mib, total)
		assert.Equal(t, 16*mib-want, free, "free = capacity - charged")
		allocs := d.Allocations()
		r := allocs[len(allocs)-1]
		assert.Equal(t, sim.Range{Ptr: p, Size: c.size, Pages: c.charged}, r)
		assert.Equal(t, p+device.Ptr(c.charged), r.End())
	}
	c := d.Counters()
	assert.Equal(t, want, c.BytesInUse)
	assert.Equal(t, want, c.PeakBytesInUse)
	assert.Equal(t, int64(len(cases)), c.Mallocs)
}

func TestMallocOutOfMemory(t *testing.T) {
	d := newDevice(t, sim.Config{Ordinal: 3, Capacity: 8 * mib, PageSize: 2 * mib, Costs: sim.NoCosts()})
	mustMalloc(t, d, 5*mib) // three pages

	for _, size := range []uint64{2*mib + 1, 4 * mib, 9 * mib, sim.MaxCapacity, ^uint64(0) - 2*mib - 1} {
		before := snap(t, d)
		p, err := d.Malloc(size)
		assert.Zero(t, p)
		requireDeviceError(t, err, "malloc", 3, device.ErrOutOfMemory)
		requireUnchanged(t, before, snap(t, d), failedMalloc)
	}
	// Exactly what is free fits.
	mustMalloc(t, d, 2*mib)
	free, _, err := d.MemInfo()
	require.NoError(t, err)
	assert.Zero(t, free)
	_, err = d.Malloc(1)
	require.ErrorIs(t, err, device.ErrOutOfMemory)
}

func TestMallocInvalidSize(t *testing.T) {
	d := newDevice(t, sim.Config{Ordinal: 5, Capacity: 4 * 4096, PageSize: 4096, Costs: sim.NoCosts()})
	mustMalloc(t, d, 10)
	// Zero, and sizes whose rounding to pages overflows.
	for _, size := range []uint64{0, ^uint64(0), ^uint64(0) - 4094} {
		before := snap(t, d)
		p, err := d.Malloc(size)
		assert.Zero(t, p)
		requireDeviceError(t, err, "malloc", 5, device.ErrInvalidSize)
		requireUnchanged(t, before, snap(t, d), failedMalloc)
	}
}

func TestFreeInvalidPointer(t *testing.T) {
	d := newDevice(t, sim.Config{Ordinal: 2, Capacity: 16 * mib, PageSize: 2 * mib, Costs: sim.NoCosts()})
	a := mustMalloc(t, d, 4*mib)
	b := mustMalloc(t, d, 1)
	require.NoError(t, d.Free(b))
	r, err := d.Reserve(2 * mib)
	require.NoError(t, err)
	require.NoError(t, d.Map(r, 2*mib))

	for name, p := range map[string]device.Ptr{
		"null":           0,
		"double free":    b,
		"inside":         a + device.Ptr(2*mib),
		"off by one":     a + 1,
		"other ordinal":  device.Ptr(1) << 44,
		"far away":       ^device.Ptr(0),
		"never returned": b + device.Ptr(8*mib),
		"a reservation":  r,
	} {
		t.Run(name, func(t *testing.T) {
			before := snap(t, d)
			err := d.Free(p)
			requireDeviceError(t, err, "free", 2, device.ErrInvalidPointer)
			requireUnchanged(t, before, snap(t, d), failedFree)
		})
	}
	require.NoError(t, d.Free(a))
	assert.Equal(t, 2*mib, d.BytesInUse(), "the mapped page")
}

func TestFreeReturnsPages(t *testing.T) {
	d := small(t, 4, 2*mib)
	a := mustMalloc(t, d, 3*mib)
	b := mustMalloc(t, d, 1)
	require.NoError(t, d.Free(a))
	assert.Equal(t, 2*mib, d.BytesInUse())
	assert.Equal(t, []sim.Range{{Ptr: b, Size: 1, Pages: 2 * mib}}, d.Allocations())
	free, _, err := d.MemInfo()
	require.NoError(t, err)
	assert.Equal(t, 6*mib, free)
	require.NoError(t, d.Free(b))
	free, _, err = d.MemInfo()
	require.NoError(t, err)
	assert.Equal(t, 8*mib, free)
	c := d.Counters()
	assert.Equal(t, int64(2), c.Frees)
	assert.Equal(t, 6*mib, c.PeakBytesInUse)
	assert.Zero(t, c.BytesInUse)
}

func TestRegionBases(t *testing.T) {
	assert.Equal(t, uint64(1)<<43, uint64(sim.MemoryRegionSize))
	for _, o := range []int{0, 1, 5, sim.MaxOrdinal} {
		d := newDevice(t, sim.Config{Ordinal: o, Capacity: gib})
		assert.Equal(t, device.Ptr(o+1)<<44, d.MemoryBase())
		p := mustMalloc(t, d, 1)
		assert.Equal(t, device.Ptr(o+1)<<44, p, "ordinal %d malloc", o)
		r, err := d.Reserve(d.Granularity())
		require.NoError(t, err)
		assert.Equal(t, device.Ptr(o+1)<<44+device.Ptr(1)<<43, r, "ordinal %d reserve", o)
		// Reservations do not move device memory, nor the reverse.
		assert.Equal(t, p+device.Ptr(2*mib), mustMalloc(t, d, 1))
		r2, err := d.Reserve(2 * d.Granularity())
		require.NoError(t, err)
		assert.Equal(t, r+device.Ptr(2*mib), r2)
	}
}

func TestAddressRule(t *testing.T) {
	const page = 64 * kib
	pg := func(n uint64) device.Ptr { return device.Ptr(n * page) }
	base := device.Ptr(1) << 44

	t.Run("consecutive", func(t *testing.T) {
		d := small(t, 64, page)
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

	t.Run("hole reused by a smaller request", func(t *testing.T) {
		d := small(t, 64, page)
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
		d := small(t, 64, page)
		ps := make([]device.Ptr, 6)
		sizes := []uint64{3, 1, 1, 1, 1, 1}
		for i := range ps {
			ps[i] = mustMalloc(t, d, sizes[i]*page)
		}
		require.NoError(t, d.Free(ps[0])) // a three-page hole at the bottom
		require.NoError(t, d.Free(ps[2])) // an exact one-page hole above it
		assert.Equal(t, ps[0], mustMalloc(t, d, page))
	})

	t.Run("lowest hole that fits, skipping smaller ones", func(t *testing.T) {
		d := small(t, 64, page)
		ps := make([]device.Ptr, 8)
		sizes := []uint64{1, 1, 2, 1, 4, 1, 3, 1}
		for i := range ps {
			ps[i] = mustMalloc(t, d, sizes[i]*page)
		}
		for _, i := range []int{0, 2, 4, 6} { // holes of 1, 2, 4 and 3 pages
			require.NoError(t, d.Free(ps[i]))
		}
		assert.Equal(t, ps[4], mustMalloc(t, d, 3*page), "the 4-page hole is the lowest that fits")
		assert.Equal(t, ps[6], mustMalloc(t, d, 3*page), "then the 3-page one")
		assert.Equal(t, ps[2], mustMalloc(t, d, 2*page))
		assert.Equal(t, ps[0], mustMalloc(t, d, page))
		assert.Equal(t, ps[4]+pg(3), mustMalloc(t, d, page))
		assert.Equal(t, ps[7]+pg(1), mustMalloc(t, d, page), "no hole left")
	})

	t.Run("free middle then neighbours", func(t *testing.T) {
		d := small(t, 64, page)
		ps := make([]device.Ptr, 5)
		for i := range ps {
			ps[i] = mustMalloc(t, d, page)
		}
		require.NoError(t, d.Free(ps[2]))
		require.NoError(t, d.Free(ps[1])) // merges with the hole above
		require.NoError(t, d.Free(ps[3])) // merges with the hole below
		// One hole of three pages: a three-page request fits there.
		assert.Equal(t, ps[1], mustMalloc(t, d, 3*page))
		assert.Equal(t, ps[4]+pg(1), mustMalloc(t, d, page))
	})

	t.Run("merge on both sides at once", func(t *testing.T) {
		d := small(t, 64, page)
		ps := make([]device.Ptr, 4)
		for i := range ps {
			ps[i] = mustMalloc(t, d, page)
		}
		require.NoError(t, d.Free(ps[0]))
		require.NoError(t, d.Free(ps[2]))
		require.NoError(t, d.Free(ps[1])) // joins [0] and [2]
		assert.Equal(t, ps[0], mustMalloc(t, d, 3*page))
	})

	t.Run("top shrinks when the highest range is freed", func(t *testing.T) {
		d := small(t, 64, page)
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
		d := small(t, 64, page)
		mustMalloc(t, d, page)
		b := mustMalloc(t, d, page)
		c := mustMalloc(t, d, page)
		require.NoError(t, d.Free(b))
		require.NoError(t, d.Free(c)) // b's hole, c and the space above are one
		assert.Equal(t, b, mustMalloc(t, d, 5*page))
	})

	t.Run("address space is not bounded by capacity", func(t *testing.T) {
		d := small(t, 4, page)
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
}

// TestFragmentedRegion: the 8 TiB region runs out of holes only when a
// device nearly as large as the region is fragmented on purpose; the
// Malloc then fails with ErrOutOfMemory and changes nothing.
func TestFragmentedRegion(t *testing.T) {
	const page = sim.MaxPageSize // 1 GiB: the region holds 8192 pages
	d := newDevice(t, sim.Config{Ordinal: 1, Capacity: sim.MaxCapacity, PageSize: page, Costs: sim.NoCosts()})
	base := d.MemoryBase()
	require.Equal(t, base, mustMalloc(t, d, page))
	b := mustMalloc(t, d, 4095*page)
	c := mustMalloc(t, d, page)
	require.Equal(t, base+4096*page, c)
	require.NoError(t, d.Free(b))
	// 8190 pages are free, but the largest free range is 4095 pages.
	before := snap(t, d)
	_, err := d.Malloc(4096 * page)
	requireDeviceError(t, err, "malloc", 1, device.ErrOutOfMemory)
	assert.Contains(t, err.Error(), "fragmented")
	requireUnchanged(t, before, snap(t, d), failedMalloc)
	assert.Equal(t, base+page, mustMalloc(t, d, 4095*page), "the hole")
	assert.Equal(t, c+page, mustMalloc(t, d, 4095*page), "the rest of the region")
	free, _, err := d.MemInfo()
	require.NoError(t, err)
	assert.Zero(t, free)
}

// refSpace is the naive model of the address rule: a sorted list of free
// ranges searched from the lowest address.
type refSpace struct{ free [][2]uint64 } // {start, size}

func newRefSpace(base, size uint64) *refSpace {
	return &refSpace{free: [][2]uint64{{base, size}}}
}

func (r *refSpace) take(size uint64) (uint64, bool) {
	for i, f := range r.free {
		if f[1] >= size {
			if f[1] == size {
				r.free = append(r.free[:i], r.free[i+1:]...)
			} else {
				r.free[i] = [2]uint64{f[0] + size, f[1] - size}
			}
			return f[0], true
		}
	}
	return 0, false
}

func (r *refSpace) give(start, size uint64) {
	i := 0
	for i < len(r.free) && r.free[i][0] < start {
		i++
	}
	r.free = append(r.free, [2]uint64{})
	copy(r.free[i+1:], r.free[i:])
	r.free[i] = [2]uint64{start, size}
	// Merge with the next range, then with the previous one.
	if i+1 < len(r.free) && r.free[i][0]+r.free[i][1] == r.free[i+1][0] {
		r.free[i][1] += r.free[i+1][1]
		r.free = append(r.free[:i+1], r.free[i+2:]...)
	}
	if i > 0 && r.free[i-1][0]+r.free[i-1][1] == r.free[i][0] {
		r.free[i-1][1] += r.free[i][1]
		r.free = append(r.free[:i], r.free[i+1:]...)
	}
}

// TestDeterminism runs one random call sequence on two devices and on the
// reference model: same addresses, same state, same clock.
func TestDeterminism(t *testing.T) {
	const page = 2 * mib
	run := func() ([]device.Ptr, []sim.Range, sim.Counters, time.Duration) {
		d := newDevice(t, sim.Config{Capacity: 512 * page})
		ref := newRefSpace(1<<44, 1<<43)
		rng := rand.New(rand.NewPCG(1, 2))
		var live []sim.Range
		var got []device.Ptr
		for range 3000 {
			if len(live) > 0 && rng.IntN(5) < 2 {
				i := rng.IntN(len(live))
				require.NoError(t, d.Free(live[i].Ptr))
				ref.give(uint64(live[i].Ptr), live[i].Pages)
				live = append(live[:i], live[i+1:]...)
				continue
			}
			size := 1 + rng.Uint64N(8*page)
			p, err := d.Malloc(size)
			if errors.Is(err, device.ErrOutOfMemory) {
				continue
			}
			require.NoError(t, err)
			pages := (size + page - 1) / page * page
			want, ok := ref.take(pages)
			require.True(t, ok)
			require.Equal(t, device.Ptr(want), p)
			live = append(live, sim.Range{Ptr: p, Size: size, Pages: pages})
			got = append(got, p)
		}
		return got, d.Allocations(), d.Counters(), d.Clock()
	}
	a1, r1, c1, k1 := run()
	a2, r2, c2, k2 := run()
	require.Greater(t, len(a1), 1000)
	require.Positive(t, c1.FailedMallocs, "the sequence ran the device full")
	assert.Equal(t, a1, a2)
	assert.Equal(t, r1, r2)
	assert.Equal(t, c1, c2)
	assert.Equal(t, k1, k2)
	assert.Positive(t, k1)
}

func TestCounters(t *testing.T) {
	d := small(t, 8, 2*mib)
	a := mustMalloc(t, d, 3*mib)
	mustMalloc(t, d, 1)
	_, err := d.Malloc(16 * mib)
	require.Error(t, err)
	_, err = d.Malloc(0)
	require.Error(t, err)
	require.NoError(t, d.Free(a))
	require.Error(t, d.Free(a))
	mustMalloc(t, d, 2*mib)

	require.NoError(t, d.Synchronize())
	s1, err := d.NewStream()
	require.NoError(t, err)
	_, err = d.NewStream()
	require.NoError(t, err)
	require.NoError(t, d.SynchronizeStream(s1))
	require.Error(t, d.SynchronizeStream(9))
	e1, err := d.RecordEvent(s1)
	require.NoError(t, err)
	e2, err := d.RecordEvent(device.DefaultStream)
	require.NoError(t, err)
	for range 3 {
		_, err = d.EventDone(e1)
		require.NoError(t, err)
	}
	require.NoError(t, d.SynchronizeEvent(e1))
	require.NoError(t, d.ReleaseEvent(e2))
	for range 2 {
		_, _, err = d.MemInfo()
		require.NoError(t, err)
	}

	r, err := d.Reserve(14 * mib)
	require.NoError(t, err)
	require.NoError(t, d.Map(r, 4*mib))
	require.ErrorIs(t, d.Map(r+device.Ptr(4*mib), 10*mib), device.ErrOutOfMemory)
	require.ErrorIs(t, d.Map(r, 2*mib), device.ErrInvalidArgument, "counts nothing")
	require.NoError(t, d.Unmap(r, 2*mib))
	require.ErrorIs(t, d.Release(r), device.ErrInvalidArgument, "counts nothing")
	h, err := d.HostAlloc(100)
	require.NoError(t, err)
	h2, err := d.HostAlloc(50)
	require.NoError(t, err)
	require.NoError(t, d.HostFree(h))

	got := d.Counters()
	assert.Equal(t, sim.Counters{
		Mallocs:                3,
		Frees:                  1,
		FailedMallocs:          2,
		FailedFrees:            1,
		BytesInUse:             4*mib + 2*mib, // two mallocs and one mapped page
		PeakBytesInUse:         4*mib + 4*mib, // two mallocs and two mapped pages
		Synchronizations:       2,             // Free and Synchronize
		EventsRecorded:         2,
		EventsReleased:         1,
		EventQueries:           3,
		StreamsCreated:         2,
		Maps:                   1,
		Unmaps:                 1,
		Reserves:               1,
		Releases:               0,
		MemInfos:               2,
		StreamSynchronizations: 1,
		EventSynchronizations:  1,
		FailedMaps:             1,
		MappedBytes:            2 * mib,
		HostAllocs:             2,
		HostFrees:              1,
		HostBytesInUse:         uint64(len(h2)),
	}, got)
	assert.Equal(t, got.BytesInUse, d.BytesInUse())
}

func TestPeakBytesInUse(t *testing.T) {
	d := small(t, 16, 4096)
	a := mustMalloc(t, d, 5*4096)
	b := mustMalloc(t, d, 3*4096)
	require.NoError(t, d.Free(a))
	mustMalloc(t, d, 4096)
	assert.Equal(t, uint64(8*4096), d.Counters().PeakBytesInUse)
	require.NoError(t, d.Free(b))
	mustMalloc(t, d, 10*4096)
	assert.Equal(t, uint64(11*4096), d.Counters().PeakBytesInUse)
	assert.Equal(t, uint64(11*4096), d.Counters().BytesInUse)
}

// testCosts gives every call a distinct cost.
func testCosts() sim.Costs {
	return sim.Costs{
		Malloc:            1000,
		MallocPerGiB:      1 << 20, // 1 ns per KiB
		Free:              3,
		MemInfo:           5,
		Synchronize:       7,
		StreamSynchronize: 53,
		StreamCreate:      11,
		EventRecord:       13,
		EventQuery:        17,
		EventSynchronize:  19,
		EventRelease:      23,
		Reserve:           29,
		Release:           31,
		Map:               37,
		Unmap:             41,
		HostAlloc:         43,
		HostAllocPerGiB:   2 << 20, // 2 ns per KiB
		HostFree:          47,
	}
}

func TestCosts(t *testing.T) {
	const page = 64 * kib
	d := newDevice(t, sim.Config{Capacity: 64 * page, PageSize: page, Costs: testCosts()})
	require.Equal(t, testCosts(), d.Costs())
	require.Zero(t, d.Clock())
	step := func(name string, want time.Duration, call func() error) {
		t.Helper()
		before := d.Clock()
		require.NoError(t, call(), name)
		assert.Equal(t, want, d.Clock()-before, name)
	}
	var p device.Ptr
	var s device.Stream
	var e device.Event
	var r device.Ptr
	var h []byte
	step("malloc of one page", 1000+64, func() (err error) { p, err = d.Malloc(page); return })
	step("malloc of three pages", 1000+3*64, func() (err error) { _, err = d.Malloc(3 * page); return })
	step("free: free plus a synchronization", 3+7, func() error { return d.Free(p) })
	step("meminfo", 5, func() error { _, _, err := d.MemInfo(); return err })
	step("synchronize", 7, d.Synchronize)
	step("new stream", 11, func() (err error) { s, err = d.NewStream(); return })
	step("synchronize stream", 53, func() error { return d.SynchronizeStream(s) })
	step("record event", 13, func() (err error) { e, err = d.RecordEvent(s); return })
	step("event query", 17, func() error { _, err := d.EventDone(e); return err })
	step("synchronize event", 19, func() error { return d.SynchronizeEvent(e) })
	step("release event", 23, func() error { return d.ReleaseEvent(e) })
	step("reserve", 29, func() (err error) { r, err = d.Reserve(8 * page); return })
	step("map of three pages", 3*37, func() error { return d.Map(r, 3*page) })
	step("unmap of two pages", 2*41, func() error { return d.Unmap(r+device.Ptr(page), 2*page) })
	step("unmap of one page", 41, func() error { return d.Unmap(r, page) })
	step("release", 31, func() error { return d.Release(r) })
	step("host alloc of 1 MiB", 43+2*1024, func() (err error) { h, err = d.HostAlloc(mib); return })
	step("host free", 47, func() error { return d.HostFree(h) })

	// Test controls and read-only methods cost nothing.
	step("controls", 0, func() error {
		_ = d.Counters()
		_ = d.Allocations()
		_ = d.BytesInUse()
		_ = d.Reservations()
		_ = d.HasStream(s)
		_, err := d.PendingWork(s)
		require.NoError(t, err)
		d.FailNthMalloc(0)
		d.FailMallocAbove(0)
		d.FailMallocWhen(nil)
		d.FailFrees(nil)
		d.FailEventQueries(nil)
		require.NoError(t, d.SetStreamBusy(s, true))
		require.NoError(t, d.CompleteStream(s))
		return d.SetStreamBusy(s, false)
	})
}

// TestMallocCostIsPerChargedByte: MallocPerGiB applies to the bytes
// charged (whole pages), as a real cudaMalloc maps whole pages, not to the
// bytes asked for.
func TestMallocCostIsPerChargedByte(t *testing.T) {
	const page = 64 * kib
	d := newDevice(t, sim.Config{Capacity: 64 * page, PageSize: page, Costs: testCosts()})
	for _, c := range []struct {
		size    uint64
		charged uint64
	}{{1, page}, {page - 1, page}, {page, page}, {page + 1, 2 * page}, {5*page + 7, 6 * page}} {
		before := d.Clock()
		p := mustMalloc(t, d, c.size)
		assert.Equal(t, time.Duration(1000+c.charged/kib), d.Clock()-before, "malloc of %d bytes", c.size)
		require.NoError(t, d.Free(p))
	}
}

// TestCostsOfFailedCalls: a failed call costs its call, as a failed driver
// call takes time too; a failed Free does not synchronize.
func TestCostsOfFailedCalls(t *testing.T) {
	const page = 64 * kib
	d := newDevice(t, sim.Config{Capacity: 4 * page, PageSize: page, Costs: testCosts()})
	fails := func(name string, want time.Duration, call func() error) {
		t.Helper()
		before := d.Clock()
		require.Error(t, call(), name)
		assert.Equal(t, want, d.Clock()-before, name)
	}
	fails("malloc of size 0", 1000, func() error { _, err := d.Malloc(0); return err })
	fails("malloc beyond capacity", 1000+5*64, func() error { _, err := d.Malloc(5 * page); return err })
	fails("free", 3, func() error { return d.Free(12345) })
	fails("synchronize stream", 53, func() error { return d.SynchronizeStream(99) })
	fails("record event", 13, func() error { _, err := d.RecordEvent(99); return err })
	fails("event query", 17, func() error { _, err := d.EventDone(999); return err })
	fails("release event", 23, func() error { return d.ReleaseEvent(999) })
	fails("reserve", 29, func() error { _, err := d.Reserve(page + 1); return err })
	fails("map of two pages", 2*37, func() error { return d.Map(device.Ptr(page), 2*page) })
	fails("release", 31, func() error { return d.Release(1) })
}

func TestCostsNegativeMeansFree(t *testing.T) {
	d := newDevice(t, sim.Config{Capacity: gib, Costs: sim.NoCosts()})
	assert.Equal(t, sim.Costs{}, d.Costs(), "every field resolved to zero")
	p := mustMalloc(t, d, 100*mib)
	require.NoError(t, d.Free(p))
	require.NoError(t, d.Synchronize())
	s, err := d.NewStream()
	require.NoError(t, err)
	require.NoError(t, d.SynchronizeStream(s))
	e, err := d.RecordEvent(s)
	require.NoError(t, err)
	_, err = d.EventDone(e)
	require.NoError(t, err)
	require.NoError(t, d.SynchronizeEvent(e))
	require.NoError(t, d.ReleaseEvent(e))
	_, _, err = d.MemInfo()
	require.NoError(t, err)
	r, err := d.Reserve(4 * mib)
	require.NoError(t, err)
	require.NoError(t, d.Map(r, 4*mib))
	require.NoError(t, d.Unmap(r, 4*mib))
	require.NoError(t, d.Release(r))
	h, err := d.HostAlloc(mib)
	require.NoError(t, err)
	require.NoError(t, d.HostFree(h))
	_, err = d.Malloc(0)
	require.Error(t, err)
	assert.Zero(t, d.Clock())
}

func TestCostsFieldDefaults(t *testing.T) {
	def := sim.DefaultCosts()
	for i, f := range []time.Duration{def.Malloc, def.MallocPerGiB, def.Free, def.MemInfo, def.Synchronize,
		def.StreamSynchronize, def.StreamCreate, def.EventRecord, def.EventQuery, def.EventSynchronize,
		def.EventRelease, def.Reserve, def.Release, def.Map, def.Unmap, def.HostAlloc, def.HostAllocPerGiB,
		def.HostFree} {
		assert.Positive(t, f, "field %d", i)
	}

	// The zero value is the default model.
	d := newDevice(t, sim.Config{})
	assert.Equal(t, def, d.Costs())
	mustMalloc(t, d, gib)
	assert.Equal(t, def.Malloc+def.MallocPerGiB, d.Clock())
	p := mustMalloc(t, d, 2*mib)
	before := d.Clock()
	require.NoError(t, d.Free(p))
	assert.Equal(t, def.Free+def.Synchronize, d.Clock()-before)

	// A zero field takes its default, a negative one is free, the others
	// keep their figure.
	d = newDevice(t, sim.Config{Capacity: gib, Costs: sim.Costs{Free: -5, Synchronize: 9, Malloc: -time.Second, MallocPerGiB: -1}})
	want := def
	want.Free, want.Synchronize, want.Malloc, want.MallocPerGiB = 0, 9, 0, 0
	assert.Equal(t, want, d.Costs())
	p = mustMalloc(t, d, 1)
	assert.Zero(t, d.Clock())
	require.NoError(t, d.Free(p))
	assert.Equal(t, time.Duration(9), d.Clock(), "free costs its synchronization")
	_, err := d.NewStream()
	require.NoError(t, err)
	assert.Equal(t, 9+def.StreamCreate, d.Clock())
}

func TestCostsSaturate(t *testing.T) {
	huge := time.Duration(1<<63 - 1)
	d := newDevice(t, sim.Config{Capacity: sim.MaxCapacity, Costs: sim.Costs{Malloc: huge, MallocPerGiB: huge}})
	p := mustMalloc(t, d, sim.MaxCapacity)
	assert.Equal(t, huge, d.Clock())
	require.NoError(t, d.Free(p))
	assert.Equal(t, huge, d.Clock(), "the clock saturates, never wraps")
}

func TestSleep(t *testing.T) {
	const cost = 3 * time.Millisecond
	c := sim.NoCosts()
	c.Malloc = cost
	c.Free, c.Synchronize = cost, cost
	c.EventRelease = cost
	c.Reserve, c.Release = cost, cost
	c.Map, c.Unmap = cost, cost
	c.HostAlloc, c.HostFree = cost, cost
	d := newDevice(t, sim.Config{Capacity: gib, Costs: c, Sleep: true})
	measure := func(name string, want time.Duration, call func() error) {
		t.Helper()
		start := time.Now()
		_ = call()
		assert.GreaterOrEqual(t, time.Since(start), want, name)
	}
	var p, r device.Ptr
	var e device.Event
	var h []byte
	measure("malloc", cost, func() (err error) { p, err = d.Malloc(1); return })
	measure("failed malloc", cost, func() (err error) { _, err = d.Malloc(0); return })
	measure("free", 2*cost, func() error { return d.Free(p) })
	measure("synchronize", cost, d.Synchronize)
	measure("record event", 0, func() (err error) { e, err = d.RecordEvent(0); return })
	measure("release event", cost, func() error { return d.ReleaseEvent(e) })
	measure("reserve", cost, func() (err error) { r, err = d.Reserve(4 * mib); return })
	measure("map", 2*cost, func() error { return d.Map(r, 4*mib) })
	measure("unmap", 2*cost, func() error { return d.Unmap(r, 4*mib) })
	measure("release", cost, func() error { return d.Release(r) })
	measure("host alloc", cost, func() (err error) { h, err = d.HostAlloc(8); return })
	measure("host free", cost, func() error { return d.HostFree(h) })
	assert.Positive(t, d.Clock())
}

func TestStreams(t *testing.T) {
	d := newDevice(t, sim.Config{Ordinal: 1, Capacity: gib, Costs: sim.NoCosts()})
	assert.True(t, d.HasStream(device.DefaultStream))
	assert.False(t, d.HasStream(1))
	for n := uint64(1); n <= 3; n++ {
		s, err := d.NewStream()
		require.NoError(t, err)
		assert.Equal(t, device.Stream(1<<32|n), s, "ordinal 1's stream n is 1<<32 | n")
		assert.True(t, d.HasStream(s))
	}
	assert.False(t, d.HasStream(1<<32|4))
	assert.False(t, d.HasStream(2), "a stream of another device")
	assert.False(t, d.HasStream(^device.Stream(0)))
	assert.Equal(t, 4, d.Streams())
	assert.Equal(t, int64(3), d.Counters().StreamsCreated)

	// Every device numbers its own streams from 1; ordinal 0's handles are
	// the plain numbers, and are not streams of device 1.
	other := newDevice(t, sim.Config{Capacity: gib})
	s, err := other.NewStream()
	require.NoError(t, err)
	assert.Equal(t, device.Stream(1), s)
	assert.False(t, d.HasStream(s))

	for _, bad := range []device.Stream{1<<32 | 4, 1, 100, ^device.Stream(0)} {
		before := snap(t, d)
		requireDeviceError(t, d.SynchronizeStream(bad), "synchronize stream", 1, device.ErrInvalidStream)
		_, err := d.RecordEvent(bad)
		requireDeviceError(t, err, "record event", 1, device.ErrInvalidStream)
		requireDeviceError(t, d.SetStreamBusy(bad, true), "set stream busy", 1, device.ErrInvalidStream)
		requireDeviceError(t, d.CompleteStream(bad), "complete stream", 1, device.ErrInvalidStream)
		_, err = d.PendingWork(bad)
		requireDeviceError(t, err, "pending work", 1, device.ErrInvalidStream)
		requireUnchanged(t, before, snap(t, d), nil)
		assert.False(t, d.HasStream(bad))
	}
	for _, s := range []device.Stream{0, 1<<32 | 1, 1<<32 | 2, 1<<32 | 3} {
		require.NoError(t, d.SynchronizeStream(s))
		require.NoError(t, d.SetStreamBusy(s, false))
		require.NoError(t, d.CompleteStream(s))
	}
}

func eventDone(t tb, d *sim.Device, e device.Event) bool {
	t.Helper()
	done, err := d.EventDone(e)
	require.NoError(t, err)
	return done
}

func TestEventsCompleteAtOnceByDefault(t *testing.T) {
	d := newDevice(t, sim.Config{Capacity: gib})
	s, err := d.NewStream()
	require.NoError(t, err)
	want := device.Event(1)
	for _, st := range []device.Stream{device.DefaultStream, s, s} {
		e, err := d.RecordEvent(st)
		require.NoError(t, err)
		assert.Equal(t, want, e, "events are numbered 1, 2, 3, ...")
		want++
		assert.True(t, eventDone(t, d, e))
		require.NoError(t, d.SynchronizeEvent(e))
		n, err := d.PendingWork(st)
		require.NoError(t, err)
		assert.Zero(t, n)
	}
	// Ids are never reused.
	require.NoError(t, d.ReleaseEvent(3))
	e, err := d.RecordEvent(s)
	require.NoError(t, err)
	assert.Equal(t, device.Event(4), e)
}

// busyStream returns a device with a busy stream and two pending events on
// it, recorded in order.
func busyStream(t *testing.T) (*sim.Device, device.Stream, device.Event, device.Event) {
	t.Helper()
	d := newDevice(t, sim.Config{Capacity: gib, Costs: sim.NoCosts()})
	s, err := d.NewStream()
	require.NoError(t, err)
	require.NoError(t, d.SetStreamBusy(s, true))
	e1, err := d.RecordEvent(s)
	require.NoError(t, err)
	e2, err := d.RecordEvent(s)
	require.NoError(t, err)
	require.False(t, eventDone(t, d, e1))
	require.False(t, eventDone(t, d, e2))
	n, err := d.PendingWork(s)
	require.NoError(t, err)
	require.Equal(t, uint64(2), n)
	return d, s, e1, e2
}

func pending(t tb, d *sim.Device, s device.Stream) uint64 {
	t.Helper()
	n, err := d.PendingWork(s)
	require.NoError(t, err)
	return n
}

func TestEventsOnBusyStream(t *testing.T) {
	finishers := map[string]func(d *sim.Device, s device.Stream) error{
		"CompleteStream":    (*sim.Device).CompleteStream,
		"SynchronizeStream": (*sim.Device).SynchronizeStream,
		"Synchronize":       func(d *sim.Device, _ device.Stream) error { return d.Synchronize() },
	}
	for name, finish := range finishers {
		t.Run(name, func(t *testing.T) {
			d, s, e1, e2 := busyStream(t)
			// Pending events stay pending however often they are asked.
			for range 3 {
				require.False(t, eventDone(t, d, e1))
			}
			require.NoError(t, finish(d, s))
			assert.True(t, eventDone(t, d, e1))
			assert.True(t, eventDone(t, d, e2))
			assert.Zero(t, pending(t, d, s))
			// The stream stays busy for later work.
			e3, err := d.RecordEvent(s)
			require.NoError(t, err)
			assert.False(t, eventDone(t, d, e3))
			require.NoError(t, finish(d, s))
			assert.True(t, eventDone(t, d, e3))
		})
	}

	t.Run("SynchronizeEvent finishes up to its event", func(t *testing.T) {
		d, s, e1, e2 := busyStream(t)
		e3, err := d.RecordEvent(s)
		require.NoError(t, err)
		require.NoError(t, d.SynchronizeEvent(e2))
		assert.True(t, eventDone(t, d, e1), "earlier event")
		assert.True(t, eventDone(t, d, e2))
		assert.False(t, eventDone(t, d, e3), "later event")
		assert.Equal(t, uint64(1), pending(t, d, s))
		// Waiting for an earlier event again undoes nothing.
		require.NoError(t, d.SynchronizeEvent(e1))
		assert.True(t, eventDone(t, d, e2))
		assert.False(t, eventDone(t, d, e3))
		require.NoError(t, d.SynchronizeEvent(e3))
		assert.True(t, eventDone(t, d, e3))
		// Still busy.
		e4, err := d.RecordEvent(s)
		require.NoError(t, err)
		assert.False(t, eventDone(t, d, e4))
	})

	t.Run("SynchronizeEvent of a released predecessor's successor", func(t *testing.T) {
		d, _, e1, e2 := busyStream(t)
		require.NoError(t, d.ReleaseEvent(e1))
		require.NoError(t, d.SynchronizeEvent(e2))
		assert.True(t, eventDone(t, d, e2))
	})

	t.Run("SetStreamBusy false finishes pending work", func(t *testing.T) {
		d, s, e1, e2 := busyStream(t)
		require.NoError(t, d.SetStreamBusy(s, false))
		assert.True(t, eventDone(t, d, e1))
		assert.True(t, eventDone(t, d, e2))
		e3, err := d.RecordEvent(s)
		require.NoError(t, err)
		assert.True(t, eventDone(t, d, e3), "not busy any more")
	})

	t.Run("SetStreamBusy true again keeps pending work", func(t *testing.T) {
		d, s, e1, _ := busyStream(t)
		require.NoError(t, d.SetStreamBusy(s, true))
		assert.False(t, eventDone(t, d, e1))
	})

	t.Run("other streams are unaffected", func(t *testing.T) {
		d, s, e1, _ := busyStream(t)
		s2, err := d.NewStream()
		require.NoError(t, err)
		e, err := d.RecordEvent(s2)
		require.NoError(t, err)
		assert.True(t, eventDone(t, d, e))
		e0, err := d.RecordEvent(device.DefaultStream)
		require.NoError(t, err)
		assert.True(t, eventDone(t, d, e0))
		require.NoError(t, d.CompleteStream(s2))
		require.NoError(t, d.SynchronizeStream(device.DefaultStream))
		require.NoError(t, d.SetStreamBusy(s2, false))
		require.NoError(t, d.SynchronizeEvent(e))
		assert.False(t, eventDone(t, d, e1))
		require.NoError(t, d.SynchronizeStream(s))
		assert.True(t, eventDone(t, d, e1))
	})

	t.Run("Free does not finish held work", func(t *testing.T) {
		d, s, e1, _ := busyStream(t)
		syncs := d.Counters().Synchronizations
		p := mustMalloc(t, d, 1)
		require.NoError(t, d.Free(p))
		assert.Equal(t, syncs+1, d.Counters().Synchronizations, "free counts a synchronization")
		assert.False(t, eventDone(t, d, e1))
		assert.Equal(t, uint64(2), pending(t, d, s))
	})

	t.Run("the default stream can be busy too", func(t *testing.T) {
		d := newDevice(t, sim.Config{Capacity: gib})
		require.NoError(t, d.SetStreamBusy(device.DefaultStream, true))
		e, err := d.RecordEvent(device.DefaultStream)
		require.NoError(t, err)
		assert.False(t, eventDone(t, d, e))
		require.NoError(t, d.Synchronize())
		assert.True(t, eventDone(t, d, e))
	})
}

func TestReleasedEvent(t *testing.T) {
	d, s, e1, e2 := busyStream(t)
	require.NoError(t, d.ReleaseEvent(e1))
	_, err := d.EventDone(e1)
	requireDeviceError(t, err, "query event", 0, device.ErrInvalidEvent)
	requireDeviceError(t, d.SynchronizeEvent(e1), "synchronize event", 0, device.ErrInvalidEvent)
	requireDeviceError(t, d.ReleaseEvent(e1), "release event", 0, device.ErrInvalidEvent)
	// The other event is untouched, and releasing finished nothing.
	assert.False(t, eventDone(t, d, e2))
	assert.Equal(t, uint64(2), pending(t, d, s))
	for _, bad := range []device.Event{0, e2 + 1, ^device.Event(0)} {
		before := snap(t, d)
		_, err := d.EventDone(bad)
		require.ErrorIs(t, err, device.ErrInvalidEvent)
		require.ErrorIs(t, d.SynchronizeEvent(bad), device.ErrInvalidEvent)
		require.ErrorIs(t, d.ReleaseEvent(bad), device.ErrInvalidEvent)
		requireUnchanged(t, before, snap(t, d), nil)
	}
	c := d.Counters()
	assert.Equal(t, int64(2), c.EventsRecorded)
	assert.Equal(t, int64(1), c.EventsReleased)
}

func TestFailNthMalloc(t *testing.T) {
	d := small(t, 64, 4096)
	mustMalloc(t, d, 1)
	d.FailNthMalloc(3)
	mustMalloc(t, d, 1)
	mustMalloc(t, d, 1)
	before := snap(t, d)
	_, err := d.Malloc(1)
	requireDeviceError(t, err, "malloc", 0, device.ErrOutOfMemory)
	assert.Contains(t, err.Error(), "FailNthMalloc")
	requireUnchanged(t, before, snap(t, d), failedMalloc)
	// Once only.
	for range 5 {
		mustMalloc(t, d, 1)
	}

	// 1 is the next call; Map calls count.
	r, err := d.Reserve(4 * 4096)
	require.NoError(t, err)
	d.FailNthMalloc(2)
	mustMalloc(t, d, 1)
	before = snap(t, d)
	err = d.Map(r, 2*4096)
	requireDeviceError(t, err, "map", 0, device.ErrOutOfMemory)
	requireUnchanged(t, before, snap(t, d), failedMap)
	require.NoError(t, d.Map(r, 4*4096), "nothing was mapped by the failed call")

	d.FailNthMalloc(1)
	_, err = d.Malloc(1)
	require.ErrorIs(t, err, device.ErrOutOfMemory)

	// Calls with invalid arguments are not counted.
	d.FailNthMalloc(2)
	_, err = d.Malloc(0)
	require.ErrorIs(t, err, device.ErrInvalidSize)
	require.ErrorIs(t, d.Map(r+1, 4096), device.ErrInvalidArgument)
	require.ErrorIs(t, d.Map(r, 4096), device.ErrInvalidArgument, "already mapped")
	mustMalloc(t, d, 1)
	_, err = d.Malloc(1)
	require.ErrorIs(t, err, device.ErrOutOfMemory, "the second counted call")

	// Turned off.
	d.FailNthMalloc(2)
	d.FailNthMalloc(0)
	for range 4 {
		mustMalloc(t, d, 1)
	}
	d.FailNthMalloc(2)
	d.FailNthMalloc(-1)
	for range 4 {
		mustMalloc(t, d, 1)
	}
}

func TestFailNthMallocCountsOutOfMemoryCalls(t *testing.T) {
	// A call that fails anyway (not enough free memory, or more than the
	// device has) is still a call: the count moves on.
	for _, size := range []uint64{3 * 4096, 100 * 4096} {
		d := small(t, 2, 4096)
		d.FailNthMalloc(2)
		_, err := d.Malloc(size)
		require.ErrorIs(t, err, device.ErrOutOfMemory)
		_, err = d.Malloc(1)
		require.ErrorIs(t, err, device.ErrOutOfMemory, "size %d: second call fails", size)
		mustMalloc(t, d, 1)
	}
}

func TestFailMallocAbove(t *testing.T) {
	const page = 4096
	d := small(t, 64, page)
	r, err := d.Reserve(16 * page)
	require.NoError(t, err)
	d.FailMallocAbove(4 * page)
	mustMalloc(t, d, 4*page)
	before := snap(t, d)
	_, err = d.Malloc(4*page + 1)
	requireDeviceError(t, err, "malloc", 0, device.ErrOutOfMemory)
	requireUnchanged(t, before, snap(t, d), failedMalloc)
	require.NoError(t, d.Map(r, 4*page))
	before = snap(t, d)
	require.ErrorIs(t, d.Map(r+4*page, 8*page), device.ErrOutOfMemory)
	requireUnchanged(t, before, snap(t, d), failedMap)
	// Still on for the next call.
	_, err = d.Malloc(5 * page)
	require.ErrorIs(t, err, device.ErrOutOfMemory)
	d.FailMallocAbove(0)
	mustMalloc(t, d, 5*page)
	require.NoError(t, d.Map(r+4*page, 8*page))
}

func TestFailMallocWhen(t *testing.T) {
	const page = 4096
	d := small(t, 64, page)
	var asked []uint64
	d.FailMallocWhen(func(size uint64) bool {
		asked = append(asked, size)
		_ = d.BytesInUse() // the predicate may call the device
		return size == 3*page
	})
	mustMalloc(t, d, 2*page)
	before := snap(t, d)
	_, err := d.Malloc(3 * page)
	requireDeviceError(t, err, "malloc", 0, device.ErrOutOfMemory)
	requireUnchanged(t, before, snap(t, d), failedMalloc)
	r, err := d.Reserve(4 * page)
	require.NoError(t, err)
	before = snap(t, d)
	require.ErrorIs(t, d.Map(r, 3*page), device.ErrOutOfMemory)
	requireUnchanged(t, before, snap(t, d), failedMap)
	require.NoError(t, d.Map(r, 2*page))
	assert.Equal(t, []uint64{2 * page, 3 * page, 3 * page, 2 * page}, asked)
	d.FailMallocWhen(nil)
	mustMalloc(t, d, 3*page)
	assert.Len(t, asked, 4, "off: the predicate is not called")
}

func TestFailFrees(t *testing.T) {
	const page = 4096
	errBoom := errors.New("boom")
	d := newDevice(t, sim.Config{Ordinal: 9, Capacity: 64 * page, PageSize: page, Costs: sim.NoCosts()})
	p := mustMalloc(t, d, page)
	r, err := d.Reserve(4 * page)
	require.NoError(t, err)
	require.NoError(t, d.Map(r, 4*page))
	d.FailFrees(errBoom)

	before := snap(t, d)
	err = d.Free(p)
	requireDeviceError(t, err, "free", 9, errBoom)
	requireUnchanged(t, before, snap(t, d), failedFree)
	before = snap(t, d)
	err = d.Unmap(r, 2*page)
	requireDeviceError(t, err, "unmap", 9, errBoom)
	requireUnchanged(t, before, snap(t, d), func(c *sim.Counters) { c.FailedUnmaps++ })
	// Bad arguments still fail with their own errors.
	require.ErrorIs(t, d.Free(p+page), device.ErrInvalidPointer)
	require.ErrorIs(t, d.Unmap(r+4*page, page), device.ErrInvalidArgument)
	// Mallocs still work.
	q := mustMalloc(t, d, page)

	d.FailFrees(nil)
	require.NoError(t, d.Free(p))
	require.NoError(t, d.Free(q))
	require.NoError(t, d.Unmap(r, 4*page), "all four pages were still mapped")
	require.NoError(t, d.Release(r))
	assert.Zero(t, d.BytesInUse())
}

func TestFailEventQueries(t *testing.T) {
	errBoom := errors.New("boom")
	d, s, e1, _ := busyStream(t)
	d.FailEventQueries(errBoom)
	before := snap(t, d)
	_, err := d.EventDone(e1)
	requireDeviceError(t, err, "query event", 0, errBoom)
	requireDeviceError(t, d.SynchronizeEvent(e1), "synchronize event", 0, errBoom)
	requireUnchanged(t, before, snap(t, d), func(c *sim.Counters) { c.FailedEventQueries += 2 })
	// Unknown events are still unknown; recording and releasing work.
	_, err = d.EventDone(999)
	require.ErrorIs(t, err, device.ErrInvalidEvent)
	e3, err := d.RecordEvent(s)
	require.NoError(t, err)
	require.NoError(t, d.ReleaseEvent(e3))

	d.FailEventQueries(nil)
	assert.False(t, eventDone(t, d, e1), "the failed SynchronizeEvent finished nothing")
	require.NoError(t, d.SynchronizeEvent(e1))
	assert.True(t, eventDone(t, d, e1))
}

func TestVirtualMemoryReserve(t *testing.T) {
	const page = 2 << 20
	d := newDevice(t, sim.Config{Ordinal: 4, Capacity: 8 * page, Costs: sim.NoCosts()})
	vbase := device.Ptr(5)<<44 + device.Ptr(1)<<43
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
		before := snap(t, d)
		p, err := d.Reserve(c.size)
		assert.Zero(t, p)
		requireDeviceError(t, err, "reserve", 4, c.err)
		requireUnchanged(t, before, snap(t, d), nil)
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
	assert.Equal(t, []sim.Reservation{{Ptr: a, Size: 100 * page}, {Ptr: b, Size: page}}, d.Reservations())

	// More than the region has left.
	for _, size := range []uint64{sim.MemoryRegionSize, ^uint64(0) - page + 1} {
		before := snap(t, d)
		_, err = d.Reserve(size)
		requireDeviceError(t, err, "reserve", 4, device.ErrOutOfMemory)
		requireUnchanged(t, before, snap(t, d), nil)
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
	other := newDevice(t, sim.Config{Capacity: gib})
	whole, err := other.Reserve(sim.MemoryRegionSize)
	require.NoError(t, err)
	assert.Equal(t, device.Ptr(1)<<44+sim.MemoryRegionSize, whole)
	_, err = other.Reserve(2 * mib)
	require.ErrorIs(t, err, device.ErrOutOfMemory)
}

func TestVirtualMemoryMap(t *testing.T) {
	const page = 2 << 20
	d := newDevice(t, sim.Config{Ordinal: 1, Capacity: 8 * page, Costs: sim.NoCosts()})
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
	assert.Equal(t, []sim.Range{{Ptr: r + page, Size: 2 * page, Pages: 2 * page}}, d.Mapped(r))
	assert.Equal(t, []sim.Reservation{{Ptr: r, Size: 6 * page, Mapped: 2 * page}, {Ptr: other, Size: 2 * page}}, d.Reservations())
	assert.Nil(t, d.Mapped(r+page), "not a reservation's base")

	bad := []struct {
		name string
		p    device.Ptr
		size uint64
	}{
		{"misaligned pointer", r + 1, page},
		{"misaligned size", r, page + 1},
		{"zero size", r, 0},
		{"outside any reservation", r - 2*page, page},
		{"device memory", device.Ptr(2) << 44, page},
		{"past the end", other + 2*page, page},
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
			before := snap(t, d)
			err := d.Map(c.p, c.size)
			requireDeviceError(t, err, "map", 1, device.ErrInvalidArgument)
			requireUnchanged(t, before, snap(t, d), nil)
		})
	}

	// Mapping next to a mapping merges in Mapped.
	require.NoError(t, d.Map(r+3*page, page))
	assert.Equal(t, []sim.Range{{Ptr: r + page, Size: 3 * page, Pages: 3 * page}}, d.Mapped(r))

	// Short of memory: nothing is mapped.
	mustMalloc(t, d, 4*page)
	before := snap(t, d)
	err = d.Map(r+4*page, 2*page)
	requireDeviceError(t, err, "map", 1, device.ErrOutOfMemory)
	requireUnchanged(t, before, snap(t, d), failedMap)
	require.ErrorIs(t, d.Unmap(r+4*page, page), device.ErrInvalidArgument, "nothing was mapped")
	require.NoError(t, d.Map(r+4*page, page), "exactly what is free")
	require.ErrorIs(t, d.Map(other, page), device.ErrOutOfMemory)
	_, err = d.Malloc(1)
	require.ErrorIs(t, err, device.ErrOutOfMemory, "Malloc and Map share the capacity")
	assert.Equal(t, uint64(8*page), d.BytesInUse())
	assert.Equal(t, uint64(8*page), d.Counters().PeakBytesInUse)
	assert.Equal(t, uint64(4*page), d.Counters().MappedBytes)
}

func TestVirtualMemoryUnmapRelease(t *testing.T) {
	const page = 64 << 10
	d := newDevice(t, sim.Config{Ordinal: 2, Capacity: 16 * page, PageSize: page, Costs: sim.NoCosts()})
	r, err := d.Reserve(4 * page)
	require.NoError(t, err)
	require.NoError(t, d.Map(r, page))
	require.NoError(t, d.Map(r+2*page, 2*page))

	for _, c := range []struct {
		name string
		p    device.Ptr
		size uint64
	}{
		{"partly mapped", r, 2 * page},
		{"not mapped", r + page, page},
		{"across a gap", r, 4 * page},
		{"misaligned", r + 1, page},
		{"zero size", r, 0},
		{"outside", r + 4*page, page},
		{"huge", r + 2*page, ^uint64(0) - page + 1},
	} {
		before := snap(t, d)
		requireDeviceError(t, d.Unmap(c.p, c.size), "unmap", 2, device.ErrInvalidArgument)
		requireUnchanged(t, before, snap(t, d), nil)
	}

	// Release with mapped pages fails; so does releasing an inner address
	// or an unknown one.
	before := snap(t, d)
	requireDeviceError(t, d.Release(r), "release", 2, device.ErrInvalidArgument)
	requireDeviceError(t, d.Release(r+page), "release", 2, device.ErrInvalidArgument)
	requireDeviceError(t, d.Release(0), "release", 2, device.ErrInvalidArgument)
	requireUnchanged(t, before, snap(t, d), nil)

	// Unmapping part of a mapping, or several mappings at once, is fine.
	require.NoError(t, d.Unmap(r+3*page, page))
	assert.Equal(t, uint64(2*page), d.BytesInUse())
	assert.Equal(t, []sim.Range{{Ptr: r, Size: page, Pages: page}, {Ptr: r + 2*page, Size: page, Pages: page}}, d.Mapped(r))
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
	assert.Equal(t, int64(1), c.Releases)
	assert.Equal(t, int64(2), c.Reserves)
}

func TestHostMemory(t *testing.T) {
	d := newDevice(t, sim.Config{Ordinal: 6, Capacity: gib, HostCapacity: 64 * kib})
	b, err := d.HostAlloc(4096)
	require.NoError(t, err)
	require.Len(t, b, 4096)
	for i := range b {
		b[i] = byte(i)
	}
	for i := range b {
		require.Equal(t, byte(i), b[i])
	}
	assert.Zero(t, d.BytesInUse(), "host memory is not device memory")
	assert.Equal(t, uint64(4096), d.Counters().HostBytesInUse)

	_, err = d.HostAlloc(0)
	requireDeviceError(t, err, "host alloc", 6, device.ErrInvalidSize)
	for _, size := range []uint64{60*kib + 1, 1 << 40, ^uint64(0)} {
		_, err := d.HostAlloc(size)
		requireDeviceError(t, err, "host alloc", 6, device.ErrOutOfMemory)
	}
	c, err := d.HostAlloc(60 * kib)
	require.NoError(t, err, "exactly what is left")

	otherDev := newDevice(t, sim.Config{Capacity: gib})
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
			before := d.Counters()
			requireDeviceError(t, d.HostFree(s), "host free", 6, device.ErrInvalidPointer)
			assert.Equal(t, before, d.Counters())
		})
	}
	require.NoError(t, d.HostFree(b))
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

// TestConcurrentUse drives one device from many goroutines (run it with
// -race) and checks that the counters add up.
func TestConcurrentUse(t *testing.T) {
	const (
		workers = 8
		rounds  = 300
		page    = 4096
	)
	d := newDevice(t, sim.Config{Capacity: 1 << 20 * page, PageSize: page})
	var failing sync.Mutex // guards fails
	var fails []error
	failf := func(err error) {
		failing.Lock()
		fails = append(fails, err)
		failing.Unlock()
	}
	type result struct {
		mallocs, frees, events, maps, hosts int64
		live                                []device.Ptr
	}
	results := make([]result, workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			res := &results[w]
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			s, err := d.NewStream()
			if err != nil {
				failf(err)
				return
			}
			busy := w%2 == 0
			if err := d.SetStreamBusy(s, busy); err != nil {
				failf(err)
				return
			}
			resv, err := d.Reserve(16 * page)
			if err != nil {
				failf(err)
				return
			}
			for i := range rounds {
				p, err := d.Malloc(1 + rng.Uint64N(8*page))
				if err != nil {
					failf(err)
					return
				}
				res.mallocs++
				res.live = append(res.live, p)
				if rng.IntN(2) == 0 {
					j := rng.IntN(len(res.live))
					if err := d.Free(res.live[j]); err != nil {
						failf(err)
					}
					res.frees++
					res.live = append(res.live[:j], res.live[j+1:]...)
				}
				e, err := d.RecordEvent(s)
				if err != nil {
					failf(err)
					return
				}
				res.events++
				done, err := d.EventDone(e)
				if err != nil || (!busy && !done) {
					failf(errors.Join(err, errors.New("event on an idle stream not done")))
				}
				if i%10 == 0 {
					if err := d.SynchronizeEvent(e); err != nil {
						failf(err)
					}
					if done, err := d.EventDone(e); err != nil || !done {
						failf(errors.Join(err, errors.New("event not done after SynchronizeEvent")))
					}
				}
				if err := d.ReleaseEvent(e); err != nil {
					failf(err)
				}
				if _, _, err := d.MemInfo(); err != nil {
					failf(err)
				}
				if i%7 == 0 {
					off := device.Ptr(rng.IntN(8) * page)
					if err := d.Map(resv+off, 8*page); err != nil {
						failf(err)
					} else if err := d.Unmap(resv+off, 8*page); err != nil {
						failf(err)
					}
					res.maps++
				}
				if i%25 == 0 {
					h, err := d.HostAlloc(64)
					if err == nil {
						h[63] = 1
						err = d.HostFree(h)
					}
					if err != nil {
						failf(err)
					}
					res.hosts++
				}
				if i%50 == 0 {
					if err := d.Synchronize(); err != nil {
						failf(err)
					}
					_ = d.Allocations()
					_ = d.Reservations()
				}
			}
			if err := d.Release(resv); err != nil {
				failf(err)
			}
		})
	}
	wg.Wait()
	require.Empty(t, fails)

	var sum result
	for _, r := range results {
		sum.mallocs += r.mallocs
		sum.frees += r.frees
		sum.events += r.events
		sum.maps += r.maps
		sum.hosts += r.hosts
		sum.live = append(sum.live, r.live...)
	}
	allocs := d.Allocations()
	require.Len(t, allocs, len(sum.live))
	var inUse uint64
	for i, r := range allocs {
		inUse += r.Pages
		assert.Zero(t, uint64(r.Ptr)%page)
		if i > 0 {
			assert.LessOrEqual(t, allocs[i-1].End(), r.Ptr, "live ranges overlap")
		}
	}
	c := d.Counters()
	assert.Equal(t, sum.mallocs, c.Mallocs)
	assert.Equal(t, sum.frees, c.Frees)
	assert.Equal(t, sum.events, c.EventsRecorded)
	assert.Equal(t, sum.events, c.EventsReleased)
	assert.Equal(t, sum.maps, c.Maps)
	assert.Equal(t, sum.maps, c.Unmaps)
	assert.Equal(t, sum.hosts, c.HostAllocs)
	assert.Equal(t, sum.hosts, c.HostFrees)
	assert.Equal(t, int64(workers), c.StreamsCreated)
	assert.Equal(t, int64(workers), c.Reserves)
	assert.Equal(t, int64(workers), c.Releases)
	assert.Equal(t, inUse, c.BytesInUse)
	assert.Zero(t, c.MappedBytes)
	assert.Zero(t, c.FailedMallocs+c.FailedFrees+c.FailedMaps+c.FailedUnmaps)
	assert.Empty(t, d.Reservations())

	for _, p := range sum.live {
		require.NoError(t, d.Free(p))
	}
	assert.Zero(t, d.BytesInUse())
	free, total, err := d.MemInfo()
	require.NoError(t, err)
	assert.Equal(t, total, free)
	assert.Empty(t, d.Allocations())
	// With everything free each region is one range again.
	assert.Equal(t, d.MemoryBase(), mustMalloc(t, d, 1))
	r, err := d.Reserve(page)
	require.NoError(t, err)
	assert.Equal(t, d.MemoryBase()+sim.MemoryRegionSize, r)
}
