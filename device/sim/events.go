// The table of recorded events: a ring of slots by id, and a map for the
// few events held long.

package sim

import "github.com/gpumem/gpumem/device"

// maxEventRing bounds the ring of an eventTable (slots; 96 KiB).
const maxEventRing = 4096

// eventTable holds the events that were recorded and not yet released, by
// id. Ids are 1, 2, 3, ... in recording order and never reused, and a
// caller mostly releases its events soon, in about the order it recorded
// them, so the table is a window over the newest ids: a ring of slots in
// which id e has slot e mod len(ring). Recording and releasing an event
// touch one slot and allocate nothing once the ring has grown to what the
// caller keeps outstanding.
//
// Invariants:
//   - the window is the ids base..last (empty when base > last); last is
//     the newest id recorded, and last-base < len(ring);
//   - an id in the window is live exactly when its slot is marked live;
//   - base is live unless the window is empty (release moves base past
//     released ids);
//   - a slot outside the window is zero;
//   - a live id below base is in old; no other id is;
//   - n counts the live ids.
//
// When a new id does not fit the window, the ring doubles, up to
// maxEventRing (limit, in tests) slots; past that the oldest id leaves the
// window, into old if it is still live. An id that is not live, whether
// never recorded, released, or 0, is found nowhere, so it keeps getting
// device.ErrInvalidEvent.
type eventTable struct {
	ring  []eventSlot // len 0 or a power of two
	base  device.Event
	last  device.Event
	old   map[device.Event]eventState
	n     int
	limit int // the ring's largest length; 0: maxEventRing
}

type eventSlot struct {
	eventState
	live bool
}

// add files a new event and returns its id, last+1.
func (t *eventTable) add(ev eventState) device.Event {
	if t.base == 0 {
		t.base = 1
	}
	t.last++
	e := t.last
	for uint64(e-t.base) >= uint64(len(t.ring)) {
		limit := t.limit
		if limit == 0 {
			limit = maxEventRing
		}
		if len(t.ring) < limit {
			t.grow()
			continue
		}
		t.evictOldest()
	}
	t.ring[int(e)&(len(t.ring)-1)] = eventSlot{eventState: ev, live: true}
	t.n++
	return e
}

// grow doubles the ring (to 64 slots from none), keeping the window's
// ids before last in their slots of the new length.
func (t *eventTable) grow() {
	n := max(64, 2*len(t.ring))
	ring := make([]eventSlot, n)
	for e := t.base; e < t.last; e++ {
		ring[int(e)&(n-1)] = t.ring[int(e)&(len(t.ring)-1)]
	}
	t.ring = ring
}

// evictOldest moves id base out of the window, into old if it is live,
// and base on to the next live id before last (or to last).
func (t *eventTable) evictOldest() {
	s := &t.ring[int(t.base)&(len(t.ring)-1)]
	if s.live {
		if t.old == nil {
			t.old = make(map[device.Event]eventState)
		}
		t.old[t.base] = s.eventState
		*s = eventSlot{}
	}
	t.base++
	t.skipReleased()
}

// skipReleased moves base past the ids of the window that are not live,
// stopping at last (which add is filing).
func (t *eventTable) skipReleased() {
	for t.base < t.last && !t.ring[int(t.base)&(len(t.ring)-1)].live {
		t.base++
	}
}

// get returns the live event e.
func (t *eventTable) get(e device.Event) (eventState, bool) {
	if e != 0 && e >= t.base && e <= t.last {
		s := &t.ring[int(e)&(len(t.ring)-1)]
		return s.eventState, s.live
	}
	if e != 0 && e < t.base {
		ev, ok := t.old[e]
		return ev, ok
	}
	return eventState{}, false
}

// remove releases the live event e, and reports whether there was one.
func (t *eventTable) remove(e device.Event) bool {
	if e != 0 && e >= t.base && e <= t.last {
		s := &t.ring[int(e)&(len(t.ring)-1)]
		if !s.live {
			return false
		}
		*s = eventSlot{}
		t.n--
		if e == t.base {
			t.skipReleased()
			if t.base == t.last && !t.ring[int(t.base)&(len(t.ring)-1)].live {
				t.base = t.last + 1 // the window is empty
			}
		}
		return true
	}
	if e != 0 && e < t.base {
		if _, ok := t.old[e]; ok {
			delete(t.old, e)
			t.n--
			return true
		}
	}
	return false
}

// len returns how many events are live.
func (t *eventTable) len() int { return t.n }
