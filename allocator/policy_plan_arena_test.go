// Tests of the arena a served step holds out of the free index
// (freeindex's held arena): every other use of the index files its free
// blocks back first, and the stats and the checks see it as it is.

package allocator

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/stats"
)

// servedHalf plans stepSizes on a (three steps) and starts a fourth,
// served from the arena, as runStep does, up to its request half: the
// blocks of the requests before half are freed but the last, which it
// returns with the addresses of the third step.
func servedHalf(t *testing.T, a *Allocator, half int) (live device.Ptr, want []device.Ptr) {
	t.Helper()
	runStep(t, a, stepSizes)
	runStep(t, a, stepSizes)
	want, _ = runStep(t, a, stepSizes)
	a.MarkStep("step")
	for i := range half {
		p := mustAlloc(t, a, stepSizes[i], 0)
		require.Equal(t, want[i], p, "request %d is served at its planned address", i)
		if live != 0 {
			mustFree(t, a, live)
		}
		live = p
	}
	require.True(t, a.def.free[qLarge].HoldsArena(), "a served step holds its arena out of the free index")
	return live, want
}

// finishStep allocates the rest of stepSizes from request half on, as
// runStep does, live the block of the request before half.
func finishStep(t *testing.T, a *Allocator, half int, live device.Ptr) (ptrs []device.Ptr) {
	t.Helper()
	for i := half; i < len(stepSizes); i++ {
		p := mustAlloc(t, a, stepSizes[i], 0)
		ptrs = append(ptrs, p)
		mustFree(t, a, live)
		live = p
	}
	mustFree(t, a, live)
	return ptrs
}

// truth is what the segments' blocks say, walked through the snapshot.
func truth(segs []SegmentInfo) (reserved, allocated, free uint64, freeBlocks int) {
	for _, s := range segs {
		reserved += s.Size
		allocated += s.Allocated
		for _, b := range s.Blocks {
			if b.State == BlockFree {
				free += b.Size
				freeBlocks++
			}
		}
	}
	return
}

// wholeFreePages counts the pages of page bytes (from the start of each
// mapped range) that free blocks of segs hold whole.
func wholeFreePages(segs []SegmentInfo, page uint64) (n int) {
	for _, s := range segs {
		for _, b := range s.Blocks {
			if b.State != BlockFree {
				continue
			}
			off := uint64(b.Ptr - s.Ptr)
			first, end := (off+page-1)/page*page, off+b.Size
			if first+page <= end {
				n += int((end - first) / page)
			}
		}
	}
	return n
}

// A snapshot reads the segments' blocks, held ones as the free blocks
// they are: it leaves the arena held. A read of the index as a whole
// (LargestFreeBlock) files it back first.
func TestHeldArenaSnapshotAndWorldMidStep(t *testing.T) {
	a, dev := newOn(t, Config{Policy: PolicyPlanned})
	weights := mustAlloc(t, a, 30<<20, 0)
	const half = 5
	live, want := servedHalf(t, a, half)
	st := a.Stats() // read while the arena is held
	require.True(t, a.def.free[qLarge].HoldsArena(), "reading the stats leaves the arena held")
	segs := a.Snapshot()
	require.True(t, a.def.free[qLarge].HoldsArena(), "a snapshot reads the segments: the arena stays held")
	require.NoError(t, a.CheckInvariants())
	reserved, allocated, free, _ := truth(segs)
	var largest uint64
	for _, s := range segs {
		for _, b := range s.Blocks {
			if b.State == BlockFree {
				largest = max(largest, b.Size)
			}
		}
	}
	assert.Equal(t, largest, a.LargestFreeBlock(), "the index's largest free block is the snapshot's")
	assert.False(t, a.def.free[qLarge].HoldsArena(), "a read of the whole index files the arena back first")
	require.NoError(t, a.CheckInvariants())
	assert.EqualValues(t, dev.BytesInUse(), reserved)
	assert.EqualValues(t, st.ReservedBytes[stats.All].Current, reserved, "reserved read while held is the truth")
	assert.EqualValues(t, st.AllocatedBytes[stats.All].Current, allocated, "allocated read while held is the truth")
	assert.EqualValues(t, reserved-allocated, free, "every byte not allocated is a free block of the snapshot")
	assert.EqualValues(t, st.InactiveSplit[stats.All].Current, get(t, a, "inactive_split.all.current"))

	_, served, _ := planCounts(a)
	rest := finishStep(t, a, half, live)
	assert.Equal(t, want[half:], rest, "the step goes on served from the arena, held again")
	_, served2, dep := planCounts(a)
	assert.EqualValues(t, len(stepSizes)-half, served2-served)
	assert.Zero(t, dep)
	mustFree(t, a, weights)
}

func TestHeldArenaFiledBackByAnOnlineRequest(t *testing.T) {
	a, _ := newOn(t, Config{Policy: PolicyPlanned})
	const half = 4
	live, _ := servedHalf(t, a, half)
	s, err := a.dev.NewStream()
	require.NoError(t, err)
	q := mustAlloc(t, a, 5<<20, s) // another stream: a departure, served online
	assert.False(t, a.def.free[qLarge].HoldsArena(), "a request served online files the arena back")
	finishStep(t, a, half, live)
	mustFree(t, a, q)
	require.NoError(t, a.EmptyCache())
}

func TestHeldArenaEmptyCacheMidStep(t *testing.T) {
	a, dev := newOn(t, Config{Policy: PolicyPlanned})
	const half = 5
	live, _ := servedHalf(t, a, half)
	require.NoError(t, a.EmptyCache())
	require.NoError(t, a.CheckInvariants())
	assert.False(t, a.def.free[qLarge].HoldsArena(), "EmptyCache files the arena back first")
	reserved, allocated, free, _ := truth(a.Snapshot())
	assert.EqualValues(t, dev.BytesInUse(), reserved)
	assert.EqualValues(t, stepSizes[half-1], allocated)
	const page = 2 << 20
	assert.Less(t, free, uint64(2*page), "free bytes but those of the live block's pages")
	assert.Zero(t, wholeFreePages(a.Snapshot(), page), "EmptyCache unmapped the arena's free pages")
	finishStep(t, a, half, live) // what the released pages left of the plan, online
	assert.EqualValues(t, dev.BytesInUse(), get(t, a, "reserved_bytes.all.current"))
	assert.Zero(t, get(t, a, "allocated_bytes.all.current"))
}

func TestHeldArenaCrossStreamFree(t *testing.T) {
	a, dev := newOn(t, Config{Policy: PolicyPlanned})
	side, err := dev.NewStream()
	require.NoError(t, err)
	const half = 5
	live, _ := servedHalf(t, a, half)
	require.NoError(t, dev.SetStreamBusy(side, true))
	require.NoError(t, a.RecordStream(live, side))
	mustFree(t, a, live) // pending until the side stream's work completes
	assert.EqualValues(t, stepSizes[half-1], get(t, a, "active_bytes.all.current"))
	var ptrs []device.Ptr
	for i := half; i < len(stepSizes); i++ {
		p := mustAlloc(t, a, stepSizes[i], 0)
		ptrs = append(ptrs, p)
		if i > half {
			mustFree(t, a, ptrs[len(ptrs)-2])
		}
	}
	require.NoError(t, dev.CompleteStream(side))
	require.NoError(t, dev.SetStreamBusy(side, false))
	mustFree(t, a, ptrs[len(ptrs)-1])
	mustAlloc(t, a, 512, 0) // processes the completed event
	reserved, allocated, free, _ := truth(a.Snapshot())
	assert.EqualValues(t, dev.BytesInUse(), reserved)
	assert.EqualValues(t, 512, allocated)
	assert.EqualValues(t, reserved-allocated, free)
}

func TestCheckInvariantsCatchesABrokenHeldArena(t *testing.T) {
	a, _ := newOn(t, Config{Policy: PolicyPlanned})
	servedHalf(t, a, 5)
	require.NoError(t, a.CheckInvariants())
	x := &a.def.free[qLarge]
	x.BreakArenaEnd(512) // the range ends within its first free block
	require.Error(t, a.CheckInvariants())
}
