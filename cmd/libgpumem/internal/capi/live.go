// live.go: liveTable, the allocation stream of each live block, an
// open-addressing hash table that costs a few dozen instructions per
// operation (a Go map cost about 100 to insert and 190 to delete here).

package capi

import (
	"math/bits"

	"github.com/gpumem/gpumem/device"
)

// liveTable maps block addresses (never 0) to streams. Slots hold keys and
// values side by side; a key of 0 marks an empty slot. Lookups probe
// linearly from the key's home slot; deletion shifts the following
// entries of the run back (no tombstones), so a probe ends at the first
// empty slot. The table doubles when it is half full and never shrinks.
//
// Invariant: every key k sits at home(k) or after it, with no empty slot
// between home(k) and its position (wrapping around).
type liveTable struct {
	slots []liveSlot
	n     int  // live entries
	shift uint // 64 - log2(len(slots))
}

type liveSlot struct {
	key device.Ptr
	s   device.Stream
}

const liveMinSlots = 64

func newLiveTable() *liveTable {
	t := &liveTable{}
	t.resize(liveMinSlots)
	return t
}

func (t *liveTable) resize(n int) {
	old := t.slots
	t.slots = make([]liveSlot, n)
	t.shift = uint(64 - bits.TrailingZeros(uint(n)))
	t.n = 0
	for _, e := range old {
		if e.key != 0 {
			t.put(e.key, e.s)
		}
	}
}

// home is the slot a key hashes to (Fibonacci hashing; block addresses are
// multiples of 512, so their low bits carry nothing).
func (t *liveTable) home(k device.Ptr) int {
	return int((uint64(k) * 0x9e3779b97f4a7c15) >> t.shift)
}

// put records k (not 0) on stream s, replacing an entry of k.
func (t *liveTable) put(k device.Ptr, s device.Stream) {
	if 2*(t.n+1) > len(t.slots) {
		t.resize(2 * len(t.slots))
	}
	mask := len(t.slots) - 1
	for i := t.home(k); ; i = (i + 1) & mask {
		switch t.slots[i].key {
		case 0:
			t.slots[i] = liveSlot{k, s}
			t.n++
			return
		case k:
			t.slots[i].s = s
			return
		}
	}
}

// take removes k and returns its stream, or false if k is not there.
func (t *liveTable) take(k device.Ptr) (device.Stream, bool) {
	mask := len(t.slots) - 1
	i := t.home(k)
	for ; t.slots[i].key != k; i = (i + 1) & mask {
		if t.slots[i].key == 0 {
			return 0, false
		}
	}
	s := t.slots[i].s
	// Shift back the entries after i whose home is not in (i, j].
	for j := (i + 1) & mask; t.slots[j].key != 0; j = (j + 1) & mask {
		h := t.home(t.slots[j].key)
		if (j-h)&mask >= (j-i)&mask { // h is at or before i, cyclically
			t.slots[i] = t.slots[j]
			i = j
		}
	}
	t.slots[i] = liveSlot{}
	t.n--
	return s, true
}
