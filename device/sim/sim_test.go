// Tests of configuration, device memory, determinism and counters (the
// address rule: address_test.go).

package sim

import (
	"errors"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpumem/gpumem/device"
)

func TestNewDefaults(t *testing.T) {
	d, err := New(Config{})
	require.NoError(t, err)
	assert.Equal(t, 0, d.Ordinal())
	assert.Equal(t, DefaultName, d.Name())
	assert.Equal(t, uint64(DefaultCapacity), d.Capacity())
	assert.Equal(t, 80*GiB, d.Capacity())
	assert.Equal(t, uint64(DefaultPageSize), d.PageSize())
	assert.Equal(t, 2*MiB, d.PageSize())
	assert.Equal(t, 2*MiB, d.Granularity())
	assert.Equal(t, DefaultCosts(), d.Costs())
	assert.Equal(t, device.Ptr(1<<44), d.MemoryBase())
	assert.Equal(t, Counters{}, d.Counters())
	free, total, err := d.MemInfo()
	require.NoError(t, err)
	assert.Equal(t, 80*GiB, free)
	assert.Equal(t, 80*GiB, total)
	assert.Equal(t, Counters{MemInfos: 1}, d.Counters())
	assert.Equal(t, "sim device 0 (gpumem simulated device): 0 B of 80 GiB in use, 2 MiB pages", d.String())
	assert.Empty(t, d.Allocations())
	assert.Empty(t, d.Reservations())
	assert.Equal(t, 1, d.Streams())
	// Host memory defaults to 4 GiB: more fails, without allocating it.
	_, err = d.HostAlloc(DefaultHostCapacity + 1)
	require.ErrorIs(t, err, device.ErrOutOfMemory)
}

func TestNewKeepsConfig(t *testing.T) {
	d := mustNew(t, Config{Ordinal: 7, Name: "test card", Capacity: 3*GiB + 5, PageSize: 64 * KiB})
	assert.Equal(t, 7, d.Ordinal())
	assert.Equal(t, "test card", d.Name())
	assert.Equal(t, 3*GiB+5, d.Capacity())
	assert.Equal(t, 64*KiB, d.PageSize())
	assert.Equal(t, 64*KiB, d.Granularity())
	assert.Equal(t, device.Ptr(8)<<44, d.MemoryBase())
	_, total, err := d.MemInfo()
	require.NoError(t, err)
	assert.Equal(t, 3*GiB+5, total)
	assert.Contains(t, d.String(), "test card")
}

func TestNewValidation(t *testing.T) {
	bad := []struct {
		name string
		cfg  Config
	}{
		{"negative ordinal", Config{Ordinal: -1}},
		{"ordinal above max", Config{Ordinal: MaxOrdinal + 1}},
		{"capacity above max", Config{Capacity: MaxCapacity + 1}},
		{"capacity far above max", Config{Capacity: ^uint64(0)}},
		{"capacity below a page", Config{Capacity: 2*MiB - 1}},
		{"capacity of half a page", Config{Capacity: 1 << 20, PageSize: 2 << 20}},
		{"capacity below a small page", Config{Capacity: 100, PageSize: 4096}},
		{"page not a power of two", Config{PageSize: 3 * MiB}},
		{"page of three bytes", Config{PageSize: 3}},
		{"page of one byte", Config{PageSize: 1}},
		{"page below min", Config{PageSize: MinPageSize / 2}},
		{"page above max", Config{PageSize: MaxPageSize * 2}},
		{"page of all ones", Config{PageSize: ^uint64(0)}},
		{"host capacity above max", Config{HostCapacity: MaxHostCapacity + 1}},
	}
	for _, c := range bad {
		t.Run(c.name, func(t *testing.T) {
			d, err := New(c.cfg)
			require.ErrorIs(t, err, device.ErrInvalidArgument)
			assert.Nil(t, d)
			assert.True(t, strings.HasPrefix(err.Error(), "sim: "), err.Error())
		})
	}
	good := []Config{
		{Ordinal: MaxOrdinal},
		{Capacity: MaxCapacity},
		{PageSize: MinPageSize},
		{PageSize: MaxPageSize, Capacity: MaxPageSize},
		{Capacity: 4096, PageSize: 4096},
		{Capacity: 4097, PageSize: 4096},
		{HostCapacity: MaxHostCapacity},
		{Ordinal: 63, Capacity: 8 << 40, PageSize: 1 << 30, HostCapacity: 1 << 40}, // every limit at once
	}
	for _, cfg := range good {
		d, err := New(cfg)
		require.NoError(t, err, "%+v", cfg)
		require.NotNil(t, d)
	}
}

func TestMallocChargesWholePages(t *testing.T) {
	d := newDev(t, Config{Capacity: 10 * MiB, PageSize: 2 * MiB})
	base := d.MemoryBase()

	p1, err := d.Malloc(1) // one page
	require.NoError(t, err)
	assert.Equal(t, base, p1)
	p2, err := d.Malloc(2*MiB + 1) // two pages
	require.NoError(t, err)
	assert.Equal(t, base+device.Ptr(2*MiB), p2)
	free, total, _ := d.MemInfo()
	assert.Equal(t, 4*MiB, free)
	assert.Equal(t, 10*MiB, total)
	assert.Equal(t, []Range{
		{Ptr: p1, Size: 1, Charged: 2 * MiB},
		{Ptr: p2, Size: 2*MiB + 1, Charged: 4 * MiB},
	}, d.Allocations())
	assert.Equal(t, p2+device.Ptr(4*MiB), d.Allocations()[1].End())

	_, err = d.Malloc(4*MiB + 1) // three pages, two free
	require.ErrorIs(t, err, device.ErrOutOfMemory)
	var de *device.Error
	require.True(t, errors.As(err, &de))
	assert.Equal(t, "malloc", de.Op)
	assert.Contains(t, err.Error(), "4 MiB free of 10 MiB")

	p3, err := d.Malloc(4 * MiB) // exactly what is free
	require.NoError(t, err)
	assert.Equal(t, base+device.Ptr(6*MiB), p3)
	free, _, _ = d.MemInfo()
	assert.Zero(t, free)

	require.NoError(t, d.Free(p2))
	free, _, _ = d.MemInfo()
	assert.Equal(t, 4*MiB, free)
	c := d.Counters()
	assert.Equal(t, int64(3), c.Mallocs)
	assert.Equal(t, int64(1), c.Frees)
	assert.Equal(t, int64(1), c.FailedMallocs)
	assert.Equal(t, 6*MiB, c.BytesInUse)
	assert.Equal(t, 10*MiB, c.PeakBytesInUse)
	assert.Equal(t, int64(1), c.Synchronizations, "cudaFree synchronizes")
	assert.Equal(t, int64(3), c.MemInfos)

	t.Run("sizes", func(t *testing.T) {
		d := newDev(t, Config{Capacity: 16 * MiB, PageSize: 2 * MiB})
		cases := []struct{ size, charged uint64 }{
			{1, 2 * MiB},
			{2 * MiB, 2 * MiB},
			{2*MiB + 1, 4 * MiB},
			{512, 2 * MiB},
		}
		var want uint64
		for _, c := range cases {
			p := mustMalloc(t, d, c.size)
			want += c.charged
			assert.Equal(t, want, d.BytesInUse())
			free, total, err := d.MemInfo()
			require.NoError(t, err)
			assert.Equal(t, 16*MiB, total)
			assert.Equal(t, 16*MiB-want, free, "free = capacity - charged")
			allocs := d.Allocations()
			r := allocs[len(allocs)-1]
			assert.Equal(t, Range{Ptr: p, Size: c.size, Charged: c.charged}, r)
			assert.Equal(t, p+device.Ptr(c.charged), r.End())
		}
		c := d.Counters()
		assert.Equal(t, want, c.BytesInUse)
		assert.Equal(t, want, c.PeakBytesInUse)
		assert.Equal(t, int64(len(cases)), c.Mallocs)
	})
}

func TestMallocOutOfMemory(t *testing.T) {
	d := newDev(t, Config{Ordinal: 3, Capacity: 8 * MiB, PageSize: 2 * MiB})
	mustMalloc(t, d, 5*MiB) // three pages

	for _, size := range []uint64{2*MiB + 1, 4 * MiB, 9 * MiB, MaxCapacity, ^uint64(0) - 2*MiB - 1} {
		before := stateOf(d)
		p, err := d.Malloc(size)
		assert.Zero(t, p)
		requireDeviceError(t, err, "malloc", 3, device.ErrOutOfMemory)
		requireUnchanged(t, d, before, failedMalloc)
	}
	// Exactly what is free fits.
	mustMalloc(t, d, 2*MiB)
	free, _, err := d.MemInfo()
	require.NoError(t, err)
	assert.Zero(t, free)
	_, err = d.Malloc(1)
	require.ErrorIs(t, err, device.ErrOutOfMemory)
}

func TestMallocInvalidSize(t *testing.T) {
	t.Run("small pages", func(t *testing.T) {
		d := newDev(t, Config{Ordinal: 5, Capacity: 4 * 4096, PageSize: 4096})
		mustMalloc(t, d, 10)
		// Zero, and sizes whose rounding to pages overflows.
		for _, size := range []uint64{0, ^uint64(0), ^uint64(0) - 4094} {
			before := stateOf(d)
			p, err := d.Malloc(size)
			assert.Zero(t, p)
			requireDeviceError(t, err, "malloc", 5, device.ErrInvalidSize)
			requireUnchanged(t, d, before, failedMalloc)
		}
	})
	t.Run("default pages", func(t *testing.T) {
		d := newDev(t, Config{})
		p := mustMalloc(t, d, 1)
		before := stateOf(d)
		for _, size := range []uint64{0, ^uint64(0), ^uint64(0) - 2*MiB + 2} {
			_, err := d.Malloc(size)
			require.ErrorIs(t, err, device.ErrInvalidSize, "size %d", size)
		}
		_, err := d.Malloc(^uint64(0) - 2*MiB + 1) // rounds to the last page: representable, just too big
		require.ErrorIs(t, err, device.ErrOutOfMemory)
		_, err = d.Malloc(80*GiB + 1)
		require.ErrorIs(t, err, device.ErrOutOfMemory)
		requireUnchanged(t, d, before, func(c *Counters) { c.FailedMallocs += 5 })
		require.NoError(t, d.Free(p))
	})
}

func TestFreeInvalidPointer(t *testing.T) {
	d := newDev(t, Config{Ordinal: 2, Capacity: 16 * MiB, PageSize: 2 * MiB})
	a := mustMalloc(t, d, 4*MiB)
	b := mustMalloc(t, d, 1)
	require.NoError(t, d.Free(b))
	r, err := d.Reserve(2 * MiB)
	require.NoError(t, err)
	require.NoError(t, d.Map(r, 2*MiB))

	bad := map[string]device.Ptr{
		"null":           0,
		"double free":    b,
		"inside":         a + device.Ptr(2*MiB),
		"off by one":     a + 1,
		"a page below":   a - device.Ptr(2*MiB),
		"other ordinal":  device.Ptr(1) << 44,
		"far away":       ^device.Ptr(0),
		"beyond regions": 1 << 60,
		"never returned": b + device.Ptr(8*MiB),
		"a reservation":  r,
	}
	for name, p := range bad {
		t.Run(name, func(t *testing.T) {
			before := stateOf(d)
			err := d.Free(p)
			requireDeviceError(t, err, "free", 2, device.ErrInvalidPointer)
			requireUnchanged(t, d, before, failedFree)
		})
	}
	c := d.Counters()
	assert.Equal(t, int64(len(bad)), c.FailedFrees)
	assert.Equal(t, int64(1), c.Frees)
	require.NoError(t, d.Free(a))
	assert.Equal(t, 2*MiB, d.BytesInUse(), "the mapped page")
	require.ErrorIs(t, d.Free(a), device.ErrInvalidPointer, "double free")
}

func TestFreeReturnsPages(t *testing.T) {
	d := newDev(t, Config{Capacity: 8 * MiB, PageSize: 2 * MiB})
	a := mustMalloc(t, d, 3*MiB)
	b := mustMalloc(t, d, 1)
	require.NoError(t, d.Free(a))
	assert.Equal(t, 2*MiB, d.BytesInUse())
	assert.Equal(t, []Range{{Ptr: b, Size: 1, Charged: 2 * MiB}}, d.Allocations())
	free, _, err := d.MemInfo()
	require.NoError(t, err)
	assert.Equal(t, 6*MiB, free)
	require.NoError(t, d.Free(b))
	free, _, err = d.MemInfo()
	require.NoError(t, err)
	assert.Equal(t, 8*MiB, free)
	c := d.Counters()
	assert.Equal(t, int64(2), c.Frees)
	assert.Equal(t, 6*MiB, c.PeakBytesInUse)
	assert.Zero(t, c.BytesInUse)
}

// TestDeterminism runs one random call sequence on several devices and on
// the reference model: same addresses, same state, same clock, and on
// another ordinal the same addresses shifted to its region.
func TestDeterminism(t *testing.T) {
	const page = 2 * MiB
	type result struct {
		addrs  []device.Ptr
		allocs []Range
		c      Counters
		clock  time.Duration
	}
	run := func(ordinal int) result {
		d := mustNew(t, Config{Ordinal: ordinal, Capacity: 512 * page})
		ref := newRefSpace(uint64(ordinal+1)<<44, 1<<43)
		rng := rand.New(rand.NewPCG(1, 2))
		var live []Range
		var got []device.Ptr
		for range 3000 {
			if len(live) > 0 && rng.IntN(5) < 2 {
				i := rng.IntN(len(live))
				require.NoError(t, d.Free(live[i].Ptr))
				ref.give(uint64(live[i].Ptr), live[i].Charged)
				live = append(live[:i], live[i+1:]...)
				continue
			}
			size := 1 + rng.Uint64N(8*page)
			p, err := d.Malloc(size)
			if errors.Is(err, device.ErrOutOfMemory) {
				continue
			}
			require.NoError(t, err)
			charged := (size + page - 1) / page * page
			want, ok := ref.take(charged)
			require.True(t, ok)
			require.Equal(t, device.Ptr(want), p)
			live = append(live, Range{Ptr: p, Size: size, Charged: charged})
			got = append(got, p)
		}
		return result{got, d.Allocations(), d.Counters(), d.Clock()}
	}
	r1, r2 := run(0), run(0)
	require.Greater(t, len(r1.addrs), 1000)
	require.Positive(t, r1.c.FailedMallocs, "the sequence ran the device full")
	assert.Equal(t, r1, r2, "same calls, same addresses, state and clock")
	assert.Positive(t, r1.clock)
	r5 := run(5)
	require.Len(t, r5.addrs, len(r1.addrs))
	for i := range r1.addrs {
		assert.Equal(t, r1.addrs[i]+device.Ptr(5)<<44, r5.addrs[i], "ordinal 5 is ordinal 0 shifted by 5<<44")
	}
	assert.Equal(t, r1.c, r5.c)
	assert.Equal(t, r1.clock, r5.clock)
}

func TestCounters(t *testing.T) {
	d := newDev(t, Config{Capacity: 16 * MiB, PageSize: 2 * MiB})
	a := mustMalloc(t, d, 3*MiB)
	mustMalloc(t, d, 1)
	_, err := d.Malloc(16 * MiB)
	require.Error(t, err)
	_, err = d.Malloc(0)
	require.Error(t, err)
	require.NoError(t, d.Free(a))
	require.Error(t, d.Free(a))
	mustMalloc(t, d, 2*MiB)

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

	r, err := d.Reserve(14 * MiB)
	require.NoError(t, err)
	require.NoError(t, d.Map(r, 4*MiB))
	require.ErrorIs(t, d.Map(r+device.Ptr(4*MiB), 10*MiB), device.ErrOutOfMemory)
	require.ErrorIs(t, d.Map(r, 2*MiB), device.ErrInvalidArgument, "counts nothing")
	require.NoError(t, d.Unmap(r, 2*MiB))
	require.ErrorIs(t, d.Release(r), device.ErrInvalidArgument, "counts nothing")
	h, err := d.HostAlloc(100)
	require.NoError(t, err)
	h2, err := d.HostAlloc(50)
	require.NoError(t, err)
	require.NoError(t, d.HostFree(h))

	got := d.Counters()
	assert.Equal(t, Counters{
		Mallocs:                3,
		Frees:                  1,
		FailedMallocs:          2,
		FailedFrees:            1,
		BytesInUse:             4*MiB + 2*MiB, // two mallocs and one mapped page
		PeakBytesInUse:         4*MiB + 4*MiB, // two mallocs and two mapped pages
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
		MappedBytes:            2 * MiB,
		HostAllocs:             2,
		HostFrees:              1,
		HostBytesInUse:         uint64(len(h2)),
	}, got)
	assert.Equal(t, got.BytesInUse, d.BytesInUse())
}

func TestPeakBytesInUse(t *testing.T) {
	d := newDev(t, Config{Capacity: 16 * 4096, PageSize: 4096})
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

func TestFormatBytes(t *testing.T) {
	for n, want := range map[uint64]string{
		0: "0 B", 1023: "1023 B", KiB: "1 KiB", 1536: "1.50 KiB",
		2 * MiB: "2 MiB", 80 * GiB: "80 GiB", 8 << 40: "8 TiB", 3*GiB + GiB/4: "3.25 GiB",
	} {
		assert.Equal(t, want, formatBytes(n), "%d", n)
	}
}
