// This file holds the free index's own check, for the invariant checker.

package freeindex

// Check verifies the invariants of x (Index): its kind's structures,
// the pending split and its held front, that every block in it is marked indexed and filed
// where a lookup finds it, the list of whole free segments, and the struct
// kept for the next split. It reports each fault to bad and changes
// nothing.
func (x *Index) Check(bad func(format string, args ...any)) {
	s, p := x.stream, x.pool.stat
	if (x.buckets != nil) != (x.kind == KindSmall) || (x.large != nil) != (x.kind == KindLarge) || x.kind == KindSmall && x.tree.n != 0 {
		bad("the free index of stream %d, pool %s, has structures of another kind", s, p)
		return
	}
	if x.kind == KindTree && (x.pend != nil || x.front != nil) {
		bad("the cold shard's stream %d keeps a pending split", s)
	}
	if f := x.front; f != nil && (f.Allocated || f.indexed || f.listed || f.Uses != 0 || f.unmapped || f.EventCount != 0 || f.Requested != 0) {
		bad("stream %d: the struct kept for the next split is in use", s)
	} else if f != nil && (f.stream != x.stream || f.pool != x.pool) {
		bad("stream %d: the struct kept for the next split is of stream %d, pool %s", s, f.stream, f.pool.stat)
	}
	if f := x.held; f != nil && (x.kind != KindSmall || x.pend == nil || f.next != x.pend || f.Allocated || f.indexed || f.Uses != 0 || f.EventCount != 0 || f.Requested != 0 || mergeable(f, f.prev)) {
		bad("stream %d: the held front %v is not the free front of the pending split", s, f.ptr)
	} else if bk := x.buckets; f != nil && (!x.again || bk.memo != x.pend || bk.memoSize != f.size || bk.version != bk.memoVersion) {
		bad("stream %d: the held front %v is not of a loop whose remembered best fit is the block from before its split", s, f.ptr)
	}
	if x.parked && (x.held == nil || x.table == nil || x.table.Entry(x.held.ptr) != x.held) {
		bad("stream %d: a held front parked in the address table is not there", s)
	}
	if x.pend == arenaMark {
		x.checkArena(bad)
	} else if x.arena != nil {
		bad("stream %d: the free index keeps an arena's first block %v but holds no arena", s, x.arena.ptr)
	}
	x.checkFiling(bad)
	x.checkWholes(bad)
}

// checkFiling checks x's structures and that every block in it is marked
// indexed and filed where a lookup finds it.
func (x *Index) checkFiling(bad func(format string, args ...any)) {
	s, p := x.stream, x.pool.stat
	if pb := x.pend; pb != nil && pb != arenaMark {
		// The block whose split is pending is filed under its key from
		// before the split: check the index with that key, and that the
		// block split from it is its front.
		if f := pb.prev; !pb.IsFree() || !pb.indexed || f == nil || f.Busy() == (f == x.held) || f.ptr != x.pendKey.ptr || f.size+pb.size != x.pendKey.size {
			bad("the block %v whose split is pending is not free and indexed after its front %v", pb.ptr, x.pendKey.ptr)
		} else if mergeable(f, f.prev) {
			// The block split had no free lower neighbour (free
			// neighbours are merged), and every free of a block of x
			// files it (Put), which settles the split first: while a
			// split is pending, its front's lower neighbour is not free,
			// so a free of the front may hold it (HoldFront).
			bad("the front %v of the pending split has a free lower neighbour %v", f.ptr, f.prev.ptr)
		}
		k := KeyOf(pb)
		pb.ptr, pb.size = x.pendKey.ptr, x.pendKey.size
		defer func() { pb.ptr, pb.size = k.ptr, k.size }()
	}
	var msg string
	switch x.kind {
	case KindSmall:
		msg = x.buckets.check()
	case KindLarge:
		if msg = x.large.check(); msg == "" {
			msg = x.tree.check()
		}
	default:
		msg = x.tree.check()
	}
	if msg != "" {
		bad("free index of stream %d, pool %s: %s", s, p, msg)
	}
	x.Each(func(b *Block) bool {
		if !b.indexed {
			bad("free block %v is in the index but not marked indexed", b.ptr)
		}
		found := true
		switch {
		case x.kind == KindSmall:
		case x.inLarge(b.size):
			bk := x.large.bucketOf(classOf(b.size))
			found = bk != nil && (bk.first == b || int(b.heapIdx) < len(bk.heap) && bk.heap[b.heapIdx] == b)
		default:
			l, i := x.tree.seek(KeyOf(b))
			found = l != nil && l.vals[i] == b
		}
		if !found {
			bad("free block %v+%d is in the index but a lookup does not find it", b.ptr, b.size)
		}
		return true
	})
}

// checkWholes checks the list of whole free segments against the blocks
// of the index.
func (x *Index) checkWholes(bad func(format string, args ...any)) {
	s, p := x.stream, x.pool.stat
	listed := map[*Block]bool{}
	var prev *Block
	for b := x.wholes; b != nil; b = b.nextWhole {
		if listed[b] || b.prevWhole != prev {
			bad("the list of whole free segments is broken at %v", b.ptr)
			break
		}
		listed[b] = true
		prev = b
		if !b.listed || !b.indexed || b.IsSplit() || b.seg.Expandable() || b.seg.free != x {
			bad("block %v is in the list of whole free segments but is not one", b.ptr)
		}
	}
	seenListed := 0
	x.Each(func(b *Block) bool {
		if listed[b] {
			seenListed++
		}
		whole := !b.IsSplit() && !b.seg.Expandable()
		if x.kind == KindSmall {
			// The whole segments of size buckets are the 2 MiB class.
			if whole != (b.size == SmallBuffer) || b.listed {
				bad("free block %v+%d fills its segment: %v, but the size buckets say otherwise", b.ptr, b.size, whole)
			}
		} else if whole != listed[b] || whole != b.listed {
			bad("free block %v fills its segment: %v, but is listed: %v (marked %v)", b.ptr, whole, listed[b], b.listed)
		}
		return true
	})
	if seenListed != len(listed) {
		bad("the list of whole free segments of stream %d, pool %s, holds %d blocks not in the index", s, p, len(listed)-seenListed)
	}
}

// CheckSegments checks that x counts n segments, the segments of its pool
// and stream, and is among its pool's owners exactly when n > 0.
func (x *Index) CheckSegments(n int, bad func(format string, args ...any)) {
	if x.nSeg != n || (n > 0) != (x.owner < len(x.pool.owners) && x.pool.owners[x.owner] == x) {
		bad("the free index of stream %d, pool %s, counts %d segments, has %d, owner %v", x.stream, x.pool.stat, x.nSeg, n, n > 0)
	}
}

// CheckOwners checks that every owner of p is an index of p filed where
// it says.
func (p *Pool) CheckOwners(bad func(format string, args ...any)) {
	for i, x := range p.owners {
		if x.owner != i || x.pool != p {
			bad("the owners of pool %s are misfiled at %d", p.stat, i)
		}
	}
}
