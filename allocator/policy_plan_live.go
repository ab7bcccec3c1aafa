// This file holds liveTable, the table through which the planned
// policy's buildPlanLocked matches a step's frees with its allocations.

package allocator

import (
	"math/bits"

	"github.com/gpumem/gpumem/device"
)

// liveTable is, while buildPlanLocked matches a step's frees with its
// allocations, the position of the block the step allocated at each
// address and has not freed yet: open addressing over more than twice as
// many slots as the step has allocations, with no deletion (a free
// clears the slot's position, the address keeps its slot), several times
// cheaper than a map's insertions, look-ups and deletions. Only an
// allocation takes a slot (slot); a free looks its address up (find), so
// that the frees of blocks allocated before the step, however many, never
// fill the table.
type liveTable struct {
	slots []liveSlot
	shift uint
}

// liveSlot is a slot of a liveTable: an address (when set), and 1 + the
// position of the block the step allocated there and has not freed yet,
// 0 when none.
type liveSlot struct {
	ptr device.Ptr
	pos int32
	set bool // the slot holds ptr
}

// newLiveTable returns an empty table for a step of n > 0 allocations
// (so at most n addresses).
func newLiveTable(n int) liveTable {
	b := bits.Len(uint(2 * n))
	return liveTable{slots: make([]liveSlot, 1<<b), shift: uint(64 - b)}
}

// slot returns the slot of ptr, for an allocation: the one that holds
// it, else the empty slot it takes (marked as holding ptr, with no
// position). At most one slot per allocation is taken, fewer than half
// of them, so an empty slot is always found.
func (t liveTable) slot(ptr device.Ptr) *liveSlot {
	mask := len(t.slots) - 1
	i := t.home(ptr)
	for {
		s := &t.slots[i]
		if !s.set {
			s.ptr, s.set = ptr, true
			return s
		}
		if s.ptr == ptr {
			return s
		}
		i = (i + 1) & mask
	}
}

// find returns the slot that holds ptr, for a free, nil when no
// allocation of the step took one.
func (t liveTable) find(ptr device.Ptr) *liveSlot {
	mask := len(t.slots) - 1
	for i := t.home(ptr); ; i = (i + 1) & mask {
		s := &t.slots[i]
		if !s.set {
			return nil
		}
		if s.ptr == ptr {
			return s
		}
	}
}

// home returns the slot where the probe for ptr starts.
func (t liveTable) home(ptr device.Ptr) int {
	return int((uint64(ptr) >> 9 * 0x9e3779b97f4a7c15) >> t.shift)
}
