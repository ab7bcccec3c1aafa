package allocator

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/device/sim"
	"github.com/gpumem/gpumem/internal/simtest"
)

var expandable = Config{ExpandableSegments: true}

func TestExpandableMapsPagesNotSegments(t *testing.T) {
	a, dev := newTest(t, 0, expandable)
	mustAlloc(t, a, 1, 0)
	assert.EqualValues(t, 2*mib, get(t, a, "reserved_bytes.small_pool.current"), "one 2 MiB page of the small pool")
	assert.EqualValues(t, 0, get(t, a, "segment.all.current"), "mapping pages does not count as a segment")
	assert.EqualValues(t, 1, get(t, a, "num_device_alloc"))
	assert.EqualValues(t, 0, get(t, a, "inactive_split.all.current"), "expandable blocks are never inactive split")
	assert.EqualValues(t, 0, dev.Counters().Mallocs, "no cudaMalloc: only a reservation and a mapping")
	assert.EqualValues(t, 1, dev.Counters().Maps)
	assert.EqualValues(t, 2*mib, dev.BytesInUse())

	mustAlloc(t, a, 3*mib, 0)
	assert.EqualValues(t, 20*mib, get(t, a, "reserved_bytes.large_pool.current"), "one 20 MiB page of the large pool")
	assert.EqualValues(t, 3*mib, get(t, a, "allocated_bytes.large_pool.current"))
	assert.EqualValues(t, 2, dev.Counters().Reserves, "one reservation per pool (and stream)")
}

// TestExpandableMergesAcrossAllocations is the worked example of PyTorch's
// maintainers: eight 16 MiB blocks, freed, then four 32 MiB blocks. With
// plain segments the 32 MiB requests cannot use the 16 MiB segments
// (256 MiB reserved); with expandable segments the freed memory is one
// block and nothing new is mapped (140 MiB: seven 20 MiB pages).
func TestExpandableMergesAcrossAllocations(t *testing.T) {
	run := func(cfg Config) (reserved int64, a *Allocator) {
		a, _ = newTest(t, 0, cfg)
		var ps []device.Ptr
		for range 8 {
			ps = append(ps, mustAlloc(t, a, 16*mib, 0))
		}
		for _, p := range ps {
			mustFree(t, a, p)
		}
		for range 4 {
			mustAlloc(t, a, 32*mib, 0)
		}
		return get(t, a, "reserved_bytes.all.peak"), a
	}
	plain, _ := run(Config{})
	assert.EqualValues(t, 256*mib, plain)
	exp, a := run(expandable)
	assert.EqualValues(t, 140*mib, exp)
	segs := a.Snapshot()
	require.Len(t, segs, 1, "one mapped range")
	assert.True(t, segs[0].Expandable)
	assert.EqualValues(t, 140*mib, segs[0].Size)
}

func TestExpandableEmptyCacheUnmapsAndReleases(t *testing.T) {
	a, dev := newTest(t, 0, expandable)
	x := mustAlloc(t, a, 16*mib, 0)
	y := mustAlloc(t, a, 16*mib, 0) // pages 0-1 (40 MiB mapped)
	z := mustAlloc(t, a, 16*mib, 0) // page 2 (60 MiB mapped)
	mustFree(t, a, x)
	require.NoError(t, a.EmptyCache())
	require.NoError(t, a.CheckInvariants())
	// x covered [0, 16) MiB: page 0 ([0, 20)) also holds y's first 4 MiB,
	// so nothing is unmapped yet.
	assert.EqualValues(t, 60*mib, dev.BytesInUse())
	mustFree(t, a, z)
	require.NoError(t, a.EmptyCache())
	// Free now: [0, 16) and [32, 60): page 2 ([40, 60)) goes.
	assert.EqualValues(t, 40*mib, dev.BytesInUse())
	assert.EqualValues(t, 1, get(t, a, "num_device_free"))
	segs := a.Snapshot()
	require.Len(t, segs, 1)
	assert.EqualValues(t, 40*mib, segs[0].Size)
	mustFree(t, a, y)
	require.NoError(t, a.EmptyCache())
	assert.EqualValues(t, 0, dev.BytesInUse())
	assert.EqualValues(t, 0, get(t, a, "reserved_bytes.all.current"))
	assert.Empty(t, a.Snapshot())
	assert.EqualValues(t, 1, dev.Counters().Releases, "a wholly unmapped segment gives its address range back")
}

func TestExpandableOutOfMemoryUnmapsAndRetries(t *testing.T) {
	a, dev := newTest(t, 100*mib, expandable)
	x := mustAlloc(t, a, 60*mib, 0) // 3 pages
	mustFree(t, a, x)
	side, err := dev.NewStream()
	require.NoError(t, err)
	// Another stream has its own segment; the 60 MiB cached on stream 0
	// must be unmapped before stream 1 can map 80 MiB.
	y := mustAlloc(t, a, 70*mib, side)
	assert.EqualValues(t, 1, get(t, a, "num_alloc_retries"))
	assert.EqualValues(t, 80*mib, dev.BytesInUse())
	mustFree(t, a, y)

	_, err = a.Alloc(200*mib, 0)
	var oom *OutOfMemoryError
	require.ErrorAs(t, err, &oom)
	assert.ErrorIs(t, oom, device.ErrOutOfMemory)
	require.NoError(t, a.CheckInvariants())
}

func TestExpandableNeedsVirtualMemory(t *testing.T) {
	dev := simtest.New(t)
	_, err := New(struct{ device.Device }{dev}, expandable)
	assert.ErrorIs(t, err, device.ErrNotSupported)
}

func TestExpandableFailedUnmapKeepsPages(t *testing.T) {
	a, dev := newTest(t, 0, expandable)
	mustFree(t, a, mustAlloc(t, a, 30*mib, 0))
	dev.FailFrees(errors.New("injected"))
	require.Error(t, a.EmptyCache())
	require.NoError(t, a.CheckInvariants())
	assert.EqualValues(t, 40*mib, dev.BytesInUse())
	dev.FailFrees(nil)
	require.NoError(t, a.EmptyCache())
	assert.EqualValues(t, 0, dev.BytesInUse())
}

// TestFailedExpandableAllocLeavesNoReservation: a request larger than the
// device fails without leaving the address range reserved for it, so
// that failed allocations cannot exhaust the address space (8 GiB of
// memory gives an 8 TiB virtual region: about 900 such ranges).
func TestFailedExpandableAllocLeavesNoReservation(t *testing.T) {
	a, dev := newOn(t, expandable, simtest.Capacity(8<<30))
	for i := range 1000 {
		_, err := a.Alloc(16<<30, 0)
		require.ErrorIs(t, err, device.ErrOutOfMemory, "request %d", i)
		require.Empty(t, dev.Reservations(), "request %d left a reservation", i)
	}
	p, err := a.Alloc(mib, 0)
	require.NoError(t, err, "a small request still fits on the empty device")
	assert.EqualValues(t, 1000, get(t, a, "num_ooms"))
	require.NoError(t, a.Free(p))
	require.NoError(t, a.EmptyCache())
	assert.Empty(t, dev.Reservations(), "EmptyCache releases segments with nothing mapped")
	require.NoError(t, a.CheckInvariants())
}

// TestFailedUnmapIsRetried: pages the device refuses to unmap stay cached,
// and the next EmptyCache unmaps them and releases the reservation.
func TestFailedUnmapIsRetried(t *testing.T) {
	a, dev := newOn(t, expandable, simtest.Capacity(8<<30))
	p := mustAlloc(t, a, 3*mib, 0)
	mustFree(t, a, p)
	dev.FailFrees(errors.New("injected"))
	require.Error(t, a.EmptyCache(), "the unmap fails")
	require.NoError(t, a.CheckInvariants())
	dev.FailFrees(nil)
	require.NoError(t, a.EmptyCache())
	assert.Empty(t, dev.Reservations())
	assert.Zero(t, dev.BytesInUse())
	require.NoError(t, a.CheckInvariants())
}

// TestExpandableOnTheLargestDevice: expandable segments work on a device
// of the simulator's largest capacity, where each address range (9/8 of
// the device) is larger than the device itself.
func TestExpandableOnTheLargestDevice(t *testing.T) {
	a, dev := newOn(t, expandable, simtest.Capacity(sim.MaxCapacity))
	s, err := dev.NewStream()
	require.NoError(t, err)
	for _, st := range []device.Stream{0, s} {
		mustAlloc(t, a, 1, st)
		mustAlloc(t, a, 64*mib, st)
	}
	assert.Len(t, dev.Reservations(), 4, "a range per stream and pool")
}
