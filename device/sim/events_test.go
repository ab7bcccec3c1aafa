package sim

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpumem/gpumem/device"
)

// checkTable checks the eventTable's invariants against want, the live
// events by id.
func checkTable(t *testing.T, tb *eventTable, want map[device.Event]eventState) {
	t.Helper()
	require.Equal(t, len(want), tb.len())
	if tb.last == 0 {
		require.Empty(t, want)
		return
	}
	if tb.base <= tb.last {
		require.Less(t, uint64(tb.last-tb.base), uint64(len(tb.ring)))
		require.True(t, tb.ring[int(tb.base)&(len(tb.ring)-1)].live, "base %d is live", tb.base)
	}
	inWindow := make([]bool, len(tb.ring))
	for e := tb.base; e <= tb.last; e++ {
		inWindow[int(e)&(len(tb.ring)-1)] = true
	}
	for i, sl := range tb.ring {
		if !inWindow[i] {
			require.Equal(t, eventSlot{}, sl, "slot %d is outside the window", i)
		}
	}
	for e := range tb.old {
		require.Less(t, e, tb.base)
	}
	for e := device.Event(0); e <= tb.last+2; e++ {
		ev, ok := tb.get(e)
		w, live := want[e]
		require.Equal(t, live, ok, "event %d", e)
		if live {
			require.Equal(t, w, ev, "event %d", e)
		}
	}
}

func TestEventTableMatchesAMap(t *testing.T) {
	for _, limit := range []int{64, 128, 0} {
		rng := rand.New(rand.NewPCG(1, uint64(limit)))
		tb := &eventTable{limit: limit}
		want := map[device.Event]eventState{}
		var held []device.Event // released late, or never
		var recent []device.Event
		for i := range 3000 {
			switch r := rng.IntN(10); {
			case r < 5:
				ev := eventState{stream: rng.IntN(5), seq: uint64(i)}
				e := tb.add(ev)
				require.Equal(t, tb.last, e)
				require.NotContains(t, want, e, "ids are never reused")
				want[e] = ev
				if rng.IntN(20) == 0 {
					held = append(held, e)
				} else {
					recent = append(recent, e)
				}
			case r < 9 && len(recent) > 0:
				j := 0
				if rng.IntN(4) == 0 {
					j = rng.IntN(len(recent)) // out of order
				}
				e := recent[j]
				recent = append(recent[:j], recent[j+1:]...)
				require.True(t, tb.remove(e))
				delete(want, e)
				require.False(t, tb.remove(e), "a released event is gone")
			case len(held) > 0 && rng.IntN(4) == 0:
				e := held[0]
				held = held[1:]
				require.True(t, tb.remove(e))
				delete(want, e)
			}
			require.False(t, tb.remove(0))
			require.False(t, tb.remove(tb.last+1), "an id not yet given")
			if i%97 == 0 {
				checkTable(t, tb, want)
			}
		}
		checkTable(t, tb, want)
		l := limit
		if l == 0 {
			l = maxEventRing
		}
		assert.LessOrEqual(t, len(tb.ring), l)
	}
}

func TestHeldEventOutlivesTheRing(t *testing.T) {
	d := mustNew(t, Config{})
	s, err := d.NewStream()
	require.NoError(t, err)
	require.NoError(t, d.SetStreamBusy(s, true))
	held, err := d.RecordEvent(s)
	require.NoError(t, err)
	var last device.Event
	for range 3 * maxEventRing {
		e, err := d.RecordEvent(s)
		require.NoError(t, err)
		require.NoError(t, d.ReleaseEvent(e))
		last = e
	}
	assert.Contains(t, d.events.old, held, "the held event left the ring")
	assert.LessOrEqual(t, len(d.events.ring), maxEventRing)
	done, err := d.EventDone(held)
	require.NoError(t, err)
	assert.False(t, done, "the busy stream has not run it")
	require.NoError(t, d.SynchronizeEvent(held))
	done, err = d.EventDone(held)
	require.NoError(t, err)
	assert.True(t, done)
	_, err = d.EventDone(last)
	assert.ErrorIs(t, err, device.ErrInvalidEvent, "a released event in the ring")
	require.NoError(t, d.ReleaseEvent(held))
	for _, e := range []device.Event{held, last, 0, last + 1} {
		_, err = d.EventDone(e)
		assert.ErrorIs(t, err, device.ErrInvalidEvent, "event %d", e)
		assert.ErrorIs(t, d.ReleaseEvent(e), device.ErrInvalidEvent, "event %d", e)
		assert.ErrorIs(t, d.WaitEvent(s, e), device.ErrInvalidEvent, "event %d", e)
		assert.ErrorIs(t, d.SynchronizeEvent(e), device.ErrInvalidEvent, "event %d", e)
	}
	assert.Zero(t, d.events.len())
}

func TestEventRecordAndReleaseAllocateNothing(t *testing.T) {
	d := mustNew(t, Config{})
	s, err := d.NewStream()
	require.NoError(t, err)
	allocs := testing.AllocsPerRun(1000, func() {
		e, _ := d.RecordEvent(s)
		_, _ = d.EventDone(e)
		_ = d.ReleaseEvent(e)
	})
	assert.Zero(t, allocs)
}
