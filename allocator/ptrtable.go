// This file holds ptrTable, the map from address to allocated block.

package allocator

import "github.com/gpumem/gpumem/device"

// ptrTable maps the address of every allocated block to the block. It is
// an open-addressing hash table with linear probing and backward-shift
// deletion, kept at most half full: a lookup touches one or two slots, and
// in steady state (as many frees as allocations) it neither grows nor
// allocates. It replaces a Go map on the hot path because a map that
// empties re-seeds itself from the runtime's random source on every
// delete. Addresses are never zero, so zero marks an empty slot. Guarded
// by Allocator.mu.
type ptrTable struct {
	slots []ptrSlot
	mask  uint64
	shift uint8
	n     int
}

type ptrSlot struct {
	ptr device.Ptr
	b   *block
}

const ptrTableMinSize = 64

func (t *ptrTable) init(size int) {
	t.slots = make([]ptrSlot, size)
	t.mask = uint64(size - 1)
	t.shift = uint8(64 - bitsLen(uint64(size-1)))
	t.n = 0
}

func bitsLen(x uint64) int {
	n := 0
	for x != 0 {
		x >>= 1
		n++
	}
	return n
}

// home is the slot a pointer hashes to. Block addresses are multiples of
// 512, so the low bits carry no information; Fibonacci hashing mixes the
// rest.
func (t *ptrTable) home(p device.Ptr) uint64 {
	return (uint64(p) >> 9 * 0x9E3779B97F4A7C15) >> t.shift
}

// get returns the block at p, or nil.
func (t *ptrTable) get(p device.Ptr) *block {
	if t.n == 0 {
		return nil
	}
	for i := t.home(p); ; i = (i + 1) & t.mask {
		s := &t.slots[i]
		if s.ptr == p {
			return s.b
		}
		if s.ptr == 0 {
			return nil
		}
	}
}

// put adds or replaces the block at p.
func (t *ptrTable) put(p device.Ptr, b *block) {
	if t.slots == nil {
		t.init(ptrTableMinSize)
	} else if 2*(t.n+1) > len(t.slots) {
		t.grow()
	}
	for i := t.home(p); ; i = (i + 1) & t.mask {
		s := &t.slots[i]
		if s.ptr == p {
			s.b = b
			return
		}
		if s.ptr == 0 {
			*s = ptrSlot{p, b}
			t.n++
			return
		}
	}
}

// remove deletes the entry at p and returns its block, or nil. It shifts
// later entries of the probe run back so that no tombstones accumulate.
func (t *ptrTable) remove(p device.Ptr) *block {
	if t.n == 0 {
		return nil
	}
	i := t.home(p)
	for {
		s := &t.slots[i]
		if s.ptr == p {
			break
		}
		if s.ptr == 0 {
			return nil
		}
		i = (i + 1) & t.mask
	}
	b := t.slots[i].b
	// Backward shift: move each later entry of the run into the hole if
	// its home slot does not lie (cyclically) between the hole and it.
	hole := i
	for j := (i + 1) & t.mask; ; j = (j + 1) & t.mask {
		s := t.slots[j]
		if s.ptr == 0 {
			break
		}
		h := t.home(s.ptr)
		if (j-h)&t.mask >= (j-hole)&t.mask {
			t.slots[hole] = s
			hole = j
		}
	}
	t.slots[hole] = ptrSlot{}
	t.n--
	return b
}

func (t *ptrTable) grow() {
	old := t.slots
	t.init(2 * len(old))
	for _, s := range old {
		if s.ptr != 0 {
			t.put(s.ptr, s.b)
		}
	}
}

// len returns the number of entries.
func (t *ptrTable) len() int { return t.n }

// each calls f for every entry, in no particular order.
func (t *ptrTable) each(f func(device.Ptr, *block)) {
	for _, s := range t.slots {
		if s.ptr != 0 {
			f(s.ptr, s.b)
		}
	}
}
