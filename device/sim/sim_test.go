// Tests of configuration, device memory, the address rule, costs and
// counters.

package sim

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpumem/gpumem/device"
)

var (
	_ device.Device        = (*Device)(nil)
	_ device.VirtualMemory = (*Device)(nil)
	_ device.HostMemory    = (*Device)(nil)
)

func TestNewDefaults(t *testing.T) {
	d, err := New(Config{})
	require.NoError(t, err)
	assert.Equal(t, 0, d.Ordinal())
	assert.Equal(t, DefaultName, d.Name())
	assert.Equal(t, uint64(80*GiB), d.Capacity())
	assert.Equal(t, 2*MiB, d.PageSize())
	assert.Equal(t, 2*MiB, d.Granularity())
	assert.Equal(t, DefaultCosts(), d.Costs())
	assert.Equal(t, device.Ptr(1<<44), d.MemoryBase())
	free, total, err := d.MemInfo()
	require.NoError(t, err)
	assert.Equal(t, 80*GiB, free)
	assert.Equal(t, 80*GiB, total)
	assert.Equal(t, "sim device 0 (gpumem simulated device): 0 B of 80 GiB in use, 2 MiB pages", d.String())
}

func TestNewRejectsBadConfig(t *testing.T) {
	for name, cfg := range map[string]Config{
		"negative ordinal":    {Ordinal: -1},
		"ordinal 64":          {Ordinal: 64},
		"capacity over 8 TiB": {Capacity: 8<<40 + 1},
		"page not power of 2": {PageSize: 3 << 20},
		"page too small":      {PageSize: 256},
		"page too large":      {PageSize: 2 << 30},
		"capacity under page": {Capacity: 1 << 20, PageSize: 2 << 20},
		"host capacity":       {HostCapacity: 1<<40 + 1},
	} {
		t.Run(name, func(t *testing.T) {
			d, err := New(cfg)
			require.Error(t, err)
			assert.Nil(t, d)
			assert.ErrorIs(t, err, device.ErrInvalidArgument)
			assert.True(t, strings.HasPrefix(err.Error(), "sim: "), err.Error())
		})
	}
	_, err := New(Config{Ordinal: 63, Capacity: 8 << 40, PageSize: 1 << 30, HostCapacity: 1 << 40})
	require.NoError(t, err, "the limits themselves are valid")
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
		{Ptr: p1, Size: 1, Pages: 2 * MiB},
		{Ptr: p2, Size: 2*MiB + 1, Pages: 4 * MiB},
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
}

func TestMallocInvalidSizes(t *testing.T) {
	d := newDev(t, Config{})
	p, err := d.Malloc(1)
	require.NoError(t, err)
	before := stateOf(d)
	for _, size := range []uint64{0, ^uint64(0), ^uint64(0) - 2*MiB + 2} {
		_, err := d.Malloc(size)
		require.ErrorIs(t, err, device.ErrInvalidSize, "size %d", size)
	}
	_, err = d.Malloc(^uint64(0) - 2*MiB + 1) // rounds to the last page: representable, just too big
	require.ErrorIs(t, err, device.ErrOutOfMemory)
	_, err = d.Malloc(80*GiB + 1)
	require.ErrorIs(t, err, device.ErrOutOfMemory)
	assert.Equal(t, before, stateOf(d))
	assert.Equal(t, int64(5), d.Counters().FailedMallocs)
	require.NoError(t, d.Free(p))
}

func TestFreeInvalidPointers(t *testing.T) {
	d := newDev(t, Config{})
	p, err := d.Malloc(3 * MiB)
	require.NoError(t, err)
	before := stateOf(d)
	for _, bad := range []device.Ptr{0, p + 1, p + device.Ptr(2*MiB), p - device.Ptr(2*MiB), 1 << 60} {
		err := d.Free(bad)
		require.ErrorIs(t, err, device.ErrInvalidPointer, "ptr %v", bad)
		var de *device.Error
		require.True(t, errors.As(err, &de))
		assert.Equal(t, "free", de.Op)
	}
	assert.Equal(t, before, stateOf(d))
	require.NoError(t, d.Free(p))
	err = d.Free(p)
	require.ErrorIs(t, err, device.ErrInvalidPointer, "double free")
	assert.Equal(t, int64(6), d.Counters().FailedFrees)
	assert.Equal(t, int64(1), d.Counters().Frees)
}

func TestAddressRuleFirstFitLowestAddress(t *testing.T) {
	d := newDev(t, Config{PageSize: 2 * MiB})
	base := d.MemoryBase()
	at := func(pages uint64) device.Ptr { return base + device.Ptr(pages*2*MiB) }
	var ps []device.Ptr
	for _, size := range []uint64{2 * MiB, 4 * MiB, 2 * MiB, 6 * MiB, 2 * MiB} {
		p, err := d.Malloc(size)
		require.NoError(t, err)
		ps = append(ps, p)
	}
	// Pages: [0] [1 2] [3] [4 5 6] [7]
	assert.Equal(t, []device.Ptr{at(0), at(1), at(3), at(4), at(7)}, ps)
	require.NoError(t, d.Free(ps[1])) // hole of 2 pages at 1
	require.NoError(t, d.Free(ps[3])) // hole of 3 pages at 4
	p, err := d.Malloc(5 * MiB)       // 3 pages: only the hole at 4 fits
	require.NoError(t, err)
	assert.Equal(t, at(4), p)
	p, err = d.Malloc(1) // lowest hole
	require.NoError(t, err)
	assert.Equal(t, at(1), p)
	p, err = d.Malloc(4 * MiB) // no hole fits: the top
	require.NoError(t, err)
	assert.Equal(t, at(8), p)
	require.NoError(t, d.Free(ps[2])) // page 3 merges with free page 2
	p, err = d.Malloc(4 * MiB)
	require.NoError(t, err)
	assert.Equal(t, at(2), p, "freed neighbours merge into one hole")
}

func TestAddressSpaceIsNotBoundedByCapacity(t *testing.T) {
	// Free every other page of a full device: half is free but no two free
	// pages touch. A two-page Malloc still succeeds, above the others.
	d := newDev(t, Config{Capacity: 16 * MiB, PageSize: 2 * MiB})
	var ps []device.Ptr
	for range 8 {
		p, err := d.Malloc(2 * MiB)
		require.NoError(t, err)
		ps = append(ps, p)
	}
	for i := 0; i < 8; i += 2 {
		require.NoError(t, d.Free(ps[i]))
	}
	p, err := d.Malloc(4 * MiB)
	require.NoError(t, err)
	assert.Equal(t, d.MemoryBase()+device.Ptr(16*MiB), p)
	free, _, _ := d.MemInfo()
	assert.Equal(t, 4*MiB, free)
}

func TestDeterministicAddresses(t *testing.T) {
	run := func(ordinal int) []device.Ptr {
		d := newDev(t, Config{Ordinal: ordinal, Capacity: GiB})
		var out, live []device.Ptr
		x := uint64(12345)
		for i := range 2000 {
			x ^= x << 13
			x ^= x >> 7
			x ^= x << 17
			if len(live) > 0 && (x%3 == 0 || i%50 == 49) {
				j := int(x>>8) % len(live)
				require.NoError(t, d.Free(live[j]))
				live = append(live[:j], live[j+1:]...)
				continue
			}
			p, err := d.Malloc(1 + x%(9*MiB))
			if errors.Is(err, device.ErrOutOfMemory) {
				continue
			}
			require.NoError(t, err)
			out = append(out, p)
			live = append(live, p)
		}
		return out
	}
	a, b := run(0), run(0)
	require.NotEmpty(t, a)
	assert.Equal(t, a, b, "same calls, same addresses")
	c := run(5)
	require.Len(t, c, len(a))
	for i := range a {
		assert.Equal(t, a[i]+device.Ptr(5)<<44, c[i], "ordinal 5 is ordinal 0 shifted by 5<<44")
	}
}

func TestCostsAndClock(t *testing.T) {
	costs := Costs{
		Malloc: 10 * time.Microsecond, MallocPerGiB: time.Millisecond,
		Free: 5 * time.Microsecond, Synchronize: 7 * time.Microsecond,
		MemInfo: -1, // free of cost
	}
	d, err := New(Config{Costs: costs})
	require.NoError(t, err)
	got := d.Costs()
	assert.Zero(t, got.MemInfo)
	assert.Equal(t, DefaultCosts().EventRecord, got.EventRecord, "zero fields take the default")

	p, err := d.Malloc(GiB / 2)
	require.NoError(t, err)
	assert.Equal(t, 10*time.Microsecond+500*time.Microsecond, d.Clock())
	_, _, _ = d.MemInfo()
	assert.Equal(t, 510*time.Microsecond, d.Clock(), "a negative cost is free")
	require.NoError(t, d.Free(p))
	assert.Equal(t, 522*time.Microsecond, d.Clock(), "Free costs itself plus a synchronization")
	require.Error(t, d.Free(p))
	assert.Equal(t, 527*time.Microsecond, d.Clock(), "a failed call costs its call")

	free, err := New(Config{Costs: NoCosts()})
	require.NoError(t, err)
	assert.Equal(t, Costs{}, free.Costs())
	p, _ = free.Malloc(GiB)
	_ = free.Free(p)
	assert.Zero(t, free.Clock())
}

func TestCostArithmeticSaturates(t *testing.T) {
	assert.Equal(t, time.Duration(1<<63-1), perGiB(time.Hour, ^uint64(0)))
	assert.Equal(t, time.Duration(1<<63-1), times(time.Second, ^uint64(0)))
	assert.Equal(t, time.Duration(1<<63-1), plus(1<<62, 1<<62))
	assert.Equal(t, 3*time.Millisecond, perGiB(2*time.Millisecond, 3*GiB/2))
	d := newDev(t, Config{Costs: Costs{Malloc: time.Hour, MallocPerGiB: time.Hour}})
	for range 3 {
		_, err := d.Malloc(^uint64(0))
		require.Error(t, err)
	}
	assert.Equal(t, time.Duration(1<<63-1), d.Clock(), "the clock saturates rather than wrapping")
}

func TestSleepReallySleeps(t *testing.T) {
	d := newDev(t, Config{Sleep: true, Costs: Costs{Malloc: 20 * time.Millisecond, MallocPerGiB: -1}})
	start := time.Now()
	p, err := d.Malloc(1)
	require.NoError(t, err)
	elapsed := time.Since(start)
	// A lower bound only: sleeping at least the cost is the behaviour.
	assert.GreaterOrEqual(t, elapsed, 20*time.Millisecond)
	require.NoError(t, d.Free(p))
}

func TestSleepDoesNotHoldTheLock(t *testing.T) {
	slow := newDev(t, Config{Sleep: true, Costs: Costs{Synchronize: 200 * time.Millisecond}})
	done := make(chan struct{})
	go func() {
		_ = slow.Synchronize()
		close(done)
	}()
	// Wait until the sleeper has paid (it counts before sleeping), then
	// take the lock: this must not wait for the sleep to end.
	for slow.Counters().Synchronizations == 0 {
		time.Sleep(time.Millisecond)
	}
	_, _, err := slow.MemInfo()
	require.NoError(t, err)
	select {
	case <-done:
		t.Fatal("Synchronize returned before its simulated cost elapsed")
	default:
	}
	<-done
}

func TestFormatBytes(t *testing.T) {
	for n, want := range map[uint64]string{
		0: "0 B", 1023: "1023 B", KiB: "1 KiB", 1536: "1.50 KiB",
		2 * MiB: "2 MiB", 80 * GiB: "80 GiB", 8 << 40: "8 TiB", 3*GiB + GiB/4: "3.25 GiB",
	} {
		assert.Equal(t, want, formatBytes(n), "%d", n)
	}
}
