// This file holds the held front of size buckets: the unsplit that a
// free of the pending split's front owes waits until the index is used
// again (Hold), and a request of the front's size takes it again as it is
// (Retake); every other use merges the two first (rejoin).

package freeindex

// rejoin merges the held front back into the pending split's rest, which
// then is the block from before the split again, filed under its key:
// the unsplit that Put owed. The front's struct is kept for the next
// split.
func (x *Index) rejoin() {
	b, pb := x.held, x.pend
	x.held, x.pend = nil, nil
	if x.parked {
		x.parked = false
		x.table.Unpark(b.ptr)
	}
	prev := b.prev
	pb.ptr, pb.size = b.ptr, b.size+pb.size
	pb.prev = prev
	if prev != nil {
		prev.next = pb
	} else {
		pb.seg.head = pb
	}
	if x.front == nil {
		x.front = b
	} else {
		x.spares.put(b)
	}
}

// Unhold merges a held front back (rejoin): before the allocator reads
// the neighbours of a block of x's segments (the free of a block, which
// may be the held front's neighbour, a walk of a segment's blocks).
func (x *Index) Unhold() {
	if x.held != nil {
		x.rejoin()
	}
}

// Retake takes the held front out to hand it out again for a request of
// its size (rounded), which its caller found with Held and compared: the
// split it came from is the one a take would make. (The size buckets
// remember the block from before the split, the pending split's rest
// under its old key, as the best fit of the front's size: a front is
// held only after a hand-out of the remembered best fit or a retake,
// whose split left the pending split, and every change of the buckets or
// of what they remember merges it back first; Check verifies it.) The
// pending split stays, as after that take; the block's fields are as its
// free left them (the allocator's record sets the rest). The allocator's
// fast path asks Held before Remembered: a front is held only while a
// split is pending, when Remembered answers nil, so the order changes no
// answer, and Held tests less.
func (x *Index) Retake() { x.held = nil }

// RetakeParked is Retake for a held front parked in the address table
// (IsParked): it ends the parking too, and the entry is the allocated
// block's again.
func (x *Index) RetakeParked() {
	x.held, x.parked = nil, false
	x.table.Retaken()
}

// Hold files b, a block just freed, as Put would when b is the front of
// the pending split of size buckets that hand out one size in a loop
// (again): then the unsplit, which would give back the block from before
// the split under the key its rest is still filed under, waits too
// (held), and Hold reports true; else it changes nothing and reports
// false, and the caller calls Put. The front's lower neighbour is never
// free while its split is pending (HoldFront), so the unsplit is the
// whole merge. (Out of a loop, the next request is seldom of the front's
// size, and merging the front back later costs more than now.) b's
// requested is zero by the time the caller lets go of the lock.
// Small enough to be inlined in the allocator's free.
func (x *Index) Hold(b *Block) bool {
	if pb := x.pend; !x.again || pb == nil || b.next != pb {
		return false
	}
	x.held = b
	return true
}

// Front returns the front of the pending split (the block the take
// that left it handed out, the rest's lower neighbour), while a split is
// pending (Pending): the block a free of its address holds (Hold), or
// the held front itself. Small enough to be inlined in the allocator's
// free, which then finds that block without its address table.
func (x *Index) Front() *Block { return x.pend.prev }

// HoldFront is Hold for b, the allocated front (Front), freed
// by its shard's Free in a loop (Again): it holds b and
// leaves b's entry in the address table, parked (PtrTable.Park): a merge
// back deletes it there (Unhold), a hand-out again takes it as it is
// (Parked). It needs no test of Hold's: while a split is pending, its
// front's lower neighbour is never free (every free of a block of x is
// filed by Put, which settles the split first; Check verifies it), so the
// front's free would merge with nothing but the rest. Small enough, with
// Front, to be inlined in the allocator's free.
func (x *Index) HoldFront(b *Block) {
	x.held, x.parked = b, true
	x.table.Park()
}

// Again reports whether the index is of size buckets that hand out one
// size in a loop (again): only then may a free be held (Hold) or a front
// be held (Unhold).
func (x *Index) Again() bool { return x.again }

// Held returns the held front, nil when there is none.
func (x *Index) Held() *Block { return x.held }

// SetTable names t, the address table of the index's shard, where its
// held front may stay parked (HoldFront).
func (x *Index) SetTable(t *PtrTable) { x.table = t }

// Parked reports whether the held front just handed out again (Retake)
// was parked in the address table, and ends that: then its entry is the
// allocated block's again, else the caller adds it.
func (x *Index) Parked() bool {
	if !x.parked {
		return false
	}
	x.parked = false
	x.table.Retaken()
	return true
}

// IsParked reports whether the held front is parked in the address table
// (HoldFront), for the checker.
func (x *Index) IsParked() bool { return x.parked }
