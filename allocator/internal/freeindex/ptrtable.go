// This file holds PtrTable, the map from address to allocated block.

package freeindex

import "github.com/gpumem/gpumem/device"

// PtrTable maps the address of every allocated block to the block. It is
// an open-addressing hash table with linear probing and backward-shift
// deletion, kept at most a quarter full (32 to 64 bytes of slots a live
// block): a lookup touches one or two slots, and a removal's walk to the
// end of its probe run is short (at half full it cost random_mixed about
// 9 instructions an operation more); in steady state (as many frees as allocations) it neither grows nor
// allocates. It replaces a Go map on the hot path because a map that
// empties re-seeds itself from the runtime's random source on every
// delete. A nil slot is empty. Each shard has one, guarded by its lock.
// A slot holds only the block pointer (the key is the
// block's address field), so the table costs 8 bytes a slot.
//
// A front held by its shard's fast Free (Index.HoldFront) stays in the
// table, parked, until it is handed out again (Index.RetakeParked, or
// Retake and Parked) or merged back (Index.Unhold): a parked entry is not
// allocated, and Get, Len and Each, which answer for the allocated
// blocks, skip it.
type PtrTable struct {
	slots  []*Block // a block's key is its own ptr field
	mask   uint64
	shift  uint8
	n      int
	limit  int // n at which the table grows: a quarter of its slots
	parked int // entries not allocated: held fronts left in the table (Park)
}

const ptrTableMinSize = 64

func (t *PtrTable) init(size int) {
	t.slots = make([]*Block, size)
	t.mask = uint64(size - 1)
	t.shift = tableShift(size)
	t.n = 0
	t.limit = size / 4
}

// home is the slot a pointer hashes to. Block addresses are multiples of
// 512, so the low bits carry no information. The shift is at most 58 (a
// table has ptrTableMinSize slots or more); masking it with 63 says so to
// the compiler, which then drops its code for shifts of 64 and more.
func (t *PtrTable) home(p device.Ptr) uint64 { return fibHash(uint64(p)>>9, t.shift&63) }

// Get returns the allocated block at p, or nil: a parked entry is not.
func (t *PtrTable) Get(p device.Ptr) *Block {
	if b := t.Entry(p); b != nil && b.Allocated {
		return b
	}
	return nil
}

// Entry returns the entry at p, allocated or parked, or nil.
func (t *PtrTable) Entry(p device.Ptr) *Block {
	if t.n == 0 {
		return nil
	}
	for i := t.home(p); ; i = (i + 1) & t.mask {
		b := t.slots[i]
		if b == nil || b.ptr == p {
			return b
		}
	}
}

// Put adds b, whose address is not in the table, under its address.
func (t *PtrTable) Put(b *Block) {
	if t.n >= t.limit {
		t.grow()
	}
	mask := t.mask
	i := t.home(b.ptr)
	for t.slots[i] != nil {
		i = (i + 1) & mask
	}
	t.slots[i] = b
	t.n++
}

// PutHome adds b, whose address is not in the table, when its home slot
// is empty and the table need not grow, and reports whether it did; Put
// does the rest. It is small enough to be inlined into the hot path.
func (t *PtrTable) PutHome(b *Block) bool {
	i := t.home(b.ptr)
	if t.n >= t.limit || t.slots[i] != nil {
		return false
	}
	t.slots[i] = b
	t.n++
	return true
}

// RemoveHome deletes the entry at p and returns its block when it is in
// its home slot and the next slot is empty (no probe run to shift back),
// else returns nil and changes nothing: Remove does the rest. It is small
// enough to be inlined into the hot path.
func (t *PtrTable) RemoveHome(p device.Ptr) *Block {
	if t.n == 0 {
		return nil
	}
	slots, i := t.slots, t.home(p)
	b := slots[i]
	if b == nil || b.ptr != p || slots[(i+1)&t.mask] != nil {
		return nil
	}
	slots[i] = nil
	t.n--
	return b
}

// Park leaves the entry of b, a held front just freed (Index.HoldFront),
// in the table; Unpark or Retaken ends it.
func (t *PtrTable) Park() { t.parked++ }

// Unpark deletes the parked entry at p (a held front merged back).
func (t *PtrTable) Unpark(p device.Ptr) {
	t.Remove(p)
	t.parked--
}

// Retaken makes the parked entry of a held front handed out again an
// allocated block's again (its caller set Allocated).
func (t *PtrTable) Retaken() { t.parked-- }

// Remove deletes the entry at p and returns its block, or nil. It shifts
// later entries of the probe run back so that no tombstones accumulate.
func (t *PtrTable) Remove(p device.Ptr) *Block {
	slots := t.slots
	if len(slots) == 0 {
		return nil
	}
	// The mask from the slice's own length: every index below is masked
	// with it, so the compiler checks no bounds.
	mask := uint64(len(slots) - 1)
	i := t.home(p)
	var b *Block
	for {
		b = slots[i&mask]
		if b == nil {
			return nil
		}
		if b.ptr == p {
			break
		}
		i++
	}
	// Backward shift: move each later entry of the run into the hole if
	// its home slot does not lie (cyclically) between the hole and it.
	hole := i
	for j := hole + 1; ; j++ { // j and hole unmasked: their differences are the same modulo the size
		s := slots[j&mask]
		if s == nil {
			break
		}
		if (j-t.home(s.ptr))&mask >= (j-hole)&mask {
			slots[hole&mask] = s
			hole = j
		}
	}
	slots[hole&mask] = nil
	t.n--
	return b
}

func (t *PtrTable) grow() {
	if t.slots == nil {
		t.init(ptrTableMinSize)
		return
	}
	old := t.slots
	t.init(2 * len(old))
	for _, b := range old {
		if b != nil {
			t.Put(b)
		}
	}
}

// Len returns the number of allocated blocks: the entries but the parked.
func (t *PtrTable) Len() int { return t.n - t.parked }

// Each calls f for every allocated block in the table (not the parked
// entries), in no particular order.
func (t *PtrTable) Each(f func(*Block)) {
	for _, b := range t.slots {
		if b != nil && b.Allocated {
			f(b)
		}
	}
}
