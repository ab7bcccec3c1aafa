package allocator

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/stats"
)

// TestHeldFront follows the front of a split that its free holds instead
// of merging it back (freeindex.Index.Retake): the stats, the snapshot
// and the invariants see the block from before the split while it is
// held, a request of its size takes it again, and a request of another
// size, the free of its neighbour and a walk merge it back first.
func TestHeldFront(t *testing.T) {
	a, _ := newTest(t, 0, Config{})
	x := &a.def.free[qSmall]
	const head, front = 256 * kib, 512 * kib
	p := mustAlloc(t, a, head, device.DefaultStream) // keeps the segment split
	split := func(blocks, bytes int64) {
		t.Helper()
		st := a.Stats()
		require.Equal(t, blocks, st.InactiveSplit[stats.All].Current)
		require.Equal(t, bytes, st.InactiveSplitBytes[stats.All].Current)
		require.Equal(t, int64(1), st.InactiveSplit[stats.All].Peak)
		require.Equal(t, int64(2*mib-head), st.InactiveSplitBytes[stats.All].Peak)
		require.NoError(t, a.CheckInvariants())
	}
	split(1, 2*mib-head)
	q := mustAlloc(t, a, front, device.DefaultStream)
	require.NoError(t, a.Free(q))
	require.Nil(t, x.Held(), "out of a loop, the free of the front merges it")
	require.Equal(t, q, mustAlloc(t, a, front, device.DefaultStream)) // remembered: a loop
	require.NoError(t, a.Free(q))
	require.NotNil(t, x.Held(), "in a loop, the free of the front holds it")
	split(1, 2*mib-head) // the block from before the split, one block

	// The snapshot shows that block whole, and leaves the front held or
	// not: the next request of its size takes the same block.
	segs := a.Snapshot()
	require.Len(t, segs, 1)
	require.Len(t, segs[0].Blocks, 2)
	require.Equal(t, uint64(2*mib-head), segs[0].Blocks[1].Size)
	require.Equal(t, BlockFree, segs[0].Blocks[1].State)

	for range 3 {
		r := mustAlloc(t, a, front, device.DefaultStream)
		require.Equal(t, q, r, "the same block, taken again")
		require.Nil(t, x.Held())
		split(1, 2*mib-head-front)
		require.NoError(t, a.Free(r))
		require.NotNil(t, x.Held())
		split(1, 2*mib-head)
	}
	st := a.Stats()
	require.Equal(t, int64(6), st.Allocation[stats.All].Allocated) // 1 + 5
	require.Equal(t, int64(1), st.Allocation[stats.All].Current)
	require.Equal(t, int64(2), st.Allocation[stats.All].Peak)
	require.Equal(t, int64(head+front), st.AllocatedBytes[stats.All].Peak)

	// Another size: the held front is merged back, and the best fit of
	// the block from before the split is split anew.
	r := mustAlloc(t, a, kib, device.DefaultStream)
	require.Equal(t, q, r)
	require.Nil(t, x.Held())
	split(1, 2*mib-head-kib)
	require.NoError(t, a.Free(r))
	require.Nil(t, x.Held(), "a search ends the loop")
	for range 2 {
		require.Equal(t, q, mustAlloc(t, a, front, device.DefaultStream))
		require.NoError(t, a.Free(q))
	}
	require.NotNil(t, x.Held())

	// The free of its neighbour merges the whole segment.
	require.NoError(t, a.Free(p))
	require.Nil(t, x.Held())
	split(0, 0)
	segs = a.Snapshot()
	require.Len(t, segs[0].Blocks, 1)
	st = a.Stats()
	require.Equal(t, int64(0), st.AllocatedBytes[stats.All].Current)
	require.Equal(t, int64(head+front), st.AllocatedBytes[stats.All].Peak)
	require.Equal(t, int64(0), st.RequestedBytes[stats.All].Current)

	// A front held in a segment that it and its rest fill: taken again,
	// it splits a whole segment.
	for i := range 3 {
		r = mustAlloc(t, a, front, device.DefaultStream)
		require.Equal(t, p, r)
		st = a.Stats()
		require.Equal(t, int64(1), st.InactiveSplit[stats.All].Current)
		require.Equal(t, int64(2*mib-front), st.InactiveSplitBytes[stats.All].Current)
		require.NoError(t, a.Free(r))
		require.Equal(t, i > 0, x.Held() != nil)
		st = a.Stats()
		require.Equal(t, int64(0), st.InactiveSplit[stats.All].Current)
		require.Equal(t, int64(0), st.InactiveSplitBytes[stats.All].Current)
		require.NoError(t, a.CheckInvariants())
	}
}

// TestHeldCredit follows the credit of a held front's free
// (shard.credit): its hand-out again tests no limit only when the counts
// come back to at most where they were before the free. A larger request,
// the world (a reset of the peaks), a hand-out of another block in
// between and a change of phase each make the hand-out test its limits,
// and raise the peaks it passes. (Under the self-check, which takes the
// world after every call, no credit is left to use.)
func TestHeldCredit(t *testing.T) {
	const front, big = 512 * kib, 20 * mib
	// held makes a loop of front-byte requests of requested bytes, and
	// checks that the shard holds the front with its credit.
	held := func(t *testing.T, a *Allocator, requested uint64) device.Ptr {
		t.Helper()
		q := mustAlloc(t, a, requested, device.DefaultStream)
		require.NoError(t, a.Free(q))
		for range 2 {
			require.Equal(t, q, mustAlloc(t, a, requested, device.DefaultStream))
			require.NoError(t, a.Free(q))
		}
		f := a.def.free[qSmall].Held()
		require.NotNil(t, f)
		if !selfCheck { // the self-check takes the world after each call
			require.Same(t, f, a.def.credit)
		}
		return q
	}
	t.Run("steps", func(t *testing.T) {
		// While steps are logged (the ledger listens, and the shard stays
		// fast), a free leaves no credit: every hand-out again is logged
		// (retakeOther), and the next boundary counts the one block
		// alive.
		a, _ := newTest(t, 0, Config{})
		a.MarkStep("first")
		q := mustAlloc(t, a, front, device.DefaultStream)
		require.NoError(t, a.Free(q))
		for range 4 {
			require.Equal(t, q, mustAlloc(t, a, front, device.DefaultStream))
			require.NoError(t, a.Free(q))
		}
		require.NotNil(t, a.def.free[qSmall].Held())
		require.True(t, a.def.fast.Load() || selfCheck)
		require.Nil(t, a.def.credit)
		require.Equal(t, q, mustAlloc(t, a, front, device.DefaultStream))
		a.MarkStep("second")
		require.Equal(t, map[leakKey]int64{{0, front}: 1}, a.def.steps.alive)
		require.NoError(t, a.CheckInvariants())
	})
	t.Run("within", func(t *testing.T) {
		a, _ := newTest(t, 0, Config{})
		q := held(t, a, front)
		require.Equal(t, q, mustAlloc(t, a, front-256, device.DefaultStream))
		st := a.Stats()
		require.Equal(t, int64(front), st.RequestedBytes[stats.All].Peak)
		require.Equal(t, int64(front-256), st.RequestedBytes[stats.All].Current)
		require.Equal(t, int64(4), st.Allocation[stats.All].Allocated)
		require.NoError(t, a.CheckInvariants())
	})
	t.Run("requested rises", func(t *testing.T) {
		a, _ := newTest(t, 0, Config{})
		q := held(t, a, front-256)
		require.Equal(t, q, mustAlloc(t, a, front, device.DefaultStream))
		require.Equal(t, int64(front), a.Stats().RequestedBytes[stats.All].Peak)
		require.NoError(t, a.CheckInvariants())
	})
	t.Run("world", func(t *testing.T) {
		a, _ := newTest(t, 0, Config{})
		q := held(t, a, front)
		a.ResetPeakStats()
		require.Nil(t, a.def.credit)
		require.Equal(t, q, mustAlloc(t, a, front, device.DefaultStream))
		st := a.Stats()
		require.Equal(t, int64(front), st.AllocatedBytes[stats.All].Peak)
		require.Equal(t, int64(1), st.Allocation[stats.SmallPool].Peak)
		require.NoError(t, a.CheckInvariants())
	})
	t.Run("hand-out between", func(t *testing.T) {
		a, _ := newTest(t, 0, Config{})
		l := mustAlloc(t, a, big, device.DefaultStream)
		require.NoError(t, a.Free(l)) // cached: its next hand-out needs no world
		q := held(t, a, front)
		r, err := a.Alloc(big, device.DefaultStream) // not mustAlloc: its check takes the world
		require.NoError(t, err)
		require.Equal(t, l, r)
		require.Equal(t, q, mustAlloc(t, a, front, device.DefaultStream))
		st := a.Stats()
		require.Equal(t, int64(big+front), st.AllocatedBytes[stats.All].Peak)
		require.Equal(t, int64(2), st.Allocation[stats.All].Peak)
		require.NoError(t, a.CheckInvariants())
	})
	t.Run("large free between", func(t *testing.T) {
		a, _ := newTest(t, 0, Config{})
		const l = 4 * mib // two of a 20 MiB segment
		l1 := mustAlloc(t, a, l, device.DefaultStream)
		mustAlloc(t, a, l, device.DefaultStream)
		q := held(t, a, front)
		// l1's free keeps its segment split: inactive_split_bytes of the
		// large pool rise back to their peak, and no allocation rises.
		require.NoError(t, a.Free(l1))
		require.Equal(t, q, mustAlloc(t, a, front, device.DefaultStream))
		st := a.Stats()
		require.Equal(t, int64(20*mib-l+2*mib-front), st.InactiveSplitBytes[stats.All].Peak)
		require.NoError(t, a.CheckInvariants())
	})
	t.Run("phase", func(t *testing.T) {
		a, _ := newTest(t, 0, Config{})
		a.SetPhase("b") // b's counts exist, below what the hand-out brings
		require.NoError(t, a.Free(mustAlloc(t, a, kib, device.DefaultStream)))
		a.SetPhase("a")
		q := held(t, a, front)
		require.Equal(t, q, mustAlloc(t, a, front, device.DefaultStream))
		a.SetPhase("b") // the world: no credit, and q is of phase a
		require.NoError(t, a.Free(q))
		require.NotNil(t, a.def.free[qSmall].Held())
		require.Nil(t, a.def.credit, "the free of a front of another phase than the current leaves no credit")
		require.Equal(t, q, mustAlloc(t, a, front, device.DefaultStream))
		var b stats.PhaseStats
		for _, ps := range a.PhaseStats() {
			if ps.Name == "b" {
				b = ps
			}
		}
		require.Equal(t, int64(1), b.Allocations.Peak)
		require.Equal(t, int64(front), b.AllocatedBytes.Peak)
		require.NoError(t, a.CheckInvariants())
	})
	t.Run("events pending", func(t *testing.T) {
		// A stream event pending keeps every shard off its fast path, so
		// the world that resets the peaks leaves the credit in place; the
		// hand-out again, in the world, still tests its limits.
		a, dev := newTest(t, 0, Config{})
		side, err := dev.NewStream()
		require.NoError(t, err)
		r := mustAlloc(t, a, 4*mib, device.DefaultStream)
		require.NoError(t, a.RecordStream(r, side))
		require.NoError(t, dev.SetStreamBusy(side, true)) // its free waits for the event
		mustFree(t, a, r)
		// Calls without the invariant checker, whose world polls the
		// pending event and so merges a held front back.
		alloc := func() device.Ptr {
			p, err := a.Alloc(front, device.DefaultStream)
			require.NoError(t, err)
			return p
		}
		q := alloc()
		require.NoError(t, a.Free(q))
		for range 4 { // until a free holds the front
			if a.def.free[qSmall].Held() != nil {
				break
			}
			require.Equal(t, q, alloc())
			require.NoError(t, a.Free(q))
		}
		require.NotNil(t, a.def.free[qSmall].Held())
		require.False(t, a.def.fast.Load())
		if !selfCheck {
			require.Same(t, a.def.free[qSmall].Held(), a.def.credit)
		}
		a.ResetPeakStats()
		require.Equal(t, q, alloc())
		require.NoError(t, a.Free(q))
		st := a.Stats()
		require.Equal(t, int64(0), st.AllocatedBytes[stats.SmallPool].Current)
		require.Equal(t, int64(front), st.AllocatedBytes[stats.SmallPool].Peak)
		require.Equal(t, int64(1), st.Allocation[stats.SmallPool].Peak)
		require.NoError(t, dev.SetStreamBusy(side, false))
	})
}

// TestHeldDoubleFree frees a held front again: freed by the fast path,
// it stays parked in its shard's address table (freeindex.PtrTable.Park),
// yet a second free fails as any double free does and changes nothing,
// and no reader of the table takes it for an allocated block.
func TestHeldDoubleFree(t *testing.T) {
	a, dev := newTest(t, 0, Config{})
	x := &a.def.free[qSmall]
	const head, front = 256 * kib, 512 * kib
	p := mustAlloc(t, a, head, device.DefaultStream) // keeps the segment split
	q := mustAlloc(t, a, front, device.DefaultStream)
	mustFree(t, a, q)
	require.Equal(t, q, mustAlloc(t, a, front, device.DefaultStream)) // a loop
	mustFree(t, a, q)
	require.NotNil(t, x.Held())
	require.True(t, x.IsParked(), "freed by the fast path, the front stays in the table")
	require.Equal(t, 1, a.def.live.Len(), "a parked entry is not an allocated block")
	st := a.Stats()
	var held string
	for range 2 {
		err := a.Free(q)
		require.ErrorIs(t, err, device.ErrInvalidPointer)
		require.Contains(t, err.Error(), "double free")
		held = err.Error()
		require.ErrorIs(t, a.RecordStream(q, device.DefaultStream), device.ErrInvalidPointer)
		require.Equal(t, st, a.Stats())
		require.True(t, x.IsParked())
		require.NoError(t, a.CheckInvariants())
	}
	// (capture's snapshot merges the held front back.)
	before := capture(a, dev)
	require.ErrorIs(t, a.Free(q), device.ErrInvalidPointer)
	require.Equal(t, before, capture(a, dev))
	for range 2 { // a loop again
		require.Equal(t, q, mustAlloc(t, a, front, device.DefaultStream))
		mustFree(t, a, q)
	}

	// Taken again, it is allocated once more: one free, then a double
	// free again.
	require.Equal(t, q, mustAlloc(t, a, front, device.DefaultStream))
	require.False(t, x.IsParked())
	require.Equal(t, 2, a.def.live.Len())
	require.NoError(t, a.CheckInvariants())
	mustFree(t, a, q)
	require.True(t, x.IsParked())
	require.ErrorIs(t, a.Free(q), device.ErrInvalidPointer)

	// Merged back (the free of its neighbour), it leaves the table; the
	// double free of the same address fails with the same error.
	mustFree(t, a, p)
	require.Nil(t, x.Held())
	require.False(t, x.IsParked())
	require.Equal(t, 0, a.def.live.Len())
	require.NoError(t, a.CheckInvariants())
	require.EqualError(t, a.Free(q), held)
}
