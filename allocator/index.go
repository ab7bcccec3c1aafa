// This file holds freeIndex: the free blocks of one pool on one stream,
// in the structure that finds their best fit fastest.

package allocator

import "github.com/gpumem/gpumem/device"

// A freeIndex holds the free blocks of one pool on one stream, ordered by
// (size, address), and the list of those that fill a plain segment.
// Blocks are found by bit scans over size classes of 512 bytes: the small
// pool's of PyTorch's plain segments (at most 2 MiB) in sizeBuckets, the
// other pools' up to 128 MiB in largeBuckets, larger ones in a B+ tree
// (freeTree). The walks that the rule of expandable segments and the
// low_fragmentation policy make in (size, address) order cross the
// classes by the bitmap, each class in address order, then the tree
// (ascendFrom). The indexes of the cold shard's streams (shards.go),
// which may be many, use the tree alone: size classes cost tens of KiB.
// Its fields are guarded by its shard's lock.
//
// Invariants: the index holds exactly the pool's free blocks of its
// stream, each marked indexed, each in the structure its size says. The
// blocks that fill a plain segment, the segments that releasing the cache
// returns to the device, are known without a walk of every cached block,
// so that a release costs what it releases: in the small pool they are
// the 2 MiB bucket (a small segment is 2 MiB); in the others, wholes
// lists exactly them (marked listed). nseg counts the segments of the
// index's pool and stream, and the index is among its pool's owners
// (at owner) exactly when it has some.
type freeIndex struct {
	sh      *shard
	k       int // pool.idx
	pool    *pool
	stream  device.Stream
	buckets *sizeBuckets  // the small pool of plain segments; nil otherwise
	large   *largeBuckets // the large pool of plain segments: blocks up to 128 MiB; nil otherwise
	tree    freeTree      // every other block
	wholes  *block        // but in the small pool: head of the list of whole free segments, through nextWhole
	nseg    int           // segments of the pool and stream (changed in the world)
	owner   int           // the index's place in pool.owners while nseg > 0
	coldAt  int           // a cold index's place in its pool's cold view's wholes, plus one; 0 when not there

	// pend is the free block that the last Alloc from this index split,
	// still filed under its key from before the split, pendKey: its move
	// to its new key waits, because the usual next step, the free of the
	// block handed out (pend.prev), merges the two back into that very
	// key (unsplit), and then the index never changes. Anything else that
	// reads or changes the index first moves it (settle). Its age base and
	// its place in wholes are already those of its new key.
	pend    *block
	pendKey treeKey
	// front is the struct of the last block handed out and merged back by
	// an unsplit: its fields but those a split sets are zero, so the next
	// split reuses it without clearing and recycling it.
	front *block
}

// init makes x the empty free index of pool p on stream s, in shard sh:
// the tree alone when treeOnly (the cold shard); size buckets when
// smallBuckets and p is the small pool (PyTorch's plain segments, whose
// small free blocks are at most 2 MiB); otherwise large buckets for the
// blocks of up to 128 MiB, and the tree for larger ones.
func (x *freeIndex) init(sh *shard, s device.Stream, p *pool, treeOnly, smallBuckets bool) {
	x.sh, x.k, x.pool, x.stream = sh, p.idx, p, s
	switch {
	case treeOnly:
	case p.small && smallBuckets:
		x.buckets = new(sizeBuckets)
	default:
		x.large = new(largeBuckets)
	}
}

// insert files a free block; but in size buckets it stamps its age base
// (the pools that use them, the small pools of PyTorch's plain segments,
// have no reader of ages).
func (x *freeIndex) insert(b *block) {
	b.indexed = true
	if x.buckets != nil {
		x.buckets.insert(b)
		return
	}
	b.gcCountBase = x.pool.gcCalls
	x.add(b)
	if !b.isSplit() && !b.seg.expandable() {
		x.list(b)
	}
}

// remove takes a free block out of the index. The block's size and
// address must be those it was filed under.
func (x *freeIndex) remove(b *block) {
	b.indexed = false
	if x.buckets != nil {
		x.buckets.remove(b)
		return
	}
	x.drop(b)
	if b.listed {
		x.unlist(b)
	}
}

// add and drop put b in the large buckets or the tree, as its size says,
// and take it out: the structures alone, no flag or list.
func (x *freeIndex) add(b *block) {
	if x.large != nil && b.size <= maxLargeSize {
		x.large.insert(b)
	} else {
		x.tree.insert(b)
		if x.large == nil { // a cold index
			x.pool.cold.add(b)
		}
	}
}

func (x *freeIndex) drop(b *block) {
	if x.large != nil && b.size <= maxLargeSize {
		x.large.remove(b)
	} else {
		x.tree.remove(b)
		if x.large == nil { // a cold index
			x.pool.cold.drop(keyOf(b))
		}
	}
}

// rekey moves b, a free block filed in x's tree under old, to its current
// key, and stamps its age base as filing it anew would.
func (x *freeIndex) rekey(b *block, old treeKey) {
	b.gcCountBase = x.pool.gcCalls
	x.tree.rekey(b, old)
	if x.large == nil { // a cold index
		x.pool.cold.drop(old)
		x.pool.cold.add(b)
	}
	if whole := !b.isSplit() && !b.seg.expandable(); whole != b.listed {
		if whole {
			x.list(b)
		} else {
			x.unlist(b)
		}
	}
}

// settle files the block whose split is pending under its new key.
func (x *freeIndex) settle() {
	b, old := x.pend, x.pendKey
	x.pend = nil
	if x.large == nil && x.buckets == nil { // a cold index
		x.tree.rekey(b, old)
		x.pool.cold.drop(old)
		x.pool.cold.add(b)
		return
	}
	k := keyOf(b)
	b.ptr, b.size = old.ptr, old.size
	if x.buckets != nil {
		x.buckets.remove(b)
	} else {
		x.drop(b)
	}
	b.ptr, b.size = k.ptr, k.size
	if x.buckets != nil {
		x.buckets.insert(b)
	} else {
		x.add(b)
	}
}

// settleAllLocked settles every free index, before a walk or a change of
// more than one index, and lets go of the structs kept for the next split.
// (The cold shard's indexes are settled at once, allocWorld.)
func (a *Allocator) settleAllLocked() {
	for _, sh := range a.shards {
		if sh.cold {
			continue
		}
		for i := range sh.free {
			x := &sh.free[i]
			if x.pend != nil {
				x.settle()
			}
			if x.front != nil {
				sh.recycleLocked(x.front)
				x.front = nil
			}
		}
	}
}

// file puts a free block in x, an unmapped one in its pool's unmapped
// index.
func (x *freeIndex) file(b *block) {
	if b.unmapped {
		x.pool.unmapped.ReplaceOrInsert(b)
	} else {
		x.insert(b)
	}
}

// unfile takes a block out of the index file put it in.
func (x *freeIndex) unfile(b *block) {
	if b.unmapped {
		x.pool.unmapped.Delete(b)
	} else {
		x.remove(b)
	}
}

// fit returns the free block of the lowest (size, address) with at least
// size bytes, or nil, without the rule of expandable segments
// (treeFitLocked).
func (x *freeIndex) fit(size uint64) *block {
	switch {
	case x.buckets != nil:
		return x.buckets.fit(size)
	case x.large != nil && size <= maxLargeSize:
		if b := x.large.fit(size); b != nil {
			return b
		}
		return x.tree.min() // every block of the tree is larger
	}
	return x.tree.lowerBound(size)
}

// largest returns a free block of the largest size, or nil.
func (x *freeIndex) largest() *block {
	switch {
	case x.buckets != nil:
		return x.buckets.last()
	case x.tree.n == 0 && x.large != nil:
		return x.large.last()
	}
	return x.tree.max()
}

// ascendFrom calls f on b, the lowest address of its size in x (a best
// fit, as fit returns it), then on the blocks after it in (size, address)
// order, until f returns false.
func (x *freeIndex) ascendFrom(b *block, f func(*block) bool) {
	if x.large != nil && b.size <= maxLargeSize {
		if !x.large.ascendFrom(classOf(b.size), f) {
			return
		}
		x.tree.ascend(f)
		return
	}
	l, i := x.tree.seek(keyOf(b))
	ascendFrom(l, i, f)
}

// ascendAtLeast calls f on the free blocks of at least size bytes in
// (size, address) order until f returns false.
func (x *freeIndex) ascendAtLeast(size uint64, f func(*block) bool) {
	if b := x.fit(size); b != nil {
		x.ascendFrom(b, f)
	}
}

// closeFit returns the block of the lowest address among at most window
// free blocks of x from b (a best fit) up in (size, address) order, none
// larger than limit, whose size is below below; b if none is lower. Of
// the blocks of one size only the first, the lowest address, can be
// chosen; the others count in the window.
func (x *freeIndex) closeFit(b *block, limit, below uint64, window int) *block {
	best, n := b, 0
	var l *treeLeaf
	var i int
	if x.large != nil && b.size <= maxLargeSize {
		var done bool
		if best, n, done = x.large.closeFit(classOf(b.size), limit, below, window, b); done {
			return best
		}
		l = x.tree.first // then the blocks above 128 MiB
	} else {
		l, i = x.tree.seek(keyOf(b))
	}
	ascendFrom(l, i, func(c *block) bool {
		if c.size > limit {
			return false
		}
		n++
		if c.size < below && c.ptr < best.ptr {
			best = c
		}
		return n < window
	})
	return best
}

// each calls f on every free block until f returns false: in (size,
// address) order from a tree, by size from buckets.
func (x *freeIndex) each(f func(*block) bool) {
	if x.buckets != nil {
		x.buckets.each(f)
		return
	}
	stopped := false
	if x.large != nil {
		x.large.each(func(b *block) bool {
			stopped = !f(b)
			return !stopped
		})
	}
	if !stopped {
		x.tree.ascend(f)
	}
}

// descendBelow calls f on the free blocks of less than size bytes, from
// the largest (and, among equal sizes, the highest address) down, until f
// returns false. Not for the small pool.
func (x *freeIndex) descendBelow(size uint64, f func(*block) bool) {
	stopped := false
	x.tree.descendBelow(treeKey{size, 0}, func(b *block) bool {
		stopped = !f(b)
		return !stopped
	})
	if stopped || x.large == nil {
		return
	}
	c := largeClasses // every class is below size
	if size <= maxLargeSize {
		c = classOf(size)
	}
	x.large.descendBelow(c, f)
}

// appendWholes appends the free blocks that fill their plain segment to
// list, in no particular order, and returns it.
func (x *freeIndex) appendWholes(list []*block) []*block {
	if x.buckets != nil {
		return append(list, x.buckets.class(numClasses-1)...)
	}
	for b := x.wholes; b != nil; b = b.nextWhole {
		list = append(list, b)
	}
	return list
}

// list and unlist put a block that fills its segment in the list of whole
// free segments of a tree index, and take it out.
func (x *freeIndex) list(b *block) {
	b.listed, b.prevWhole, b.nextWhole = true, nil, x.wholes
	if x.wholes != nil {
		x.wholes.prevWhole = b
	} else if x.large == nil { // a cold index
		x.pool.cold.listed(x)
	}
	x.wholes = b
}

func (x *freeIndex) unlist(b *block) {
	if b.prevWhole != nil {
		b.prevWhole.nextWhole = b.nextWhole
	} else {
		x.wholes = b.nextWhole
		if x.wholes == nil && x.large == nil { // a cold index
			x.pool.cold.unlisted(x)
		}
	}
	if b.nextWhole != nil {
		b.nextWhole.prevWhole = b.prevWhole
	}
	b.listed, b.prevWhole, b.nextWhole = false, nil, nil
}

// segmentAddedLocked files the new segment seg: in the segments map, and
// its free index among its pool's owners.
func (a *Allocator) segmentAddedLocked(seg *segment) {
	a.segments[seg.ptr] = seg
	x, p := seg.free, seg.pool
	if x.nseg == 0 {
		x.owner = len(p.owners)
		p.owners = append(p.owners, x)
	}
	x.nseg++
}

// segmentRemovedLocked unfiles the segment seg, released.
func (a *Allocator) segmentRemovedLocked(seg *segment) {
	delete(a.segments, seg.ptr)
	x, p := seg.free, seg.pool
	x.nseg--
	if x.nseg == 0 {
		last := p.owners[len(p.owners)-1]
		p.owners[x.owner], last.owner = last, x.owner
		p.owners[len(p.owners)-1] = nil
		p.owners = p.owners[:len(p.owners)-1]
	}
}
