// This file holds Index: the free blocks of one pool on one stream,
// in the structure that finds their best fit fastest.

package freeindex

import "github.com/gpumem/gpumem/device"

// An Index holds the free blocks of one pool on one stream, ordered by
// (size, address), and the list of those that fill a plain segment (the
// package doc describes the kinds, the methods, the pending split and the
// invariants). Its fields are guarded by its shard's lock.
//
// Whose fields: all but Merged are this package's, which alone writes
// them (Init and the methods); the allocator reads them through Shard,
// PoolIdx, Pool, Stream, Kind and NSeg. Merged is the allocator's (its
// planned policy sets it), and this package does not read it.
type Index struct {
	shard   int     // the id of the shard whose lock guards the index
	spares  *Spares // that shard's recycled block structs
	poolIdx int     // pool.idx
	pool    *Pool
	stream  device.Stream
	kind    Kind
	// Merged marks a small-pool index whose requests the allocator sends
	// to the large pool's index of the stream instead (its planned
	// policy): it stays empty.
	Merged  bool
	buckets *sizeBuckets  // KindSmall
	large   *largeBuckets // KindLarge: blocks up to 128 MiB
	tree    freeTree      // KindLarge: larger blocks; KindTree: every block
	wholes  *Block        // but in size buckets: head of the list of whole free segments, through nextWhole
	nSeg    int           // segments of the pool and stream (changed in the world)
	owner   int           // the index's place in its pool's owners while nSeg > 0
	coldAt  int           // a cold index's place in its pool's cold view's wholes, plus one; 0 when not there

	// pend is the free block that the last take from this index split,
	// still filed under its key from before the split, pendKey: its move
	// to its new key waits, because the usual next step, the free of the
	// block handed out (pend.prev), merges the two back into that very
	// key (unsplit), and then the index never changes. Every other method
	// that reads or changes the index moves it first (settle). Its age
	// base and its place in wholes are already those of its new key.
	// While x holds an arena (arena.go), pend is arenaMark, and settle
	// files the arena's free blocks back instead.
	pend    *Block
	pendKey Key
	// front is the struct of the last block handed out and merged back by
	// an unsplit: its fields but those a split sets are zero, so the next
	// split reuses it without clearing and recycling it.
	front *Block
	// held is the front of the pending split, freed by its caller and
	// not yet merged back (size buckets alone): the unsplit that Put owes
	// waits too, as the usual next step, a request of the front's size
	// whose best fit is still the block from before the split, hands the
	// front out again as it is (Retake). Until then the index holds, as
	// far as anyone outside sees, the block from before the split: every
	// other method merges the two first (settle, Unhold).
	held *Block
	// again: size buckets whose last hand-out was their remembered best
	// fit (Remembered) or a held front taken again (Retake), a loop of
	// one size, so that a free of the front holds it (Hold); a search
	// (BestFit) clears it. A held front is kept only while it is set.
	again bool
	// parked: the held front stays in table, its shard's address table
	// (PtrTable.Park), set only while held is.
	parked bool
	table  *PtrTable
	// arena and arenaEnd: while x holds an arena (pend is arenaMark;
	// arena.go), its first block, whose struct stays that block's while
	// held, and the end of its range.
	arena    *Block
	arenaEnd device.Ptr
}

// Kind is the structure of a free index.
type Kind uint8

const (
	// KindSmall: size buckets, for the small pool of PyTorch's plain
	// segments, whose free blocks are at most 2 MiB, and which keeps no
	// ages (no reader looks at them: garbage collection reads the large
	// pool's, and the policy, which reads both, never has size buckets).
	KindSmall Kind = iota
	// KindLarge: large buckets for the blocks of up to 128 MiB, the tree
	// for larger ones; for the other pools of a shard of its own.
	KindLarge
	// KindTree: the tree alone, for the cold shard's streams.
	KindTree
)

// Init makes x the empty free index of kind k of pool p on stream s, in
// the shard of id shard, whose recycled block structs are sp.
func (x *Index) Init(shard int, sp *Spares, s device.Stream, p *Pool, k Kind) {
	x.shard, x.spares, x.poolIdx, x.pool, x.stream, x.kind = shard, sp, p.idx, p, s, k
	switch k {
	case KindSmall:
		x.buckets = new(sizeBuckets)
	case KindLarge:
		x.large = &largeBuckets{sumsAt: largeClasses} // no sums yet
	}
}

// Shard is the id of the shard whose lock guards the index.
func (x *Index) Shard() int { return x.shard }

// PoolIdx is the place of the index's pool among the allocator's pools
// (Pool.Idx).
func (x *Index) PoolIdx() int { return x.poolIdx }

// Pool is the index's pool.
func (x *Index) Pool() *Pool { return x.pool }

// Stream is the index's stream.
func (x *Index) Stream() device.Stream { return x.stream }

// Kind is the index's structure, fixed at Init.
func (x *Index) Kind() Kind { return x.kind }

// NSeg is the number of segments of the index's pool and stream.
func (x *Index) NSeg() int { return x.nSeg }

// Aged reports whether the index stamps its blocks with the pool's clock
// of ages (GCCountBase), so that a search of it counts in the clock.
func (x *Index) Aged() bool { return x.kind != KindSmall }

// inLarge reports whether a block of size bytes is filed in the large
// buckets (else in the tree), in an index that is not of size buckets.
func (x *Index) inLarge(size uint64) bool {
	return x.kind == KindLarge && size <= maxLargeSize
}

// BestFit is the allocator's best fit (step 4 of its allocation ladder)
// for a request of size (rounded) bytes: the free block of the lowest
// (size, address) with at least size bytes, nil if none, and for a block
// of an expandable segment the rule of expandable segments
// (ExpandableBestFit). Size buckets remember their answer until they
// change (Remembered). Every search of the allocator goes through its
// searchLocked; the low_fragmentation policy has its own, from Fit.
func (x *Index) BestFit(size uint64) *Block {
	if x.pend != nil {
		x.settle()
	}
	x.again = false
	var b *Block
	switch {
	case x.kind == KindSmall:
		return x.buckets.bestFit(size) // no expandable segments here
	case x.inLarge(size):
		if b = x.large.fit(size); b == nil {
			b = x.tree.min() // every block of the tree is larger
		}
	default:
		b = x.tree.lowerBound(size)
	}
	if b != nil && b.SegExpandable() {
		b = ExpandableBestFit(x, b)
	}
	return b
}

// Remembered returns BestFit's answer for size when size buckets
// remember it (the cached path: an alloc and free of one size in a loop),
// else nil; small enough to be inlined in the allocator's fast path.
// BestFit itself does not look: ask this first. Its block may serve any
// request of the small pool (the allocator's splitRule.mayServe): size
// buckets hold blocks of at most 2 MiB, and max_split_size is more than
// 20 MiB (the allocator's Config.validate).
func (x *Index) Remembered(size uint64) *Block {
	if bk := x.buckets; x.kind == KindSmall && x.pend == nil && size == bk.memoSize && bk.version == bk.memoVersion {
		x.again = true
		return bk.memo
	}
	return nil
}

// Take hands out b, a free block of x for a request of size bytes: with
// split, the front of b becomes a new block, which it returns, and b keeps
// the rest, free; without, b itself, taken out of the index. b is in the
// index (found by a fit, or mapped into an expandable segment) or is a
// new segment's block in no index yet; x has no pending split (every fit
// settles it, and the ladder's slow steps settle every index), unless b
// is a block in no index taken whole (Carve's, which may leave one). The rest of
// a block that was in the index keeps its old key until the index is used
// again (pend; an index of the tree kind moves it at once); a new
// segment's rest is filed.
func (x *Index) Take(b *Block, size uint64, split bool) *Block {
	if selfCheck && x.pend != nil && (split || b.indexed) {
		panic("gpumem: take from a free index with a pending split: the fit that found the block settles it")
	}
	if !split {
		switch {
		case !b.indexed:
		case x.kind == KindSmall:
			b.indexed = false
			x.buckets.remove(b)
		case x.inLarge(b.size): // drop, written out
			b.indexed = false
			x.large.remove(b)
			if !b.IsSplit() && b.listed { // only a whole block may be listed
				x.unlist(b)
			}
		default:
			x.drop(b)
		}
		return b
	}
	rest := b
	if b = x.front; b != nil {
		x.front = nil // zero but for the fields set here, and x's stream and pool
	} else {
		b = x.spares.get() // zeroed
		b.stream, b.pool = rest.stream, rest.pool
	}
	old := KeyOf(rest) // after the struct's get, so that nothing lives across that call
	b.ptr, b.size = rest.ptr, size
	b.sameSeg(rest)
	rest.linkBefore(b)
	rest.ptr += device.Ptr(size)
	rest.size -= size
	if !rest.indexed {
		x.add(rest)
		return b
	}
	if x.kind != KindSmall {
		// Stamped and unlisted now, as filing it anew would.
		rest.gcCountBase = x.pool.GCCalls
		if b.prev == nil && rest.next == nil && rest.listed { // whole before the split
			x.unlist(rest)
		}
		x.pend, x.pendKey = rest, old
		if x.kind == KindTree {
			x.settle() // the cold shard's indexes never wait (the allocator's settleAllLocked)
		}
		return b
	}
	x.pend, x.pendKey = rest, old
	return b
}

// Put files b, a block just freed or an unmapped range of x's pool and
// stream, in no index: merged with its neighbours of the same kind
// (PyTorch's try_merge_blocks), in the index, or for an unmapped range in
// its pool's unmapped index. It returns the merged block: b's struct, or
// where a free block merges into a neighbour that its index's tree holds
// (any, in an index of the tree kind; one over maxLargeSize, in a large
// index), that neighbour's, moved to its new key in place (mergeInto).
// When b is the front of the pending split (whose lower neighbour is
// never free: the split is settled by every other Put), the merge gives
// back the block from before the split, filed under the key the pending
// rest still has: the index does not change (an unsplit). (In size
// buckets the allocator asks Hold first, which keeps even that merge
// waiting.) A block of the arena x holds merges with its held free
// neighbours and stays held (putArena), unless one of them is filed in
// the index: then the arena is filed back first.
func (x *Index) Put(b *Block) *Block {
	if pb := x.pend; pb != nil {
		if pb == arenaMark && x.inArena(b) {
			if m, ok := x.putArena(b); ok {
				return m
			}
		}
		// pb.prev is the front, busy until now: b.next == pb means b is
		// it. Its requested is zero already (the allocator's
		// finishFreeLocked). The neighbours are read apart here and below,
		// so that nothing of the merge's path lives across this one.
		if prev := b.prev; b.next == pb {
			x.pend = nil
			pb.ptr, pb.size = b.ptr, b.size+pb.size
			pb.prev = prev
			if prev != nil {
				prev.next = pb
			} else {
				pb.seg.head = pb
			}
			if x.front == nil {
				x.front = b // for the next split of x: b's flags and counts are zero
			} else {
				x.spares.put(b)
			}
			if x.kind != KindSmall {
				pb.gcCountBase = x.pool.GCCalls // as filing it anew would
				if !pb.SegExpandable() && !pb.IsSplit() {
					x.list(pb) // it fills its segment again
				}
			}
			return pb
		}
		x.settle()
	}
	prev, next := b.prev, b.next
	mergePrev, mergeNext := mergeable(b, prev), mergeable(b, next)
	if x.kind != KindSmall && !b.unmapped && (mergePrev || mergeNext) {
		// A neighbour in the tree (any, in an index of the tree kind; in
		// a large one, over maxLargeSize) stays there, larger: merged in
		// place (mergeInto).
		m := prev
		if mergeNext {
			m = next
		}
		if !x.inLarge(m.size) {
			return x.mergeInto(b, mergePrev, mergeNext)
		}
	}
	if mergePrev {
		x.unfile(prev)
		b.ptr, b.size = prev.ptr, b.size+prev.size
		b.prev = prev.prev
		if b.prev != nil {
			b.prev.next = b
		} else {
			b.seg.head = b
		}
		x.spares.put(prev)
	}
	if mergeNext {
		x.unfile(next)
		b.size += next.size
		b.next = next.next
		b.growsAs(next)
		if b.next != nil {
			b.next.prev = b
		}
		x.spares.put(next)
	}
	switch {
	case b.unmapped:
		x.pool.unmapped.ReplaceOrInsert(b)
	case x.kind == KindSmall:
		b.indexed = true
		x.buckets.insert(b)
	case x.inLarge(b.size): // add, written out
		b.indexed = true
		b.gcCountBase = x.pool.GCCalls
		x.large.insert(b)
		if !b.IsSplit() && !b.SegExpandable() {
			x.list(b)
		}
	default:
		x.add(b)
	}
	return b
}

// mergeable reports whether b, free or unmapped, merges with its
// neighbour n: n is of the same kind.
func mergeable(b, n *Block) bool { return n != nil && !n.Busy() && n.unmapped == b.unmapped }

// mergeInto merges b, a mapped free block in no index, into its free
// neighbours (one or both merge) in x, an index of the tree kind or a
// large one, and returns the merged block: a neighbour's struct (the next
// one's if it merges), which is in x's tree, moved to its new key in place
// (freeTree.rekey), which saves a remove and an insert when it stays in
// its leaf.
func (x *Index) mergeInto(b *Block, mergePrev, mergeNext bool) *Block {
	prev, next := b.prev, b.next
	m := prev
	if mergeNext {
		m = next
	}
	old := KeyOf(m)
	first, last, total := b, b, b.size
	if mergePrev {
		first, total = prev, total+prev.size
		if prev != m {
			x.drop(prev)
		}
	}
	if mergeNext {
		last, total = next, total+next.size
	}
	m.ptr, m.size = first.ptr, total
	m.prev, m.next = first.prev, last.next
	m.growsAs(last)
	if m.prev != nil {
		m.prev.next = m
	} else {
		m.seg.head = m
	}
	if m.next != nil {
		m.next.prev = m
	}
	if mergePrev && prev != m {
		x.spares.put(prev)
	}
	x.spares.put(b)
	x.rekey(m, old)
	return m
}

// Insert files a free block that is in no index.
func (x *Index) Insert(b *Block) {
	if x.pend != nil {
		x.settle()
	}
	x.add(b)
}

// Remove takes a free block out of the index.
func (x *Index) Remove(b *Block) {
	if x.pend != nil {
		x.settle()
	}
	x.drop(b)
}

// add files a free block, marked indexed; but in size buckets it stamps
// its age base and lists it if it fills its plain segment.
func (x *Index) add(b *Block) {
	b.indexed = true
	if x.kind == KindSmall {
		x.buckets.insert(b)
		return
	}
	b.gcCountBase = x.pool.GCCalls
	if x.inLarge(b.size) { // place, written out
		x.large.insert(b)
	} else {
		x.tree.insert(b)
		if x.kind == KindTree { // a cold index
			x.pool.cold.add(b)
		}
	}
	if !b.IsSplit() && !b.SegExpandable() {
		x.list(b)
	}
}

// drop takes a free block out of the index. The block's size and address
// must be those it was filed under.
func (x *Index) drop(b *Block) {
	b.indexed = false
	if x.kind == KindSmall {
		x.buckets.remove(b)
		return
	}
	if x.inLarge(b.size) { // displace, written out
		x.large.remove(b)
	} else {
		x.tree.remove(b)
		if x.kind == KindTree { // a cold index
			x.pool.cold.drop(KeyOf(b))
		}
	}
	if b.listed {
		x.unlist(b)
	}
}

// place and displace put b in the large buckets or the tree, as its size
// says, and take it out: the structures alone, no flag or list. Not for
// size buckets.
func (x *Index) place(b *Block) {
	if x.inLarge(b.size) {
		x.large.insert(b)
	} else {
		x.tree.insert(b)
		if x.kind == KindTree { // a cold index
			x.pool.cold.add(b)
		}
	}
}

func (x *Index) displace(b *Block) {
	if x.inLarge(b.size) {
		x.large.remove(b)
	} else {
		x.tree.remove(b)
		if x.kind == KindTree { // a cold index
			x.pool.cold.drop(KeyOf(b))
		}
	}
}

// rekey moves b, a free block filed in x's tree under old, to its current
// key, and stamps its age base as filing it anew would.
func (x *Index) rekey(b *Block, old Key) {
	b.gcCountBase = x.pool.GCCalls
	x.tree.rekey(b, old)
	if x.kind == KindTree { // a cold index
		x.pool.cold.drop(old)
		x.pool.cold.add(b)
	}
	if whole := !b.IsSplit() && !b.SegExpandable(); whole != b.listed {
		if whole {
			x.list(b)
		} else {
			x.unlist(b)
		}
	}
}

// settle files the block whose split is pending under its new key, or
// with a held front merges the two back under the key the block is filed
// under (rejoin).
func (x *Index) settle() {
	if x.held != nil {
		x.rejoin()
		return
	}
	if x.pend == arenaMark {
		x.fileArena()
		return
	}
	b, old := x.pend, x.pendKey
	x.pend = nil
	if x.kind == KindTree { // a cold index
		x.tree.rekey(b, old)
		x.pool.cold.drop(old)
		x.pool.cold.add(b)
		return
	}
	k := KeyOf(b)
	if x.kind == KindLarge && old.size <= maxLargeSize && k.size <= maxLargeSize { // written out
		if x.large.pages != nil {
			x.large.move(b, old.size)
			return
		}
		b.ptr, b.size = old.ptr, old.size
		x.large.remove(b)
		b.ptr, b.size = k.ptr, k.size
		x.large.insert(b)
		return
	}
	if x.kind == KindSmall {
		b.ptr, b.size = old.ptr, old.size
		x.buckets.remove(b)
		b.ptr, b.size = k.ptr, k.size
		x.buckets.insert(b)
		return
	}
	if old.size > maxLargeSize && k.size > maxLargeSize {
		x.tree.rekey(b, old) // in the tree before and after: moved in its leaf where it can
		return
	}
	b.ptr, b.size = old.ptr, old.size
	x.displace(b)
	b.ptr, b.size = k.ptr, k.size
	x.place(b)
}

// Pending reports whether a split's rest waits to move to its new key
// (the package doc's pending split).
func (x *Index) Pending() bool { return x.pend != nil }

// Flush settles the pending split (or files a held arena back) and lets
// go of the struct kept for the next split, before a walk or a change of
// more than one index.
func (x *Index) Flush() {
	if x.pend != nil {
		x.settle()
	}
	if x.front != nil {
		x.spares.put(x.front)
		x.front = nil
	}
}

// unfile takes a free block out of the index, an unmapped one out of its
// pool's unmapped index. (Size buckets without drop's call, as in take.)
func (x *Index) unfile(b *Block) {
	switch {
	case b.unmapped:
		x.pool.unmapped.Delete(b)
	case x.kind == KindSmall:
		b.indexed = false
		x.buckets.remove(b)
	case x.inLarge(b.size): // drop, written out
		b.indexed = false
		x.large.remove(b)
		if !b.IsSplit() && b.listed { // only a whole block may be listed
			x.unlist(b)
		}
	default:
		x.drop(b)
	}
}

// SegmentAdded counts a new segment of x's pool and stream: the first
// makes x one of its pool's owners.
func (x *Index) SegmentAdded() {
	if x.nSeg == 0 {
		x.owner = len(x.pool.owners)
		x.pool.owners = append(x.pool.owners, x)
	}
	x.nSeg++
}

// SegmentRemoved uncounts a released segment of x's pool and stream: the
// last takes x out of its pool's owners.
func (x *Index) SegmentRemoved() {
	x.nSeg--
	if x.nSeg == 0 {
		p := x.pool
		last := p.owners[len(p.owners)-1]
		p.owners[x.owner], last.owner = last, x.owner
		p.owners[len(p.owners)-1] = nil
		p.owners = p.owners[:len(p.owners)-1]
	}
}
