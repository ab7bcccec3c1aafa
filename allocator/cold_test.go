package allocator

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpumem/gpumem/device"
)

// TestColdShard: the streams past maxShards share the cold shard, whose
// operations take the world; blocks of its streams still serve only
// their own stream, Free finds them by address, and releasing the cache
// returns their segments.
func TestColdShard(t *testing.T) {
	a, dev := newOn(t, Config{})
	streams := []device.Stream{device.DefaultStream}
	for len(streams) < maxShards+8 {
		s, err := dev.NewStream()
		require.NoError(t, err)
		streams = append(streams, s)
	}
	var ptrs []device.Ptr
	for i, s := range streams {
		ptrs = append(ptrs, mustAlloc(t, a, uint64(i+1)*4096, s), mustAlloc(t, a, 3*mib, s))
	}
	require.Len(t, a.shards, maxShards+1)
	require.NotNil(t, a.cold)
	assert.Len(t, a.coldIdx, 8)
	assert.True(t, a.shards[len(a.shards)-1].cold)
	for _, sh := range a.shards {
		assert.Equal(t, !sh.cold, sh.fast.Load(), "stream %d", sh.stream)
	}
	// Each stream's free blocks serve it alone: freeing and allocating the
	// same sizes again gives the same addresses.
	for _, p := range ptrs {
		mustFree(t, a, p)
	}
	for i, s := range streams {
		p := mustAlloc(t, a, uint64(i+1)*4096, s)
		assert.Equal(t, ptrs[2*i], p, "stream %d", s)
		mustFree(t, a, p)
	}
	require.NoError(t, a.CheckInvariants())
	require.NoError(t, a.EmptyCache())
	assert.Zero(t, get(t, a, "reserved_bytes.all.current"))
	for _, p := range [2]*pool{a.small, a.large} {
		assert.Empty(t, p.owners)
	}
	require.NoError(t, a.CheckInvariants())
}

// TestWorldLocksFastShardsOnly: the world takes the lock of the shards
// that can run alone, none while an event is pending.
func TestWorldLocksFastShardsOnly(t *testing.T) {
	a, dev := newTest(t, 0, Config{})
	s1, _ := dev.NewStream()
	s2, _ := dev.NewStream()
	mustFree(t, a, mustAlloc(t, a, 4096, s1))
	p := mustAlloc(t, a, 4096, s2)
	a.lockAll()
	assert.Len(t, a.held, 3)
	a.unlockAll()
	require.NoError(t, a.RecordStream(p, s1))
	require.NoError(t, dev.SetStreamBusy(s1, true)) // its work does not finish: the free waits for its event
	mustFree(t, a, p)
	a.lockAll()
	assert.Empty(t, a.held)
	a.unlockAll()
	for _, sh := range a.shards {
		assert.False(t, sh.fast.Load())
	}
	require.NoError(t, a.CheckInvariants())
}

// TestUnsplitStampsTheAge: the free of a block just split off merges it
// back into the rest's key without touching the index (an unsplit); the
// merged block is filed anew as far as ages go, as a merge would file it,
// even when searches of other streams moved the pool's clock meanwhile.
func TestUnsplitStampsTheAge(t *testing.T) {
	a, dev := newTest(t, 0, Config{GarbageCollectionThreshold: 0.9, MemoryFraction: 0.5})
	s1, _ := dev.NewStream()
	mustFree(t, a, mustAlloc(t, a, 30*mib, device.DefaultStream))
	mustFree(t, a, mustAlloc(t, a, 30*mib, s1))
	p := mustAlloc(t, a, 2*mib, device.DefaultStream) // split: the rest's move waits
	require.NotNil(t, a.def.free[qLarge].pend)
	mustFree(t, a, mustAlloc(t, a, 2*mib, s1)) // another stream's search moves the clock
	mustFree(t, a, p)                          // unsplit
	b := a.def.free[qLarge].fit(30 * mib)
	require.NotNil(t, b)
	assert.Equal(t, a.large.gcCalls, b.gcCountBase)
	require.NoError(t, a.CheckInvariants())
}
