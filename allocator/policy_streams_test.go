package allocator

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/gpumem/gpumem/device"
)

// TestLendWaitsMatchMap drives the table of lendLocked's waits with
// random keys, streams small and large (a CUDA stream is a handle), past
// several growths, against a Go map.
func TestLendWaitsMatchMap(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		var w lendWaits
		want := map[lendKey]int64{}
		stream := rapid.OneOf(rapid.Uint64Range(0, 12), rapid.Uint64())
		for range rapid.IntRange(0, 300).Draw(t, "ops") {
			k := lendKey{
				borrower: device.Stream(stream.Draw(t, "borrower")),
				lender:   device.Stream(stream.Draw(t, "lender")),
				small:    rapid.Bool().Draw(t, "small"),
			}
			e := w.slot(k)
			at, ok := want[k]
			if e.waited != ok || ok && e.at != at {
				t.Fatalf("%+v: waited %v at %d, want %v at %d", k, e.waited, e.at, ok, at)
			}
			if rapid.Bool().Draw(t, "wait") {
				at = rapid.Int64Range(0, 1<<40).Draw(t, "at")
				e.waited, e.at = true, at
				want[k] = at
			}
		}
		if 2*w.n > len(w.slots) {
			t.Fatalf("%d entries in %d slots: more than half full", w.n, len(w.slots))
		}
		for k, at := range want {
			if e := w.slot(k); !e.waited || e.at != at {
				t.Fatalf("%+v: waited %v at %d, want at %d", k, e.waited, e.at, at)
			}
		}
	})
}

// TestShardsKnowTheirStreamWasRecorded: a shard whose stream
// RecordStream names learns it then (noteRecordedLocked), a shard made
// for a stream named before learns it as it is made (newShard), and a
// shard of a stream never named does not; the invariant checker holds
// every shard's flag to the policy's set.
func TestShardsKnowTheirStreamWasRecorded(t *testing.T) {
	a, dev := newOn(t, Config{Policy: PolicyLowFragmentation})
	before, err := dev.NewStream() // a shard first, named after
	require.NoError(t, err)
	after, err := dev.NewStream() // named first, a shard after
	require.NoError(t, err)
	never, err := dev.NewStream()
	require.NoError(t, err)
	mustFree(t, a, mustAlloc(t, a, mib, before))
	mustFree(t, a, mustAlloc(t, a, mib, never))
	for _, s := range []device.Stream{before, after} {
		p := mustAlloc(t, a, mib, device.DefaultStream)
		require.NoError(t, a.RecordStream(p, s))
		mustFree(t, a, p)
	}
	mustFree(t, a, mustAlloc(t, a, mib, after))
	require.NoError(t, a.CheckInvariants())
	for s, want := range map[device.Stream]bool{before: true, after: true, never: false, device.DefaultStream: false} {
		sh := a.lookupShard(s)
		require.NotNil(t, sh, "stream %d has a shard", s)
		assert.Equal(t, want, sh.hostWaited, "stream %d", s)
		assert.Equal(t, want, a.pol.hostWaitedLocked(s), "stream %d", s)
	}
}
