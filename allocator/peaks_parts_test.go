package allocator

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/gpumem/gpumem/device"
)

// TestShardPartsRowsAreTheParts: the shards' Row reads every shard's value
// and limit of a row as Value and Limit do one at a time, and SetLimits
// sets what SetLimit sets (the activeImplied it clears included), for the
// rows of the stats and of the phases, on four streams with blocks of
// several phases live.
func TestShardPartsRowsAreTheParts(t *testing.T) {
	a, dev := newTest(t, 0, Config{})
	streams := []device.Stream{device.DefaultStream}
	for range 3 {
		s, err := dev.NewStream()
		require.NoError(t, err)
		streams = append(streams, s)
	}
	rng := rand.New(rand.NewPCG(3, 5))
	var ptrs []device.Ptr
	for i := range 400 {
		if i%100 == 0 {
			a.SetPhase([]string{"fwd", "bwd"}[i/100%2])
		}
		if len(ptrs) > 0 && rng.IntN(3) == 0 {
			j := rng.IntN(len(ptrs))
			mustFree(t, a, ptrs[j])
			ptrs = append(ptrs[:j], ptrs[j+1:]...)
			continue
		}
		ptrs = append(ptrs, mustAlloc(t, a, uint64(512+rng.IntN(3*mib)), streams[rng.IntN(len(streams))]))
	}

	a.lockAll()
	defer a.unlockAll()
	ps := a.parts()
	n := ps.Len()
	require.GreaterOrEqual(t, n, 4)
	vals, lims := make([]int64, n), make([]int64, n)
	for r := range a.peaks.Rows() {
		ps.Row(r, vals, lims)
		for p := range n {
			require.Equal(t, ps.Value(p, r), vals[p], "row %d, part %d: value", r, p)
			require.Equal(t, ps.Limit(p, r), lims[p], "row %d, part %d: limit", r, p)
		}
	}
	// Raise every limit by one and back, through SetLimits, and compare
	// with SetLimit's; each set clears activeImplied.
	shards := *a.byID.Load()
	for r := range a.peaks.Rows() {
		ps.Row(r, vals, lims)
		for p := range n {
			lims[p]++
			shards[p].activeImplied = true
		}
		ps.SetLimits(r, lims)
		for p := range n {
			require.Equal(t, lims[p], ps.Limit(p, r), "row %d, part %d: limit set", r, p)
			if r < numStatRows {
				require.False(t, shards[p].activeImplied, "row %d, part %d", r, p)
			}
			ps.SetLimit(p, r, lims[p]-1)
		}
		for _, sh := range shards {
			sh.refreshImplied()
		}
	}
}
