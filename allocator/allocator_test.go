package allocator

import (
	"errors"
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/device/sim"
	"github.com/gpumem/gpumem/internal/simtest"
	"github.com/gpumem/gpumem/stats"
)

func TestOneByteReservesOneSmallSegment(t *testing.T) {
	a, dev := newTest(t, 0, Config{})
	p := mustAlloc(t, a, 1, 0)
	assert.NotZero(t, p)
	assert.EqualValues(t, 2*mib, get(t, a, "reserved_bytes.all.current"))
	assert.EqualValues(t, 2*mib, get(t, a, "reserved_bytes.small_pool.current"))
	assert.EqualValues(t, 512, get(t, a, "allocated_bytes.all.current"))
	assert.EqualValues(t, 1, get(t, a, "requested_bytes.all.current"))
	assert.EqualValues(t, 1, get(t, a, "segment.small_pool.current"))
	assert.EqualValues(t, 1, get(t, a, "inactive_split.small_pool.current"))
	assert.EqualValues(t, 2*mib-512, get(t, a, "inactive_split_bytes.small_pool.current"))
	assert.EqualValues(t, 1, dev.Counters().Mallocs)
	assert.EqualValues(t, 2*mib, dev.BytesInUse())
}

func TestTwoMiBRequestsShareASmallSegment(t *testing.T) {
	a, dev := newTest(t, 0, Config{})
	p1 := mustAlloc(t, a, mib, 0)
	p2 := mustAlloc(t, a, mib, 0)
	assert.Equal(t, p1+mib, p2, "the second block is the rest of the first segment")
	assert.EqualValues(t, 2*mib, get(t, a, "reserved_bytes.all.current"))
	assert.EqualValues(t, 1, dev.Counters().Mallocs)
	assert.EqualValues(t, 0, get(t, a, "inactive_split.all.current"))
	p3 := mustAlloc(t, a, mib, 0)
	assert.EqualValues(t, 2, dev.Counters().Mallocs, "a third needs a new segment")
	mustFree(t, a, p1, p2, p3)
}

func TestJustOverOneMiBReservesTwentyMiB(t *testing.T) {
	a, _ := newTest(t, 0, Config{})
	p := mustAlloc(t, a, mib+1, 0)
	assert.EqualValues(t, 20*mib, get(t, a, "reserved_bytes.large_pool.current"))
	assert.EqualValues(t, mib+512, get(t, a, "allocated_bytes.large_pool.current"))
	assert.EqualValues(t, 0, get(t, a, "reserved_bytes.small_pool.current"))
	mustFree(t, a, p)
	segs := a.Snapshot()
	require.Len(t, segs, 1)
	require.Len(t, segs[0].Blocks, 1, "freeing the only allocation merges the segment back into one block")
	assert.EqualValues(t, 20*mib, segs[0].Blocks[0].Size)
}

func TestTenMiBReservesExactlyTenMiB(t *testing.T) {
	a, _ := newTest(t, 0, Config{})
	mustAlloc(t, a, 10*mib, 0)
	assert.EqualValues(t, 10*mib, get(t, a, "reserved_bytes.all.current"))
	a2, _ := newTest(t, 0, Config{})
	mustAlloc(t, a2, 10*mib+1, 0)
	assert.EqualValues(t, 12*mib, get(t, a2, "reserved_bytes.all.current"), "large requests round up to 2 MiB")
	a3, _ := newTest(t, 0, Config{})
	mustAlloc(t, a3, 10*mib-512, 0)
	assert.EqualValues(t, 20*mib, get(t, a3, "reserved_bytes.all.current"), "below 10 MiB: a 20 MiB segment")
}

func TestFreeingEveryBlockLeavesOneBlockThenEmptyCacheReturnsIt(t *testing.T) {
	a, dev := newTest(t, 0, Config{})
	var ps []device.Ptr
	for range 7 {
		ps = append(ps, mustAlloc(t, a, 256*kib, 0))
	}
	// Free in an order that exercises merging on both sides.
	for _, i := range []int{1, 3, 0, 2, 6, 4, 5} {
		mustFree(t, a, ps[i])
	}
	segs := a.Snapshot()
	require.Len(t, segs, 1)
	require.Len(t, segs[0].Blocks, 1)
	assert.EqualValues(t, 2*mib, segs[0].Blocks[0].Size)
	assert.Equal(t, BlockFree, segs[0].Blocks[0].State)
	assert.EqualValues(t, 0, get(t, a, "inactive_split.all.current"))
	assert.EqualValues(t, 2*mib, dev.BytesInUse(), "a wholly free segment stays cached")

	require.NoError(t, a.EmptyCache())
	require.NoError(t, a.CheckInvariants())
	assert.EqualValues(t, 0, dev.BytesInUse())
	assert.EqualValues(t, 0, get(t, a, "reserved_bytes.all.current"))
	assert.EqualValues(t, 1, get(t, a, "num_device_free"))
	assert.EqualValues(t, 1, get(t, a, "num_sync_all_streams"))
	assert.Empty(t, a.Snapshot())
}

func TestCachedBlockIsReusedWithoutDeviceCalls(t *testing.T) {
	a, dev := newTest(t, 0, Config{})
	p := mustAlloc(t, a, 4*mib, 0)
	mustFree(t, a, p)
	before := dev.Counters()
	for range 100 {
		q := mustAlloc(t, a, 4*mib, 0)
		assert.Equal(t, p, q)
		mustFree(t, a, q)
	}
	assert.Equal(t, before, dev.Counters(), "the cached path calls no device")
}

func TestBestFitTakesSmallestThenLowestAddress(t *testing.T) {
	a, _ := newTest(t, 0, Config{})
	// Three separate large segments of 12, 14, 12 MiB, all freed.
	x := mustAlloc(t, a, 12*mib, 0)
	y := mustAlloc(t, a, 14*mib, 0)
	z := mustAlloc(t, a, 12*mib, 0)
	mustFree(t, a, z, y, x)
	got := mustAlloc(t, a, 11*mib, 0)
	assert.Equal(t, x, got, "12 MiB blocks fit best; the lower address wins the tie")
	got2 := mustAlloc(t, a, 11*mib, 0)
	assert.Equal(t, z, got2)
	got3 := mustAlloc(t, a, 11*mib, 0)
	assert.Equal(t, y, got3)
}

func TestSplitRules(t *testing.T) {
	t.Run("small pool splits a remainder of 512 bytes", func(t *testing.T) {
		a, dev := newTest(t, 0, Config{})
		mustAlloc(t, a, mib, 0)
		mustAlloc(t, a, mib-512, 0)
		assert.EqualValues(t, 2*mib-512, get(t, a, "allocated_bytes.all.current"))
		assert.EqualValues(t, 512, get(t, a, "inactive_split_bytes.small_pool.current"))
		mustAlloc(t, a, 1, 0)
		assert.EqualValues(t, 0, get(t, a, "inactive_split.all.current"))
		assert.EqualValues(t, 1, dev.Counters().Mallocs, "three blocks tile one 2 MiB segment")
	})
	t.Run("large pool keeps a remainder of 1 MiB or less", func(t *testing.T) {
		a, _ := newTest(t, 0, Config{})
		p := mustAlloc(t, a, 12*mib, 0)
		mustFree(t, a, p)
		mustAlloc(t, a, 11*mib, 0) // 1 MiB left: not split
		assert.EqualValues(t, 12*mib, get(t, a, "allocated_bytes.all.current"))
		assert.EqualValues(t, 11*mib, get(t, a, "requested_bytes.all.current"))
	})
	t.Run("large pool splits a remainder above 1 MiB", func(t *testing.T) {
		a, _ := newTest(t, 0, Config{})
		mustAlloc(t, a, 2*mib, 0) // in a 20 MiB segment
		assert.EqualValues(t, 2*mib, get(t, a, "allocated_bytes.all.current"))
		assert.EqualValues(t, 18*mib, get(t, a, "inactive_split_bytes.large_pool.current"))
		assert.EqualValues(t, 1, get(t, a, "inactive_split.large_pool.current"))
	})
}

func TestMaxSplitSize(t *testing.T) {
	cfg := Config{MaxSplitSize: 128 * mib}
	t.Run("oversize blocks are not split and not given to small requests", func(t *testing.T) {
		a, dev := newTest(t, 0, cfg)
		p := mustAlloc(t, a, 200*mib, 0)
		assert.EqualValues(t, 1, get(t, a, "oversize_allocations.current"))
		assert.EqualValues(t, 1, get(t, a, "oversize_segments.current"))
		mustFree(t, a, p)
		assert.EqualValues(t, 0, get(t, a, "oversize_allocations.current"))
		q := mustAlloc(t, a, 50*mib, 0)
		assert.NotEqual(t, p, q, "a request below max_split_size never takes an oversize block")
		assert.EqualValues(t, 2, dev.Counters().Mallocs)
	})
	t.Run("oversize requests take a cached block only within 20 MiB", func(t *testing.T) {
		a, dev := newTest(t, 0, cfg)
		p := mustAlloc(t, a, 200*mib, 0)
		mustFree(t, a, p)
		q := mustAlloc(t, a, 181*mib, 0) // 200 < 182+20: taken whole
		assert.Equal(t, p, q)
		assert.EqualValues(t, 200*mib, get(t, a, "allocated_bytes.all.current"), "not split")
		mustFree(t, a, q)
		r := mustAlloc(t, a, 180*mib, 0) // 200 >= 180+20: too wasteful
		assert.NotEqual(t, p, r)
		assert.EqualValues(t, 2, dev.Counters().Mallocs)
	})
	t.Run("max_split_size stat", func(t *testing.T) {
		a, _ := newTest(t, 0, cfg)
		assert.EqualValues(t, 128*mib, get(t, a, "max_split_size"))
		b, _ := newTest(t, 0, Config{})
		assert.EqualValues(t, -1, get(t, b, "max_split_size"))
	})
}

func TestRounding(t *testing.T) {
	cases := []struct{ in, want uint64 }{
		{1, 512}, {511, 512}, {512, 512}, {513, 1024}, {1000, 1024}, {mib, mib}, {mib + 1, mib + 512},
	}
	for _, c := range cases {
		assert.Equal(t, c.want, roundSize(c.in, nil), "roundSize(%d)", c.in)
	}
	var d [NumRoundupIntervals]uint64
	for i := range d {
		d[i] = 4
	}
	assert.EqualValues(t, 1536, roundSize(1200, &d), "PyTorch's guard: 1200 <= 512*4 rounds normally")
	assert.EqualValues(t, 1280*kib, roundSize(1200*kib, &d), "1200 KiB -> next quarter of [1 MiB, 2 MiB)")
	assert.EqualValues(t, 2*mib, roundSize(2*mib, &d), "powers of two stay")
	assert.EqualValues(t, 2*mib+512*kib, roundSize(2*mib+1, &d))
	assert.EqualValues(t, 1280, roundupPower2NextDivision(1200, 4))
	assert.EqualValues(t, 1024, roundupPower2NextDivision(1024, 4))
	assert.EqualValues(t, 1026, roundupPower2NextDivision(1025, 512))
	assert.EqualValues(t, 2048, roundupPower2NextDivision(1025, 2048), "a step of 0 rounds to the next power of two")
	assert.Equal(t, 0, roundupIndex(1))
	assert.Equal(t, 0, roundupIndex(2*mib-1))
	assert.Equal(t, 1, roundupIndex(2*mib))
	assert.Equal(t, 15, roundupIndex(1<<62))
}

func TestSegmentSize(t *testing.T) {
	for _, c := range []struct{ in, want uint64 }{
		{512, 2 * mib}, {mib, 2 * mib}, {mib + 512, 20 * mib}, {10*mib - 512, 20 * mib},
		{10 * mib, 10 * mib}, {10*mib + 512, 12 * mib}, {gib + 1, gib + 2*mib},
	} {
		r := splitRule{large: kLargeBuffer}
		assert.Equal(t, c.want, r.segmentSize(c.in), "segmentSize(%d)", c.in)
	}
	r := splitRule{large: 12 * mib}
	assert.EqualValues(t, 12*mib, r.segmentSize(mib+512), "large_segment_size_mb:12 sizes the segments of 1-10 MiB requests")
	assert.EqualValues(t, 12*mib, r.segmentSize(10*mib+512), "larger requests round up to 2 MiB as before")
	assert.EqualValues(t, 2*mib, r.segmentSize(mib), "the small pool keeps 2 MiB")
}

func TestSizeZero(t *testing.T) {
	a, dev := newTest(t, 0, Config{})
	p, err := a.Alloc(0, 0)
	require.NoError(t, err)
	assert.Zero(t, p)
	require.NoError(t, a.Free(0))
	assert.EqualValues(t, 0, dev.Counters().Mallocs)
	assert.Equal(t, stats.DeviceStats{MaxSplitSize: -1}, a.Stats())
}

// state captures what must not change when a call fails.
type state struct {
	st   stats.DeviceStats
	snap []SegmentInfo
	dev  sim.Counters
}

func capture(a *Allocator, dev *sim.Device) state {
	return state{a.Stats(), a.Snapshot(), dev.Counters()}
}

func TestBadInputChangesNothing(t *testing.T) {
	a, dev := newTest(t, 0, Config{})
	p := mustAlloc(t, a, 3*mib, 0)
	q := mustAlloc(t, a, 100, 0)
	mustFree(t, a, q)
	before := capture(a, dev)

	_, err := a.Alloc(1<<60, 0)
	assert.ErrorIs(t, err, device.ErrInvalidSize)
	assert.ErrorIs(t, err, device.ErrOutOfMemory, "PyTorch raises its out-of-memory error above 1 EB")
	_, err = a.Alloc(uint64(int64(-5)&(1<<63-1))|1<<63, 0) // a negative int64 as uint64
	assert.ErrorIs(t, err, device.ErrInvalidSize)
	_, err = a.Alloc(100, 99)
	assert.ErrorIs(t, err, device.ErrInvalidStream)
	err = a.Free(q)
	assert.ErrorIs(t, err, device.ErrInvalidPointer, "double free")
	assert.Contains(t, err.Error(), "double free")
	err = a.Free(12345)
	assert.ErrorIs(t, err, device.ErrInvalidPointer)
	assert.Contains(t, err.Error(), "not allocated by this allocator")
	err = a.Free(p + 512)
	assert.ErrorIs(t, err, device.ErrInvalidPointer, "an interior pointer")
	assert.ErrorIs(t, a.RecordStream(12345, 0), device.ErrInvalidPointer)
	assert.ErrorIs(t, a.RecordStream(p, 42), device.ErrInvalidStream)
	assert.Error(t, a.SetMemoryFraction(0))
	assert.Error(t, a.SetMemoryFraction(1.5))

	assert.Equal(t, before, capture(a, dev))
	mustFree(t, a, p)
}

func TestNewRejectsBadConfigAndDevice(t *testing.T) {
	dev := simtest.New(t)
	_, err := New(nil, Config{})
	assert.Error(t, err)
	for _, c := range []Config{
		{MaxSplitSize: 20*mib - 512},
		{MaxNonSplitRounding: 1},
		{LargeSegmentSize: 10 * mib},
		{LargeSegmentSize: 12*mib + 1},
		{LargeSegmentSize: 40 * mib, MaxSplitSize: 30 * mib},
		{LargeSegmentSize: 40 * mib, MaxNonSplitRounding: 30 * mib},
		{ExpandableSegmentsReserve: Reserve{Value: -1}},
		{ExpandableSegmentsReserve: Reserve{Value: math.Inf(1), GiB: true}},
		{ExpandableSegmentsReserveByClass: "b:0.5,a:0.5"},
		{ExpandableSegmentsReserveByClass: "a:0.50"},
		{ExpandableSegmentsReserveByClass: "a b:0.5"},
		{Pinned: PinnedConfig{NumRegisterThreads: 3}},
		{Pinned: PinnedConfig{NumRegisterThreads: 256}},
		{GarbageCollectionThreshold: 1},
		{GarbageCollectionThreshold: -0.5},
		{MemoryFraction: 2},
		{RoundupPower2Divisions: [NumRoundupIntervals]uint64{3}},
	} {
		_, err := New(dev, c)
		assert.Error(t, err, "config %+v", c)
	}
}

func TestOutOfMemoryLadder(t *testing.T) {
	t.Run("flushes the cache and retries before failing", func(t *testing.T) {
		a, dev := newTest(t, 100*mib, Config{})
		p := mustAlloc(t, a, 60*mib, 0)
		mustFree(t, a, p) // 60 MiB cached
		q := mustAlloc(t, a, 70*mib, 0)
		assert.EqualValues(t, 1, get(t, a, "num_alloc_retries"))
		assert.EqualValues(t, 1, get(t, a, "num_device_free"))
		assert.EqualValues(t, 0, get(t, a, "num_ooms"))
		assert.EqualValues(t, 70*mib, dev.BytesInUse())
		mustFree(t, a, q)
	})
	t.Run("fails with a typed error when nothing can be released", func(t *testing.T) {
		a, dev := newTest(t, 100*mib, Config{})
		p := mustAlloc(t, a, 60*mib, 0)
		small := mustAlloc(t, a, 3*mib, 0) // a 20 MiB segment, split
		var seen []*OutOfMemoryError
		remove := a.OnOutOfMemory(func(e *OutOfMemoryError) { seen = append(seen, e) })
		before := capture(a, dev)
		_, err := a.Alloc(30*mib, 0)
		require.Error(t, err)
		assert.ErrorIs(t, err, device.ErrOutOfMemory)
		var oom *OutOfMemoryError
		require.ErrorAs(t, err, &oom)
		assert.EqualValues(t, 30*mib, oom.Requested)
		assert.EqualValues(t, 30*mib, oom.AllocSize)
		assert.EqualValues(t, 100*mib, oom.DeviceTotal)
		assert.EqualValues(t, 20*mib, oom.DeviceFree)
		assert.EqualValues(t, 63*mib, oom.Allocated)
		assert.EqualValues(t, 80*mib, oom.Reserved)
		assert.EqualValues(t, 17*mib, oom.ReservedUnallocated)
		assert.EqualValues(t, 17*mib, oom.LargestFreeBlock)
		assert.Contains(t, err.Error(), "Tried to allocate 30.00 MiB")
		assert.Contains(t, err.Error(), "try expandable_segments:True")
		assert.NotContains(t, err.Error(), "max_split_size_mb", "PyTorch stopped advising it first in 2.2")
		require.Len(t, seen, 1)
		assert.Same(t, oom, seen[0])
		after := capture(a, dev)
		assert.EqualValues(t, 1, after.st.NumOOMs)
		assert.EqualValues(t, 1, after.st.NumAllocRetries)
		assert.EqualValues(t, 1, after.st.NumSyncAllStreams)
		after.st.NumOOMs, after.st.NumAllocRetries, after.st.NumSyncAllStreams = 0, 0, 0
		assert.Equal(t, before.st, after.st, "only the counters moved")
		assert.Equal(t, before.snap, after.snap)
		remove()
		_, err = a.Alloc(30*mib, 0)
		require.Error(t, err)
		assert.Len(t, seen, 1, "removed observers are not called")
		mustFree(t, a, p, small)
	})
	t.Run("releases cached oversize blocks first", func(t *testing.T) {
		a, dev := newTest(t, 300*mib, Config{MaxSplitSize: 64 * mib})
		x := mustAlloc(t, a, 100*mib, 0)
		y := mustAlloc(t, a, 90*mib, 0)
		mustFree(t, a, x, y)
		mustAlloc(t, a, 150*mib, 0) // 190 cached + 150 > 300: release the 100 MiB block only? needs 150: both
		assert.EqualValues(t, 0, get(t, a, "num_alloc_retries"), "the oversize release was enough")
		assert.EqualValues(t, 2, get(t, a, "num_device_free"))
		assert.EqualValues(t, 150*mib, dev.BytesInUse())
	})
	t.Run("releases the smallest single oversize block that is big enough", func(t *testing.T) {
		a, dev := newTest(t, 400*mib, Config{MaxSplitSize: 64 * mib})
		x := mustAlloc(t, a, 100*mib, 0)
		y := mustAlloc(t, a, 200*mib, 0)
		z := mustAlloc(t, a, 90*mib, 0)
		mustFree(t, a, x, y, z)
		// 390 reserved, 10 free. No cached block serves 70 MiB (90 >= 70+20),
		// so the device is asked and refuses; z (90 MiB) is the smallest
		// cached oversize block of at least 70 MiB, and releasing it is enough.
		mustAlloc(t, a, 70*mib, 0)
		assert.EqualValues(t, 1, get(t, a, "num_device_free"))
		assert.EqualValues(t, 0, get(t, a, "num_alloc_retries"))
		assert.EqualValues(t, 370*mib, dev.BytesInUse())
	})
	t.Run("device refusal of another kind is returned as is", func(t *testing.T) {
		a, dev := newTest(t, 0, Config{})
		boom := errors.New("boom")
		dev.FailMallocWhen(func(uint64) bool { return true })
		_, err := a.Alloc(mib, 0)
		assert.ErrorIs(t, err, device.ErrOutOfMemory)
		dev.FailMallocWhen(nil)
		_ = boom
	})
}

func TestMemoryCaps(t *testing.T) {
	t.Run("fraction", func(t *testing.T) {
		a, dev := newTest(t, 100*mib, Config{MemoryFraction: 0.5})
		mustAlloc(t, a, 40*mib, 0)
		_, err := a.Alloc(12*mib, 0)
		var oom *OutOfMemoryError
		require.ErrorAs(t, err, &oom)
		assert.EqualValues(t, 50*mib, oom.Allowed)
		assert.Nil(t, oom.Err, "the cap refused without asking the device")
		assert.Contains(t, err.Error(), "50.00 MiB allowed")
		assert.EqualValues(t, 1, dev.Counters().Mallocs)
		require.NoError(t, a.SetMemoryFraction(1))
		mustAlloc(t, a, 12*mib, 0)
	})
	t.Run("byte limit", func(t *testing.T) {
		a, _ := newTest(t, 0, Config{MemoryLimit: 30 * mib})
		mustAlloc(t, a, 20*mib, 0)
		_, err := a.Alloc(12*mib, 0)
		assert.ErrorIs(t, err, device.ErrOutOfMemory)
	})
}

func TestGarbageCollection(t *testing.T) {
	// With a threshold of 0.5 on a 100 MiB cap, a miss with more than 50 MiB
	// reserved releases the oldest unsplit cached large blocks.
	a, dev := newTest(t, 100*mib, Config{GarbageCollectionThreshold: 0.5, MemoryFraction: 1})
	require.NoError(t, a.SetMemoryFraction(0.999999))
	x := mustAlloc(t, a, 30*mib, 0)
	y := mustAlloc(t, a, 24*mib, 0)
	mustFree(t, a, x, y)
	// Reuse y a few times so that x is older.
	for range 3 {
		mustFree(t, a, mustAlloc(t, a, 24*mib, 0))
	}
	assert.EqualValues(t, 54*mib, dev.BytesInUse())
	mustAlloc(t, a, 40*mib, 0) // miss: reserved 54 > 50 -> GC frees x (age >= average)
	assert.EqualValues(t, 1, get(t, a, "num_device_free"))
	assert.EqualValues(t, 64*mib, dev.BytesInUse())
	assert.EqualValues(t, 0, get(t, a, "num_alloc_retries"))

	// Without a cap, the threshold does nothing (as in PyTorch 2.6).
	b, bdev := newTest(t, 100*mib, Config{GarbageCollectionThreshold: 0.5})
	x = mustAlloc(t, b, 30*mib, 0)
	y = mustAlloc(t, b, 24*mib, 0)
	mustFree(t, b, x, y)
	mustAlloc(t, b, 40*mib, 0)
	assert.EqualValues(t, 0, get(t, b, "num_device_free"))
	assert.EqualValues(t, 94*mib, bdev.BytesInUse())
}

func TestEmptyCacheKeepsSplitSegments(t *testing.T) {
	a, dev := newTest(t, 0, Config{})
	p := mustAlloc(t, a, 100, 0)
	q := mustAlloc(t, a, 4*mib, 0)
	r := mustAlloc(t, a, 30*mib, 0)
	mustFree(t, a, r)
	require.NoError(t, a.EmptyCache())
	assert.EqualValues(t, 22*mib, dev.BytesInUse(), "the small and the 20 MiB segments hold live blocks")
	mustFree(t, a, p, q)
	require.NoError(t, a.EmptyCache())
	assert.EqualValues(t, 0, dev.BytesInUse())
}

func TestFailedDeviceFreeKeepsBlockCached(t *testing.T) {
	a, dev := newTest(t, 0, Config{})
	mustFree(t, a, mustAlloc(t, a, 30*mib, 0))
	dev.FailFrees(errors.New("injected"))
	before := capture(a, dev)
	err := a.EmptyCache()
	require.Error(t, err)
	after := capture(a, dev)
	assert.Equal(t, before.snap, after.snap)
	assert.Equal(t, before.st.ReservedBytes, after.st.ReservedBytes)
	dev.FailFrees(nil)
	require.NoError(t, a.EmptyCache())
	assert.EqualValues(t, 0, dev.BytesInUse())
}

func TestObserverSeesEveryEvent(t *testing.T) {
	a, _ := newTest(t, 0, Config{})
	var got []Action
	detach := a.Attach(observerFunc(func(e Action) { got = append(got, e) }))
	p := mustAlloc(t, a, 3000, 0)
	mustFree(t, a, p)
	require.NoError(t, a.EmptyCache())
	detach()
	mustAlloc(t, a, 3000, 0)
	kinds := []ActionKind{}
	for _, e := range got {
		kinds = append(kinds, e.Kind)
	}
	assert.Equal(t, []ActionKind{ActionSegmentAlloc, ActionAlloc, ActionFreeRequested, ActionFreeCompleted, ActionEmptyCache, ActionSegmentFree}, kinds)
	assert.EqualValues(t, 3000, got[1].Requested)
	assert.EqualValues(t, 3072, got[1].Size)
	assert.Equal(t, p, got[1].Ptr)
	assert.Equal(t, "free_requested", ActionFreeRequested.String())
}

type observerFunc func(Action)

func (f observerFunc) Observe(e Action) { f(e) }

func TestSnapshot(t *testing.T) {
	a, _ := newTest(t, 0, Config{})
	p := mustAlloc(t, a, 1000, 0)
	q := mustAlloc(t, a, 3*mib, 0)
	segs := a.Snapshot()
	require.Len(t, segs, 2)
	assert.Less(t, segs[0].Ptr, segs[1].Ptr)
	small, large := segs[0], segs[1]
	if small.Pool != stats.SmallPool {
		small, large = large, small
	}
	assert.Equal(t, stats.SmallPool, small.Pool)
	assert.EqualValues(t, 2*mib, small.Size)
	assert.EqualValues(t, 1024, small.Allocated)
	assert.EqualValues(t, 1000, small.Requested)
	require.Len(t, small.Blocks, 2)
	assert.Equal(t, BlockInfo{Ptr: p, Size: 1024, Requested: 1000, State: BlockAllocated}, small.Blocks[0])
	assert.Equal(t, BlockFree, small.Blocks[1].State)
	assert.Equal(t, "inactive", small.Blocks[1].State.String())
	assert.Equal(t, q, large.Blocks[0].Ptr)
	assert.Equal(t, stats.LargePool, large.Pool)
}

// TestFailedAllocCostsWhatItReleases: an out-of-memory failure releases
// the cache, and that costs what is released, not a walk over every
// cached block: 100,000 free blocks in split segments are not examined;
// with expandable segments and the policy, neither are 100,000 free
// blocks too small to hold a page (each failure examined all of them
// before: 14.5 ms a failure at 125,000 of them).
func TestFailedAllocCostsWhatItReleases(t *testing.T) {
	if selfCheck {
		t.Skip("with gpumem_invariants every operation walks every block: 200,000 of them take hours")
	}
	for _, conf := range []string{"", "expandable_segments:True", "gpumem_policy:low_fragmentation"} {
		t.Run(conf, func(t *testing.T) {
			cfg, err := ParseConf(conf)
			require.NoError(t, err)
			a, _ := newOn(t, cfg, simtest.Capacity(4<<30))
			n := 200_000
			ptrs := make([]device.Ptr, n)
			for i := range ptrs {
				ptrs[i], err = a.Alloc(512, 0)
				require.NoError(t, err)
			}
			for i := 1; i < len(ptrs); i += 2 { // every other block stays: the segments stay split
				require.NoError(t, a.Free(ptrs[i]))
			}
			whole := mustAlloc(t, a, 30*mib, 0)
			mustFree(t, a, whole) // one whole free segment, or pages
			before := get(t, a, "reserved_bytes.all.current")
			for range 3 {
				a.examined = 0
				_, err = a.Alloc(8<<30, 0)
				require.ErrorIs(t, err, device.ErrOutOfMemory)
				assert.LessOrEqual(t, a.examined, 1, "only the free block that holds whole pages is looked at")
			}
			assert.Less(t, get(t, a, "reserved_bytes.all.current"), before, "the whole free memory was released")
			if conf == "" { // expandable blocks never count as inactive split
				assert.EqualValues(t, n/2, get(t, a, "inactive_split.all.current"))
			}
			require.NoError(t, a.CheckInvariants())
		})
	}
}
