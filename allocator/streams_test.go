package allocator

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/device/sim"
)

// withBusyStream returns a new allocator, its device and a side stream
// whose work stays pending until the test completes it.
func withBusyStream(t *testing.T) (*Allocator, *sim.Device, device.Stream) {
	t.Helper()
	a, dev := newTest(t, 0, Config{})
	side, err := dev.NewStream()
	require.NoError(t, err)
	require.NoError(t, dev.SetStreamBusy(side, true))
	return a, dev, side
}

// recordedOn allocates size bytes on the default stream and records
// their use on stream s.
func recordedOn(t *testing.T, a *Allocator, size uint64, s device.Stream) device.Ptr {
	t.Helper()
	p := mustAlloc(t, a, size, 0)
	require.NoError(t, a.RecordStream(p, s))
	return p
}

func TestRecordStreamDefersReuseUntilWorkCompletes(t *testing.T) {
	a, dev, side := withBusyStream(t)

	p := recordedOn(t, a, 3*mib, side)
	require.NoError(t, a.RecordStream(p, 0), "recording the block's own stream is a no-op")
	mustFree(t, a, p)
	assert.EqualValues(t, 0, get(t, a, "allocation.all.current"), "allocation falls at the free request")
	assert.EqualValues(t, 1, get(t, a, "active.all.current"), "active stays until the free completes")
	assert.EqualValues(t, 3*mib, get(t, a, "active_bytes.all.current"))
	assert.EqualValues(t, 3*mib, get(t, a, "requested_bytes.all.current"))
	segs := a.Snapshot()
	require.Len(t, segs, 1)
	assert.Equal(t, BlockPendingFree, segs[0].Blocks[0].State)
	assert.Equal(t, "active_pending_free", segs[0].Blocks[0].State.String())

	q := mustAlloc(t, a, 3*mib, 0)
	assert.NotEqual(t, p, q, "the pending block is not reused while the side stream is busy")
	assert.EqualValues(t, 1, get(t, a, "active.all.current")-1)

	require.ErrorIs(t, a.Free(p), device.ErrInvalidPointer, "freeing a pending block again is a double free")

	require.NoError(t, dev.CompleteStream(side))
	r := mustAlloc(t, a, 3*mib, 0) // processes the completed event first
	assert.Equal(t, p, r, "after the side stream's work completes, the block is reused")
	assert.EqualValues(t, 2, get(t, a, "active.all.current"))
	mustFree(t, a, q)
	mustFree(t, a, r)
}

func TestPendingFreesAreProcessedOnNextAlloc(t *testing.T) {
	a, dev, side := withBusyStream(t)
	var ps []device.Ptr
	for range 4 {
		p := recordedOn(t, a, 100*kib, side)
		ps = append(ps, p)
	}
	for _, p := range ps {
		mustFree(t, a, p)
	}
	assert.EqualValues(t, 4, get(t, a, "active.small_pool.current"))
	require.NoError(t, dev.CompleteStream(side))
	assert.EqualValues(t, 4, get(t, a, "active.small_pool.current"), "nothing happens in the background")
	mustAlloc(t, a, 512, 0)
	assert.EqualValues(t, 1, get(t, a, "active.small_pool.current"), "the next Alloc completed the four frees")
	segs := a.Snapshot()
	require.Len(t, segs, 1)
	assert.Len(t, segs[0].Blocks, 2, "the completed frees merged")
}

func TestEmptyCacheSynchronizesPendingEvents(t *testing.T) {
	a, dev, side := withBusyStream(t)
	p := recordedOn(t, a, 30*mib, side)
	mustFree(t, a, p)
	require.NoError(t, a.EmptyCache())
	require.NoError(t, a.CheckInvariants())
	assert.EqualValues(t, 0, dev.BytesInUse(), "EmptyCache waited for the event and released the segment")
	assert.EqualValues(t, 1, get(t, a, "num_sync_all_streams"))
	assert.EqualValues(t, 0, get(t, a, "active.all.current"))
}

func TestStreamsDoNotShareCachedBlocks(t *testing.T) {
	a, dev := newTest(t, 0, Config{})
	s1, _ := dev.NewStream()
	s2, _ := dev.NewStream()
	p := mustAlloc(t, a, 4*mib, s1)
	mustFree(t, a, p)
	q := mustAlloc(t, a, 4*mib, s2)
	assert.NotEqual(t, p, q, "memory freed on stream A is not handed out on stream B")
	assert.EqualValues(t, 2, dev.Counters().Mallocs)
	r := mustAlloc(t, a, 4*mib, s1)
	assert.Equal(t, p, r, "it is handed out again on stream A")
	small1 := mustAlloc(t, a, 512, s1)
	small2 := mustAlloc(t, a, 512, s2)
	segs := a.Snapshot()
	for _, s := range segs {
		for _, b := range s.Blocks {
			if b.Ptr == small1 {
				assert.Equal(t, s1, s.Stream)
			}
			if b.Ptr == small2 {
				assert.Equal(t, s2, s.Stream)
			}
		}
	}
}

func TestRecordEventFailureFallsBackToSynchronize(t *testing.T) {
	a, _, side := withBusyStream(t)
	p := recordedOn(t, a, 3*mib, side)
	// An unknown stream cannot be recorded: make the device refuse by
	// recording a stream the device does not know.
	a.mu.Lock()
	u := &a.useRecs[a.def.live.Get(p).Uses-1]
	u.streams = append(u.streams, 77)
	a.mu.Unlock()
	err := a.Free(p)
	require.Error(t, err, "neither an event nor a synchronization is possible on stream 77")
	assert.ErrorIs(t, err, device.ErrInvalidStream)
	assert.EqualValues(t, 1, get(t, a, "allocation.all.current"), "the failed free changed nothing")
	a.mu.Lock()
	u.streams = u.streams[:1]
	a.mu.Unlock()
	mustFree(t, a, p)
}

func TestEventQueryFailureKeepsBlockPending(t *testing.T) {
	a, dev, side := withBusyStream(t)
	p := recordedOn(t, a, 3*mib, side)
	mustFree(t, a, p)
	require.NoError(t, dev.CompleteStream(side))
	dev.FailEventQueries(errors.New("injected"))
	q := mustAlloc(t, a, 3*mib, 0)
	assert.NotEqual(t, p, q, "an event that cannot be queried is treated as not done")
	assert.Error(t, a.EmptyCache(), "EmptyCache reports the failed wait")
	require.NoError(t, a.CheckInvariants())
	dev.FailEventQueries(nil)
	require.NoError(t, a.EmptyCache())
	mustFree(t, a, q)
}

// TestRecordStreamOfZeroPtr: the zero Ptr (a 0-byte allocation) can be
// recorded on a stream, as PyTorch allows recordStream on an empty tensor.
func TestRecordStreamOfZeroPtr(t *testing.T) {
	a, dev := newTest(t, 0, Config{})
	s, _ := dev.NewStream()
	p, err := a.Alloc(0, 0)
	require.NoError(t, err)
	require.NoError(t, a.RecordStream(p, s))
	require.NoError(t, a.Free(p))
}

// TestPollingCostsWhatRan: with frees pending on a thousand busy streams,
// an Alloc asks the device about the events of the streams that ran work
// since the last one, not of every stream with pending events (each Alloc
// made a thousand queries before), and completes the same frees.
func TestPollingCostsWhatRan(t *testing.T) {
	n := 1000
	if selfCheck {
		n = 100
	}
	a, dev := newTest(t, 0, Config{})
	var streams []device.Stream
	for range n {
		s, err := dev.NewStream()
		require.NoError(t, err)
		require.NoError(t, dev.SetStreamBusy(s, true))
		streams = append(streams, s)
	}
	keep := mustAlloc(t, a, 4096, 0)
	for _, s := range streams { // a free pending on each stream
		p, err := a.Alloc(4096, 0)
		require.NoError(t, err)
		require.NoError(t, a.RecordStream(p, s))
		require.NoError(t, a.Free(p))
	}
	queries := func() int64 { return dev.Counters().EventQueries }
	pending := func() int64 { return get(t, a, "active.all.current") - get(t, a, "allocation.all.current") }
	require.EqualValues(t, n, pending())
	p, err := a.Alloc(4096, 0) // the first poll asks every stream
	require.NoError(t, err)
	require.NoError(t, a.Free(p))
	for range 100 {
		q0 := queries()
		p, err := a.Alloc(4096, 0)
		require.NoError(t, err)
		assert.Zero(t, queries()-q0, "no stream ran: no query")
		require.NoError(t, a.Free(p))
	}
	require.EqualValues(t, n, pending())
	require.NoError(t, dev.CompleteStream(streams[n/2]))
	q0 := queries()
	p, err = a.Alloc(4096, 0)
	require.NoError(t, err)
	assert.EqualValues(t, 1, queries()-q0, "one stream ran: one query")
	assert.EqualValues(t, n-1, pending(), "its free completed")
	require.NoError(t, a.Free(p))
	require.NoError(t, dev.Synchronize())
	q0 = queries()
	p, err = a.Alloc(4096, 0)
	require.NoError(t, err)
	assert.EqualValues(t, n-1, queries()-q0, "every other stream ran")
	assert.Zero(t, pending())
	require.NoError(t, a.Free(p))
	require.NoError(t, a.Free(keep))
}

// TestRecordAndDeferredFreeAllocateNothing checks that recording streams
// on blocks and deferring their frees allocate nothing once warm: the
// records of recorded streams are reused from the allocator's free list,
// with their arrays, and no map is kept by block.
func TestRecordAndDeferredFreeAllocateNothing(t *testing.T) {
	if selfCheck {
		t.Skip("the self-checks of the gpumem_invariants tag allocate")
	}
	a, dev := newOn(t, Config{})
	var side [3]device.Stream
	for i := range side {
		s, err := dev.NewStream()
		require.NoError(t, err)
		side[i] = s
	}
	var ps [4]device.Ptr
	cycle := func() {
		for i := range ps {
			p, err := a.Alloc(uint64(i+1)*mib, 0)
			if err != nil {
				t.Fatal(err)
			}
			ps[i] = p
			// Up to every side stream, one twice, and the block's own.
			for j := 0; j <= i && j < len(side); j++ {
				if err := a.RecordStream(p, side[j]); err != nil {
					t.Fatal(err)
				}
			}
			if err := a.RecordStream(p, side[0]); err != nil {
				t.Fatal(err)
			}
			if err := a.RecordStream(p, 0); err != nil {
				t.Fatal(err)
			}
		}
		for _, p := range ps {
			if err := a.Free(p); err != nil {
				t.Fatal(err)
			}
		}
	}
	cycle() // warm: the records, the events' queues, the cache
	cycle()
	allocs := testing.AllocsPerRun(100, cycle)
	require.Zero(t, allocs, "recording streams and deferring frees allocate nothing once warm")
	require.NoError(t, a.CheckInvariants())
	a.mu.Lock()
	require.Len(t, a.useRecs, len(ps), "one record for each recorded block live at once, reused")
	a.mu.Unlock()
}

// TestKnownStreamTableKeepsUnknownStreamsOut checks that the table of
// streams found known lately answers for the very stream it holds: a
// stream the device does not know, whose slot holds a known stream, is
// still refused, and the known stream still recorded.
func TestKnownStreamTableKeepsUnknownStreamsOut(t *testing.T) {
	a, dev := newOn(t, Config{})
	side, err := dev.NewStream()
	require.NoError(t, err)
	p := mustAlloc(t, a, mib, 0)
	require.NoError(t, a.RecordStream(p, side))
	var unknown device.Stream
	for u := side + 1; ; u++ {
		if knownSlot(u) == knownSlot(side) && !dev.HasStream(u) {
			unknown = u
			break
		}
	}
	err = a.RecordStream(p, unknown)
	require.ErrorIs(t, err, device.ErrInvalidStream, "stream %d shares a slot with the known %d", unknown, side)
	require.NoError(t, a.RecordStream(p, side))
	a.mu.Lock()
	require.Equal(t, []device.Stream{side}, a.usesOf(a.def.live.Get(p)), "the refused stream is not recorded")
	a.mu.Unlock()
	mustFree(t, a, p)
	require.NoError(t, a.CheckInvariants())
}
