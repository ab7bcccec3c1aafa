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
