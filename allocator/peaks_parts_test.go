package allocator

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/internal/simtest"
	"github.com/gpumem/gpumem/stats"
)

// TestShardPartsRowsAreTheParts: the shards' Row reads every shard's value
// and limit of a row as Part does one at a time, and SetLimits
// sets what SetLimit sets (the activeImplied and impliedOff it clears included), as
// SetLimitPair does for two, for the
// rows of the stats and of the phases, on four streams with blocks of
// several phases live.
func TestShardPartsRowsAreTheParts(t *testing.T) {
	a, dev := newTest(t, 0, Config{})
	streams := simtest.Streams(t, dev, 3)
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
			v, lim := ps.Part(p, r)
			require.Equal(t, v, vals[p], "row %d, part %d: value", r, p)
			require.Equal(t, lim, lims[p], "row %d, part %d: limit", r, p)
			if r < numStatRows { // and the shard's own reads of its counts
				sh := (*a.byID.Load())[p]
				require.Equal(t, sh.value(r/numQ, r%numQ), v, "row %d, part %d: shard's value", r, p)
				require.Equal(t, sh.limit(r/numQ, r%numQ), lim, "row %d, part %d: shard's limit", r, p)
			}
		}
	}
	// Raise every limit by one and back, through SetLimits, and compare
	// with SetLimit's; each set clears activeImplied and impliedOff.
	shards := *a.byID.Load()
	for r := range a.peaks.Rows() {
		ps.Row(r, vals, lims)
		for p := range n {
			lims[p]++
			shards[p].activeImplied, shards[p].impliedOff = true, true
		}
		ps.SetLimits(r, lims)
		for p := range n {
			_, lim := ps.Part(p, r)
			require.Equal(t, lims[p], lim, "row %d, part %d: limit set", r, p)
			if r < numStatRows {
				require.False(t, shards[p].activeImplied, "row %d, part %d", r, p)
				require.False(t, shards[p].impliedOff, "row %d, part %d: impliedOff", r, p)
			}
			ps.SetLimit(p, r, lims[p]-1)
		}
		for _, sh := range shards {
			sh.refreshImplied()
		}
	}
	// SetLimitPair: the two limits SetLimit would set, both shards'
	// activeImplied and impliedOff cleared, the others' limits as they were.
	for r := range a.peaks.Rows() {
		ps.Row(r, vals, lims)
		for p := range n {
			q := (p + 1) % n
			for _, sh := range shards {
				sh.activeImplied, sh.impliedOff = true, true
			}
			ps.SetLimitPair(p, q, r, lims[p]+1, lims[q]+2)
			for o := range n {
				want := lims[o]
				switch o {
				case p:
					want++
				case q:
					want += 2
				}
				_, lim := ps.Part(o, r)
				require.Equal(t, want, lim, "row %d, pair %d %d, part %d: limit", r, p, q, o)
				if r < numStatRows {
					require.Equal(t, o != p && o != q, shards[o].activeImplied, "row %d, pair %d %d, part %d", r, p, q, o)
					require.Equal(t, o != p && o != q, shards[o].impliedOff, "row %d, pair %d %d, part %d: impliedOff", r, p, q, o)
				}
			}
			ps.SetLimits(r, lims)
		}
		for _, sh := range shards {
			sh.refreshImplied()
		}
	}
	// Tighten: every limit its value, the total their sum, activeImplied
	// and impliedOff cleared; then the limits as they were.
	for r := range a.peaks.Rows() {
		ps.Row(r, vals, lims)
		var want int64
		for p := range n {
			want += vals[p]
			shards[p].activeImplied, shards[p].impliedOff = true, true
		}
		require.Equal(t, want, ps.Tighten(r), "row %d: total", r)
		for p := range n {
			v, lim := ps.Part(p, r)
			require.Equal(t, vals[p], v, "row %d, part %d: value", r, p)
			require.Equal(t, v, lim, "row %d, part %d: limit tightened", r, p)
			if r < numStatRows {
				require.False(t, shards[p].activeImplied, "row %d, part %d", r, p)
				require.False(t, shards[p].impliedOff, "row %d, part %d: impliedOff", r, p)
			}
		}
		ps.SetLimits(r, lims)
		for _, sh := range shards {
			sh.refreshImplied()
		}
	}
}

// impliedByRows is impliedNow written row by row: every pool and the all
// column of both derived rows, through value and limit.
func impliedByRows(sh *shard) bool {
	for _, row := range [2]int{int(stats.Active), int(stats.ActiveBytes)} {
		base := derivedFrom[row] - 1
		for k := range numQ {
			if k < qAll && sh.st[row].pool[k].Value() != 0 || sh.limit(row, k) < sh.limit(base, k) {
				return false
			}
		}
	}
	return true
}

// TestImpliedNowByRows: impliedNow answers as the row-by-row reference on
// random pending counts and limits of the active and allocation rows.
func TestImpliedNowByRows(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 9))
	var seen [2]int
	for range 20000 {
		// Pending counts are mostly zero; limits close together.
		var sh shard
		randomActiveRows(&sh, func() int64 {
			if rng.IntN(8) == 0 {
				return int64(rng.IntN(3))
			}
			return 0
		}, func() int64 { return int64(rng.IntN(4)) }, func() int64 { return int64(rng.IntN(6)) })
		got := sh.impliedNow()
		require.Equal(t, impliedByRows(&sh), got)
		seen[btoi(got)]++
	}
	require.Positive(t, seen[0])
	require.Positive(t, seen[1])
}

// randomActiveRows gives the active and allocation rows of sh counts and
// limits drawn from value, limit (each pool) and allLim.
func randomActiveRows(sh *shard, value, limit, allLim func() int64) {
	for _, row := range []stats.Metric{stats.Active, stats.ActiveBytes, stats.Allocation, stats.AllocatedBytes} {
		s := &sh.st[row]
		for k := range s.pool {
			s.pool[k].Carry(value())
			s.pool[k].SetLimit(limit())
		}
		s.allLim = allLim()
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// activeOverByRows is activeOver written through value and limit: active
// and active bytes in pool k and in all.
func activeOverByRows(sh *shard, k int) bool {
	for _, row := range [2]int{int(stats.Active), int(stats.ActiveBytes)} {
		if sh.value(row, k) > sh.limit(row, k) || sh.value(row, qAll) > sh.limit(row, qAll) {
			return true
		}
	}
	return false
}

// TestActiveOverByRows: activeOver answers as the reference through value
// and limit, in both pools, on random counts and limits of the active and
// allocation rows.
func TestActiveOverByRows(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 10))
	var seen [2]int
	for range 20000 {
		var sh shard
		randomActiveRows(&sh, func() int64 { return int64(rng.IntN(3)) },
			func() int64 { return int64(rng.IntN(6)) }, func() int64 { return int64(rng.IntN(10)) })
		for k := range 2 {
			got := sh.activeOver(k)
			require.Equal(t, activeOverByRows(&sh, k), got, "pool %d", k)
			seen[btoi(got)]++
		}
	}
	require.Positive(t, seen[0])
	require.Positive(t, seen[1])
}
