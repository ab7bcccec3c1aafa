package allocator

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/internal/simtest"
	"github.com/gpumem/gpumem/stats"
)

// TestSerialPassTakesBothPools: while a stream event is pending, every
// operation takes the world (peaks.Table.Serial). A stream whose small
// block passes its limit of blocks there takes that row's room for both
// pools and all from the row's risers, and becomes their riser
// (serialExceeded), so that its next block, from the large pool, passes
// no limit: the shard's limits stay. The peaks stay exact.
func TestSerialPassTakesBothPools(t *testing.T) {
	a, dev := newTest(t, 0, Config{})
	ss := simtest.Streams(t, dev, 3)
	s1, s2, s3 := ss[0], ss[1], ss[2]
	const small, large = 4096, 4 << 20
	// Stream s1 (the default stream) sets the peaks above what the others will hold, in both
	// pools; s3 and then s2 allocate a block of each pool, each segment
	// cached once freed, so that s2 is the riser of the rows.
	for _, c := range []struct {
		s device.Stream
		n int
	}{{s1, 4}, {s2, 1}, {s3, 1}} {
		var ps []device.Ptr
		for range c.n {
			ps = append(ps, mustAlloc(t, a, small, c.s), mustAlloc(t, a, large, c.s))
		}
		for _, p := range ps {
			mustFree(t, a, p)
		}
	}
	// A block of s1 used on s2, busy, and freed: its free waits for an
	// event.
	require.NoError(t, dev.SetStreamBusy(s2, true))
	p := mustAlloc(t, a, small, s1)
	require.NoError(t, a.RecordStream(p, s2))
	mustFree(t, a, p)
	require.NotZero(t, a.events.Len(), "an event pending")
	sh := a.lookupShard(s3)
	require.NotNil(t, sh)
	// The rows of blocks: s2 is the riser of both pools' columns, and
	// holds room in the large pool's.
	row := int(stats.Allocation)
	rs := a.peaks.Risers()
	o := a.lookupShard(s2)
	require.NotNil(t, o)
	require.Equal(t, []int32{int32(o.id), int32(o.id)}, rs[statRow(row, qSmall):statRow(row, qLarge)+1])
	room := o.limit(row, qLarge) - o.value(row, qLarge)
	require.Positive(t, room)
	lim := sh.limit(row, qLarge)
	// s3's small blocks, until one passes its limit of blocks: it takes
	// the large pool's room of blocks with the small pool's.
	for i := 0; rs[statRow(row, qSmall)] != int32(sh.id); i++ {
		require.Less(t, i, 8, "no pass")
		mustAlloc(t, a, small, s3)
	}
	a.lockAll()
	assert.Equal(t, []int32{int32(sh.id), int32(sh.id)}, rs[statRow(row, qSmall):statRow(row, qLarge)+1], "the risers of the pools' blocks")
	assert.Equal(t, lim+room, sh.limit(row, qLarge), "the large pool's room of blocks")
	assert.Equal(t, o.value(row, qLarge), o.limit(row, qLarge))
	a.unlockAll()
	mustAlloc(t, a, large, s3)
	assert.EqualValues(t, 8, get(t, a, "allocation.all.peak"))
	require.NoError(t, a.CheckInvariants())
}
