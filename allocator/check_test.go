package allocator

import (
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpumem/gpumem/allocator/internal/freeindex"
	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/device/sim"
	"github.com/gpumem/gpumem/internal/simtest"
	"github.com/gpumem/gpumem/stats"
)

// TestCheckInvariantsCatchesCorruption breaks the allocator's state in
// each way the checker promises to notice, and requires it to notice.
func TestCheckInvariantsCatchesCorruption(t *testing.T) {
	setup := func(t *testing.T) (*Allocator, *sim.Device, device.Ptr) {
		a, dev := newOn(t, Config{})
		p, err := a.Alloc(3*mib, 0) // a 20 MiB segment: [3 MiB allocated][17 MiB free]
		require.NoError(t, err)
		require.NoError(t, a.CheckInvariants())
		return a, dev, p
	}
	for _, c := range []struct {
		name, want string
		breakIt    func(a *Allocator, dev *sim.Device, p device.Ptr)
	}{
		{"gap between blocks", "gap or overlap", func(a *Allocator, _ *sim.Device, p device.Ptr) {
			b := a.def.live.Get(p)
			b.BreakSize(b.Size() - 512)
		}},
		{"unmerged free neighbours", "not merged", func(a *Allocator, _ *sim.Device, p device.Ptr) {
			b := a.def.live.Get(p)
			a.def.live.Remove(p)
			b.Allocated = false
			a.def.free[1].Insert(b)
		}},
		{"a block's copy of its segment's pool that differs", "says pool 0, expandable false, an unmapped range after it false; its segment and next block say 1, false, false", func(a *Allocator, _ *sim.Device, p device.Ptr) {
			a.def.live.Get(p).BreakPoolCopy()
		}},
		{"free block missing from the index", "not in its pool's free index", func(a *Allocator, _ *sim.Device, p device.Ptr) {
			a.def.free[1].Remove(a.def.live.Get(p).Next())
		}},
		{"allocated block missing from the address table", "not in its shard's address table", func(a *Allocator, _ *sim.Device, p device.Ptr) {
			a.def.live.Remove(p)
		}},
		{"a stat that drifted", "allocated_bytes", func(a *Allocator, _ *sim.Device, _ device.Ptr) {
			a.increase(a.def, int(stats.AllocatedBytes), qLarge, 512)
		}},
		{"reserved bytes off", "reserved_bytes", func(a *Allocator, _ *sim.Device, _ device.Ptr) {
			a.increase(a.def, int(stats.ReservedBytes), qSmall, 2*mib)
		}},
		{"a count above its limit", "above its limit", func(a *Allocator, _ *sim.Device, _ device.Ptr) {
			a.def.st[stats.Allocation].pool[qLarge].SetLimit(0)
		}},
		{"a peak below the limits", "is below the total", func(a *Allocator, _ *sim.Device, _ device.Ptr) {
			a.def.st[stats.ActiveBytes].allLim++ // with one shard, the limit is the peak
		}},
		{"a phase's count above its limit", `phase "fwd" bytes of stream 0: 3145728 is above its limit 0`, func(a *Allocator, _ *sim.Device, _ device.Ptr) {
			a.SetPhase("fwd")
			_, _ = a.Alloc(3*mib, 0)
			a.def.ph[1].bytes.SetLimit(0)
		}},
		{"a block's phase that is not a phase", "which is not a phase", func(a *Allocator, _ *sim.Device, p device.Ptr) {
			a.def.live.Get(p).Phase = 1 // the hand-out leaves it as it is while one phase exists
		}},
		{"a phase without its rows of the peaks", "the peaks have", func(a *Allocator, _ *sim.Device, _ device.Ptr) {
			a.SetPhase("fwd")
			a.phases = append(a.phases, phaseInfo{name: "bwd"})
		}},
		{"a phase's count that drifted", "blocks say", func(a *Allocator, _ *sim.Device, _ device.Ptr) {
			a.SetPhase("fwd")
			a.def.ph[0].blocks.Carry(1)
		}},
		{"the cold shard fast", "the cold shard is fast", func(a *Allocator, dev *sim.Device, _ device.Ptr) {
			for range maxShards {
				s, _ := dev.NewStream()
				_, _ = a.Alloc(512, s)
			}
			a.cold.fast.Store(true)
		}},
		{"a shard fast while stream events settle", "fast while stream events settle", func(a *Allocator, dev *sim.Device, _ device.Ptr) {
			twoShards(a, dev) // no event: both shards fast
			a.settling = 1
		}},
		{"settling out of its range", "settling -1 is not within", func(a *Allocator, _ *sim.Device, _ device.Ptr) {
			a.settling = -1
		}},
		{"active taken to follow allocation while a block is pending", "taken to follow allocation", func(a *Allocator, _ *sim.Device, _ device.Ptr) {
			a.def.st[stats.Active].pool[qLarge].Carry(1) // a pending block, as the stats see it
			a.def.st[stats.Allocation].pool[qLarge].Carry(-1)
			a.def.activeImplied = true
		}},
		{"a route naming the wrong shard", "the routes of region", func(a *Allocator, dev *sim.Device, p device.Ptr) {
			twoShards(a, dev)
			slot := a.routes.list(uint64(p), false)
			ps := slices.Clone(*slot.Load())
			ps[0].id = 7
			slot.Store(&ps)
		}},
		{"a segment's memory missing from the routes", "the routes of region", func(a *Allocator, dev *sim.Device, p device.Ptr) {
			twoShards(a, dev)
			a.routes.list(uint64(p), false).Store(nil)
		}},
		{"routes of memory no segment holds", "hold memory, the segments have", func(a *Allocator, dev *sim.Device, p device.Ptr) {
			twoShards(a, dev)
			a.routes.add(p+1<<40, 2*mib, a.def, +1)
		}},
		{"a cache slot of the routes naming the wrong shard", "the routes' cache names shard", func(a *Allocator, dev *sim.Device, p device.Ptr) {
			twoShards(a, dev)
			_, _ = a.routes.lookup(p) // fills p's slot: the default stream's shard, id 0
			a.routes.cache[routeSlot(uint64(p)>>routeChunkShift)].Add(1)
		}},
		{"a cache slot of the routes holding another slot's chunk", "not its own", func(a *Allocator, dev *sim.Device, p device.Ptr) {
			twoShards(a, dev)
			_, _ = a.routes.lookup(p)
			i := routeSlot(uint64(p) >> routeChunkShift)
			a.routes.cache[(i+1)%routeCacheSize].Store(a.routes.cache[i].Load())
		}},
		{"a stale lock-free list of shards", "lock-free list", func(a *Allocator, dev *sim.Device, _ device.Ptr) {
			twoShards(a, dev)
			a.byStream.Store(streamList([]*shard{a.def}))
		}},
		{"a free index of the wrong kind", "wrong kind", func(a *Allocator, _ *sim.Device, _ device.Ptr) {
			a.def.free[qLarge].BreakKind(freeindex.KindTree)
		}},
		{"a free block not marked indexed", "not marked indexed", func(a *Allocator, _ *sim.Device, p device.Ptr) {
			a.def.live.Get(p).Next().BreakIndexed()
		}},
		{"device memory used behind the allocator's back", "device reports", func(_ *Allocator, dev *sim.Device, _ device.Ptr) {
			_, _ = dev.Malloc(1)
		}},
		{"a segment pointing to another stream's index", "free index of its stream and pool", func(a *Allocator, _ *sim.Device, p device.Ptr) {
			a.def.live.Get(p).Seg().BreakFree(&a.def.free[0])
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			a, dev, p := setup(t)
			c.breakIt(a, dev, p)
			require.ErrorContains(t, a.CheckInvariants(), c.want)
		})
	}
}

// twoShards allocates on a second stream, so that the allocator keeps
// routes.
func twoShards(a *Allocator, dev *sim.Device) {
	s, _ := dev.NewStream()
	if _, err := a.Alloc(5*mib, s); err != nil {
		panic(err)
	}
}

func TestPassthrough(t *testing.T) {
	dev := simtest.New(t, simtest.Capacity(100*mib))
	_, err := NewPassthrough(nil)
	assert.Error(t, err)
	pt, err := NewPassthrough(dev)
	require.NoError(t, err)
	side, _ := dev.NewStream()
	require.NoError(t, dev.SetStreamBusy(side, true))

	p, err := pt.Alloc(1000, 0)
	require.NoError(t, err)
	q, err := pt.Alloc(3*mib, 0)
	require.NoError(t, err)
	z, err := pt.Alloc(0, 0)
	require.NoError(t, err)
	assert.Zero(t, z)
	assert.EqualValues(t, 2, dev.Counters().Mallocs, "every allocation is a device malloc")
	st := pt.Stats()
	assert.EqualValues(t, 1024+3*mib, st.Allocated(), "sizes are rounded as the caching allocator rounds them")
	assert.EqualValues(t, 2, st.Segment[stats.All].Current)
	assert.EqualValues(t, 1000+3*mib, st.RequestedBytes[stats.All].Current)

	require.NoError(t, pt.RecordStream(q, side))
	require.NoError(t, pt.Free(q))
	pending, _ := dev.PendingWork(side)
	assert.Zero(t, pending, "freeing a block used on a busy stream waits for that stream")
	assert.ErrorIs(t, pt.Free(q), device.ErrInvalidPointer)
	assert.ErrorIs(t, pt.RecordStream(q, side), device.ErrInvalidPointer)
	require.NoError(t, pt.Free(p))
	require.NoError(t, pt.Free(0))
	require.NoError(t, pt.EmptyCache())
	assert.EqualValues(t, 0, dev.BytesInUse())
	assert.EqualValues(t, 2, pt.Stats().NumDeviceFree)

	_, err = pt.Alloc(200*mib, 0)
	var oom *OutOfMemoryError
	require.ErrorAs(t, err, &oom)
	assert.EqualValues(t, 1, pt.Stats().NumOOMs)
	assert.ErrorIs(t, oom.Unwrap(), device.ErrOutOfMemory, "the device's own error is kept")
	_, err = pt.Alloc(1<<61, 0)
	assert.ErrorIs(t, err, device.ErrInvalidSize)
}

func TestSmallAccessors(t *testing.T) {
	a, _ := newTest(t, 0, Config{MaxSplitSize: 64 * mib})
	assert.Equal(t, Config{MaxSplitSize: 64 * mib}, a.Config())
	assert.Zero(t, a.LargestFreeBlock())
	mustFree(t, a, mustAlloc(t, a, 3*mib, 0))
	assert.EqualValues(t, 20*mib, a.LargestFreeBlock())
	assert.Equal(t, "unknown", ActionKind(99).String())
	assert.Equal(t, "segment_map", ActionSegmentMap.String())
	assert.Equal(t, "unknown", BlockState(9).String())
}

// TestCheckInvariantsCatchesPolicyCorruption breaks the low_fragmentation
// policy's state in each way the checker promises to notice.
func TestCheckInvariantsCatchesPolicyCorruption(t *testing.T) {
	// setup returns an allocator whose stream 1 borrowed a block cached
	// on the default stream: p is lent, q is an ordinary block.
	setup := func(t *testing.T) (a *Allocator, p, q device.Ptr) {
		a, dev := newOn(t, Config{Policy: PolicyLowFragmentation})
		s, err := dev.NewStream()
		require.NoError(t, err)
		r, err := a.Alloc(8*mib, 0)
		require.NoError(t, err)
		require.NoError(t, a.Free(r))
		p, err = a.Alloc(8*mib, s) // lent from the default stream's cache
		require.NoError(t, err)
		require.Equal(t, 1, a.pol.borrowed)
		q, err = a.Alloc(3*mib, 0)
		require.NoError(t, err)
		require.NoError(t, a.CheckInvariants())
		return a, p, q
	}
	for _, c := range []struct {
		name, want string
		breakIt    func(a *Allocator, p, q device.Ptr)
	}{
		{"a lent block not recorded on its borrower", "not recorded on the stream", func(a *Allocator, p, _ device.Ptr) {
			a.dropUsesLocked(a.liveBlock(p))
		}},
		{"a lent block lent to its own stream", "not recorded on the stream", func(a *Allocator, p, _ device.Ptr) {
			a.liveBlock(p).Borrower = 0
		}},
		{"a free block marked lent", "not an allocated block", func(a *Allocator, _, q device.Ptr) {
			b := a.liveBlock(q).Next()
			b.Lent, b.Borrower = true, 1
			a.pol.borrowed++
		}},
		{"a lent block not counted", "the policy counts", func(a *Allocator, _, _ device.Ptr) {
			a.pol.borrowed--
		}},
		{"a shard unaware its stream was recorded", "says its stream was recorded", func(a *Allocator, _, _ device.Ptr) {
			a.pol.hostWaited[a.def.stream] = struct{}{}
		}},
		{"a lending left half done", "outside Alloc", func(a *Allocator, _, _ device.Ptr) {
			a.pol.lending = true
		}},
		{"reserved above the high-water mark", "high-water mark", func(a *Allocator, _, _ device.Ptr) {
			a.pol.hwm = 2 * mib
		}},
		{"a segment with the wrong pages", "pages of", func(a *Allocator, _, q device.Ptr) {
			a.liveBlock(q).Seg().BreakPage(kLargeBuffer)
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			a, p, q := setup(t)
			c.breakIt(a, p, q)
			require.ErrorContains(t, a.CheckInvariants(), c.want)
		})
	}
}
