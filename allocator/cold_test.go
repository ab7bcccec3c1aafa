package allocator

import (
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpumem/gpumem/allocator/internal/freeindex"
	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/device/sim"
	"github.com/gpumem/gpumem/internal/simtest"
)

// TestColdShard: the streams past maxShards share the cold shard, whose
// operations take the world; blocks of its streams still serve only
// their own stream, Free finds them by address, and releasing the cache
// returns their segments.
func TestColdShard(t *testing.T) {
	a, dev := newOn(t, Config{})
	streams := simtest.Streams(t, dev, maxShards+7)
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
	for _, p := range [2]*freeindex.Pool{a.small, a.large} {
		assert.Zero(t, p.NumOwners())
	}
	require.NoError(t, a.CheckInvariants())
}

// threeShards is the set-up of the world tests: an allocator with the
// default stream and two more, each with a shard (a block cached on s1, p
// allocated on s2).
func threeShards(t *testing.T) (a *Allocator, dev *sim.Device, s1, s2 device.Stream, p device.Ptr) {
	t.Helper()
	a, dev = newTest(t, 0, Config{})
	s1, _ = dev.NewStream()
	s2, _ = dev.NewStream()
	mustFree(t, a, mustAlloc(t, a, 4096, s1))
	return a, dev, s1, s2, mustAlloc(t, a, 4096, s2)
}

// TestWorldLocksFastShardsOnly: the world takes the lock of the shards
// that can run alone, none while an event is pending.
func TestWorldLocksFastShardsOnly(t *testing.T) {
	a, dev, s1, _, p := threeShards(t)
	a.lockAll()
	assert.Equal(t, 3, lockedShards(a))
	a.unlockAll()
	assert.Zero(t, lockedShards(a))
	require.NoError(t, a.RecordStream(p, s1))
	require.NoError(t, dev.SetStreamBusy(s1, true)) // its work does not finish: the free waits for its event
	mustFree(t, a, p)
	a.lockAll()
	assert.Zero(t, lockedShards(a))
	a.unlockAll()
	for _, sh := range a.shards {
		assert.False(t, sh.fast.Load())
	}
	require.NoError(t, a.CheckInvariants())
}

// TestWorldSkipsShardsWhileNoneIsFast: while a stream event is pending
// no shard is fast, and the world knows it (anyFast false): it takes no
// shard's lock and makes none fast. Once the event completes and has
// settled, the world makes the shards fast again (anyFast true), and the
// next world takes their locks.
func TestWorldSkipsShardsWhileNoneIsFast(t *testing.T) {
	a, dev, s1, s2, p := threeShards(t)
	require.True(t, a.anyFast)
	require.NoError(t, a.RecordStream(p, s1))
	require.NoError(t, dev.SetStreamBusy(s1, true))
	mustFree(t, a, p) // waits for s1's event
	assert.False(t, a.anyFast)
	q := mustAlloc(t, a, 4096, s2) // in the world, which leaves every shard slow
	assert.False(t, a.anyFast)
	for _, sh := range a.shards {
		assert.False(t, sh.fast.Load())
	}
	require.NoError(t, a.CheckInvariants())
	require.NoError(t, dev.SetStreamBusy(s1, false))
	mustFree(t, a, q)
	mustFree(t, a, mustAlloc(t, a, 4096, s2)) // the world sees the event done
	// and once it has settled (TestShardsRunAloneOnceEventsSettle):
	for range settleExits {
		a.lockAll()
		a.unlockAll()
	}
	assert.True(t, a.anyFast) // the shards may run alone again
	for _, sh := range a.shards {
		assert.True(t, sh.fast.Load())
	}
	a.lockAll()
	assert.Equal(t, 3, lockedShards(a))
	a.unlockAll()
	assert.Zero(t, lockedShards(a))
	require.NoError(t, a.CheckInvariants())
}

// lockedShards returns how many of a's shards' locks are held.
func lockedShards(a *Allocator) int {
	n := 0
	for _, sh := range a.shards {
		if sh.mu.TryLock() {
			sh.mu.Unlock()
		} else {
			n++
		}
	}
	return n
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
	require.True(t, a.def.free[qLarge].Pending())
	mustFree(t, a, mustAlloc(t, a, 2*mib, s1)) // another stream's search moves the clock
	mustFree(t, a, p)                          // unsplit
	b := a.def.free[qLarge].Fit(30 * mib)
	require.NotNil(t, b)
	assert.Equal(t, a.large.GCCalls, b.GCCountBase())
	require.NoError(t, a.CheckInvariants())
}

// TestOutOfMemoryCostsNoVisitPerStream: with a stream per allocation, an
// out-of-memory failure (which releases the cache and reports the largest
// free block) visits the shards of their own and what the cold view
// holds, not every stream that holds memory: each of the last failures
// here visited every one of 3,000 streams before.
func TestOutOfMemoryCostsNoVisitPerStream(t *testing.T) {
	n := 3_000
	if selfCheck {
		n = 300 // the self-check after every operation walks every block
	}
	a, dev := newOn(t, Config{}, simtest.Capacity(uint64(n)*2*mib))
	for range n { // a 2 MiB segment per stream, half of it free: the device is full
		s, err := dev.NewStream()
		require.NoError(t, err)
		allocUnchecked(t, a, mib, s)
	}
	s, err := dev.NewStream()
	require.NoError(t, err)
	for range 10 {
		a.visited = 0
		_, err = a.Alloc(mib, s)
		require.ErrorIs(t, err, device.ErrOutOfMemory)
		assert.LessOrEqual(t, a.visited, 4*maxShards, "indexes visited by one failure")
	}
	var oom *OutOfMemoryError
	require.ErrorAs(t, err, &oom)
	assert.EqualValues(t, mib, oom.LargestFreeBlock, "the largest free block is found among the cold streams")
	assert.EqualValues(t, mib, a.LargestFreeBlock())
	require.NoError(t, a.CheckInvariants())
}

// TestPolicyLendingCostsNoVisitPerStream: under the policy, a request
// that its stream cannot serve looks for a lender among the shards of
// their own and, from its size up, the cold view, not on every stream
// with memory (every lend walked every stream before, and asked of each
// whether RecordStream had named it, a walk of those streams).
func TestPolicyLendingCostsNoVisitPerStream(t *testing.T) {
	n := 2_000
	if selfCheck {
		n = 200
	}
	a, dev := newOn(t, lowFrag)
	var streams []device.Stream
	var ptrs []device.Ptr
	for range n { // every stream caches a 4 MiB block
		s, err := dev.NewStream()
		require.NoError(t, err)
		streams = append(streams, s)
		ptrs = append(ptrs, allocUnchecked(t, a, 4*mib, s))
	}
	for _, p := range ptrs {
		require.NoError(t, a.Free(p))
	}
	for i, s := range streams[n/2:] { // the first half, at the lowest addresses, are named by RecordStream
		p := allocUnchecked(t, a, 3*mib, s)
		require.NoError(t, a.RecordStream(p, streams[i]))
		require.NoError(t, a.Free(p))
	}
	require.NoError(t, dev.Synchronize())
	require.Zero(t, a.pol.lent)
	for range 20 {
		s, err := dev.NewStream()
		require.NoError(t, err)
		a.visited = 0
		p := allocUnchecked(t, a, 2*mib, s) // its own cache is empty: a lend
		assert.LessOrEqual(t, a.visited, 4*maxShards, "indexes and blocks visited by one lend")
		require.NoError(t, a.Free(p))
	}
	assert.EqualValues(t, 20, a.pol.lent, "every request was lent a block")
	require.NoError(t, a.CheckInvariants())
}

// allocUnchecked is mustAlloc without the check of every block after it,
// for the set-ups of thousands of streams.
func allocUnchecked(t testing.TB, a *Allocator, size uint64, s device.Stream) device.Ptr {
	t.Helper()
	p, err := a.Alloc(size, s)
	require.NoError(t, err)
	return p
}

// TestWorldLetsGoOfAShardThatLeftFast: lockAll finds a shard fast and
// waits for its lock, held by a fast path that then leaves fast (as one
// that leaves a cut does) and unlocks. The world must let that lock go
// again: unlockAll unlocks only the shards that are fast, and a lock
// kept would stop the shard's next operation for ever.
func TestWorldLetsGoOfAShardThatLeftFast(t *testing.T) {
	a, _, _, _, _ := threeShards(t)
	sh := a.def
	require.Equal(t, true, sh.fast.Load())
	sh.mu.Lock() // the fast path
	done := make(chan struct{})
	go func() {
		a.lockAll()
		a.unlockAll()
		close(done)
	}()
	for a.mu.TryLock() { // until the world has begun
		a.mu.Unlock()
		runtime.Gosched()
	}
	time.Sleep(20 * time.Millisecond) // and waits for sh's lock
	sh.fast.Store(false)
	sh.mu.Unlock()
	<-done
	if !sh.mu.TryLock() {
		sh.mu.Unlock() // for the checks that end the test
		t.Fatal("the world kept the lock of a shard no longer fast")
	}
	sh.mu.Unlock()
	mustFree(t, a, mustAlloc(t, a, 4096, 0)) // the world makes it fast again
	assert.Equal(t, true, sh.fast.Load())
}
