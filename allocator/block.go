// This file holds blocks, segments and pools: the allocator's data
// structures, their invariants, and the free-block index of each pool.

package allocator

import (
	"slices"

	"github.com/google/btree"

	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/stats"
)

// A block is a contiguous range of a segment. The blocks of a segment tile
// it exactly, in address order, linked through prev and next. All fields
// are guarded by Allocator.mu, and so are the block's methods.
//
// A block is in exactly one of these states:
//
//   - allocated: handed to a caller; in Allocator.live under its address.
//   - pending: freed by the caller but recorded on other streams whose
//     work has not finished; eventCount > 0 events wait in
//     Allocator.events.
//   - free: cached, backed by memory; in its free index (indexed).
//   - unmapped: an address range of an expandable segment with no memory
//     behind it; in its pool's unmapped index.
//
// Invariants: two free neighbours never both exist (they are merged at
// once), nor two unmapped ones; a block's stream and pool are its
// segment's; size is a positive multiple of 512.
type block struct {
	// The free index's key comes first, so that comparing two blocks
	// touches one cache line of each.
	ptr       device.Ptr
	size      uint64 // bytes, a multiple of 512
	stream    device.Stream
	requested uint64 // bytes the caller asked for (allocated or pending blocks)
	pool      *pool
	seg       *segment
	prev      *block // lower neighbour in the segment, nil for the first block
	next      *block // higher neighbour in the segment, nil for the last block

	// gcCountBase is the pool's free-block search count when the block was
	// last filed in the free index; its age is the difference.
	gcCountBase int64

	// prevWhole and nextWhole link the block into its pool's list of whole
	// free segments while listed is set.
	prevWhole, nextWhole *block

	heapIdx int32 // position in its size bucket's heap (sizeBuckets), while indexed there

	allocated  bool
	indexed    bool  // in its free index: set and cleared by freeIndex.insert and remove only
	listed     bool  // in its free index's list of whole free segments (freeIndex.wholes)
	recorded   bool  // allocated and RecordStream added streams: they are in Allocator.uses
	unmapped   bool  // an address range of an expandable segment with no memory behind it
	eventCount int32 // outstanding stream events before a pending free completes
}

// isSplit reports whether the block shares its segment with other blocks.
func (b *block) isSplit() bool { return b.prev != nil || b.next != nil }

// busy reports whether the block is in use: allocated, or pending.
func (b *block) busy() bool { return b.allocated || b.eventCount != 0 }

// isFree reports whether the block is cached: not busy and backed by
// memory.
func (b *block) isFree() bool { return !b.busy() && !b.unmapped }

// mergesWith reports whether neighbour n merges with b, which is free or
// unmapped: n is not busy and of the same kind (free with free, unmapped
// with unmapped). PyTorch's try_merge_blocks.
func (b *block) mergesWith(n *block) bool {
	return n != nil && !n.busy() && n.unmapped == b.unmapped
}

// linkAfter puts n right after b in b's segment.
func (b *block) linkAfter(n *block) {
	n.prev, n.next = b, b.next
	if b.next != nil {
		b.next.prev = n
	}
	b.next = n
}

// linkBefore puts n right before b in b's segment.
func (b *block) linkBefore(n *block) {
	n.prev, n.next = b.prev, b
	if b.prev != nil {
		b.prev.next = n
	} else {
		b.seg.head = n
	}
	b.prev = n
}

// A segment is one device allocation, or one expandable segment: an
// address range reserved once and backed by memory page by page. Its
// fields are guarded by Allocator.mu.
//
// Invariant: the blocks from head to the last tile [ptr, ptr+size).
type segment struct {
	ptr    device.Ptr
	size   uint64
	stream device.Stream
	pool   *pool
	free   *freeIndex // the free index of the segment's pool and stream
	head   *block     // the block at ptr
	// page is the mapping unit of an expandable segment (2 MiB for the
	// small pool, 20 MiB for the large one); 0 for a plain segment.
	page uint64
}

// expandable reports whether the segment is an expandable segment.
func (s *segment) expandable() bool { return s.page != 0 }

// freeLess orders free blocks by (stream, size, address): a lower bound on
// (stream, size, 0) finds the best fit on a stream, and among blocks of
// equal size the lowest address. PyTorch 2.6 uses this order; later
// versions put a registration counter before the address. gpumem keeps
// the order per stream: each stream's free blocks have an index of their
// own (freeIndex), ordered by (size, address).
func freeLess(a, b *block) bool {
	if a.stream != b.stream {
		return a.stream < b.stream
	}
	if a.size != b.size {
		return a.size < b.size
	}
	return a.ptr < b.ptr
}

// addrLess orders blocks by (stream, address).
func addrLess(a, b *block) bool {
	if a.stream != b.stream {
		return a.stream < b.stream
	}
	return a.ptr < b.ptr
}

// A pool is one of the allocator's two sets of segments: small (blocks of
// at most 1 MiB, 2 MiB segments) or large. Its free blocks are indexed per
// stream (freeIndex, in each shard). Its fields are guarded by
// Allocator.mu.
//
// Invariant: unmapped holds exactly the pool's unmapped blocks, in
// addrLess order.
type pool struct {
	small bool
	idx   int // 0 for small, 1 for large: the pool's place in shard.free
	stat  stats.Pool
	// unmapped indexes the unmapped ranges of expandable segments; nil
	// without expandable segments.
	unmapped *btree.BTreeG[*block]

	// gcCalls counts best-fit searches while garbage collection is active
	// (PyTorch's get_free_blocks_call_count): the clock of block ages.
	gcCalls int64
}

func newPool(small, expandable bool) *pool {
	p := &pool{small: small, idx: 1, stat: stats.LargePool}
	if small {
		p.idx, p.stat = 0, stats.SmallPool
	}
	if expandable {
		p.unmapped = btree.NewG(32, addrLess)
	}
	return p
}

// A freeIndex holds the free blocks of one pool on one stream, ordered by
// (size, address), and the list of those that fill a plain segment. The
// small pool of plain segments keeps them in size buckets (sizeBuckets:
// the best fit by bit scans); the large pool, and pools of expandable
// segments, whose free blocks can be of any size, in a B+ tree (freeTree).
// Its fields are guarded by Allocator.mu.
//
// Invariants: the index holds exactly the pool's free blocks of its
// stream, each marked indexed. The blocks that fill a plain segment, the
// segments that releasing the cache returns to the device, are known
// without a walk of every cached block, so that a release costs what it
// releases: in size buckets they are the 2 MiB bucket (a small segment is
// 2 MiB); in a tree, wholes lists exactly them (marked listed).
type freeIndex struct {
	sh      *shard
	k       int // pool.idx
	pool    *pool
	stream  device.Stream
	buckets *sizeBuckets // the small pool of plain segments; nil otherwise
	tree    freeTree     // every other pool
	wholes  *block       // with a tree: head of the list of whole free segments, through nextWhole

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

func (x *freeIndex) init(sh *shard, p *pool, expandable bool) {
	x.sh, x.k, x.pool, x.stream = sh, p.idx, p, sh.stream
	if p.small && !expandable {
		x.buckets = new(sizeBuckets)
	}
}

// insert files a free block; in a tree it stamps its age base (garbage
// collection ages the large pool's blocks only).
func (x *freeIndex) insert(b *block) {
	b.indexed = true
	if x.buckets != nil {
		x.buckets.insert(b)
		return
	}
	b.gcCountBase = x.pool.gcCalls
	x.tree.insert(b)
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
	x.tree.remove(b)
	if b.listed {
		x.unlist(b)
	}
}

// rekey moves b, a free block filed in x's tree under old, to its current
// key, and stamps its age base as filing it anew would.
func (x *freeIndex) rekey(b *block, old treeKey) {
	b.gcCountBase = x.pool.gcCalls
	x.tree.rekey(b, old)
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
	if bk := x.buckets; bk != nil {
		k := keyOf(b)
		b.ptr, b.size = old.ptr, old.size
		bk.remove(b)
		b.ptr, b.size = k.ptr, k.size
		bk.insert(b)
		return
	}
	x.tree.rekey(b, old)
}

// settleAllLocked settles every free index, before a walk or a change of
// more than one index, and lets go of the structs kept for the next split.
func (a *Allocator) settleAllLocked() {
	for _, sh := range a.shards {
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

// bestFit returns the free block of the lowest (size, address) with at
// least size bytes, or nil.
func (x *freeIndex) bestFit(size uint64) *block {
	if x.buckets != nil {
		return x.buckets.bestFit(size)
	}
	return x.tree.lowerBound(size)
}

// largest returns a free block of the largest size, or nil.
func (x *freeIndex) largest() *block {
	if x.buckets != nil {
		return x.buckets.last()
	}
	return x.tree.max()
}

// len returns the number of free blocks.
func (x *freeIndex) len() int {
	if x.buckets != nil {
		return x.buckets.n
	}
	return x.tree.n
}

// each calls f on every free block until f returns false: in (size,
// address) order from a tree, by size from buckets.
func (x *freeIndex) each(f func(*block) bool) {
	if x.buckets != nil {
		x.buckets.each(f)
	} else {
		x.tree.ascend(f)
	}
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
	}
	x.wholes = b
}

func (x *freeIndex) unlist(b *block) {
	if b.prevWhole != nil {
		b.prevWhole.nextWhole = b.nextWhole
	} else {
		x.wholes = b.nextWhole
	}
	if b.nextWhole != nil {
		b.nextWhole.prevWhole = b.prevWhole
	}
	b.listed, b.prevWhole, b.nextWhole = false, nil, nil
}

// wholeSegmentsLocked appends the whole free segments of pool p on every
// stream to list, in (stream, size, address) order (the order PyTorch
// releases them in), and returns it.
func (a *Allocator) wholeSegmentsLocked(p *pool, list []*block) []*block {
	for _, sh := range a.shards {
		n := len(list)
		list = sh.free[p.idx].appendWholes(list)
		slices.SortFunc(list[n:], func(x, y *block) int {
			if freeLess(x, y) {
				return -1
			}
			return 1
		})
	}
	return list
}

// newBlockLocked returns a zeroed block struct of shard sh, recycled
// when possible. New structs come in slabs of blockSlab, so that blocks
// created together sit together in memory.
func (sh *shard) newBlockLocked() *block {
	b := sh.spare
	if b == nil {
		return sh.newSlabLocked()
	}
	sh.spare, b.next = b.next, nil
	sh.nspare--
	return b
}

// newSlabLocked makes blockSlab block structs, keeps all but the first as
// spares and returns the first.
func (sh *shard) newSlabLocked() *block {
	slab := make([]block, blockSlab)
	for i := 1; i < blockSlab-1; i++ {
		slab[i].next = &slab[i+1]
	}
	sh.spare = &slab[1]
	sh.nspare += blockSlab - 1
	return &slab[0]
}

const (
	blockSlab = 64
	maxSpare  = 4096 // spare block structs kept at most, per shard
)

// recycleLocked keeps a dead block struct of shard sh for reuse, linked
// through next.
func (sh *shard) recycleLocked(b *block) {
	if sh.nspare >= maxSpare {
		*b = block{}
		return
	}
	*b = block{next: sh.spare}
	sh.spare = b
	sh.nspare++
}
