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

// TestHostWaitedPastTheFew: the streams RecordStream names are found
// through the short list while they are few, and through the map past
// it; a stream never named is found in neither.
func TestHostWaitedPastTheFew(t *testing.T) {
	a, dev := newOn(t, Config{Policy: PolicyLowFragmentation})
	var named []device.Stream
	for i := range maxHostWaitedFew + 3 {
		s, err := dev.NewStream()
		require.NoError(t, err)
		other, err := dev.NewStream()
		require.NoError(t, err)
		p := mustAlloc(t, a, mib, device.DefaultStream)
		require.NoError(t, a.RecordStream(p, s))
		named = append(named, s)
		mustFree(t, a, p)
		a.lockAll()
		for _, n := range named {
			assert.True(t, a.pol.hostWaitedLocked(n), "after %d streams: stream %d", i+1, n)
		}
		assert.False(t, a.pol.hostWaitedLocked(other), "after %d streams: a stream never named", i+1)
		assert.Equal(t, min(len(named), maxHostWaitedFew), len(a.pol.hostWaitedFew))
		a.unlockAll()
	}
	require.NoError(t, a.CheckInvariants())
}
