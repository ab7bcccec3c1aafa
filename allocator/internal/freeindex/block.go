// This file holds blocks, segments and pools: the allocator's data
// structures and their invariants (the free indexes are in index.go, which
// alone files blocks in them), the making of segments and the splitting
// of their blocks as pages are mapped and unmapped, and the recycling of
// block structs.

package freeindex

import (
	"github.com/google/btree"

	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/stats"
)

// A Block is a contiguous range of a segment. The blocks of a segment tile
// it exactly, in address order, linked through prev and next. All fields
// are guarded by the lock of its segment's shard (or the world), and so
// are the block's methods.
//
// Whose fields: the unexported ones (address, size, stream, pool,
// segment, neighbours, indexed, unmapped, age base, the list and heap
// links) are this package's, which alone writes them; the allocator reads
// them through the methods of their names. The exported ones are the
// allocator's bookkeeping of a block it handed out, which it alone
// writes: Requested, Allocated, Phase, EventCount and Uses. This
// package reads them only to merge free blocks alone (Busy) and in its
// checks, and zeroes the struct of a block that no longer exists.
//
// A block is in exactly one of these states:
//
//   - allocated: handed to a caller; in its shard's address table (live)
//     under its address.
//   - pending: freed by the caller but recorded on other streams whose
//     work has not finished; EventCount > 0 events wait in
//     the allocator's events queue.
//   - free: cached, backed by memory; in its free index (indexed).
//   - unmapped: an address range of an expandable segment with no memory
//     behind it; in its pool's unmapped index.
//
// Invariants: two free neighbours never both exist (they are merged at
// once), nor two unmapped ones; a block's stream and pool are its
// segment's; size is a positive multiple of 512.
type Block struct {
	// The first 64 bytes are what a search, a split, a free and a merge
	// read of a block and its neighbours; a block is 128 bytes, made in
	// groups of four that Go places at a multiple of 512 (Spares.slab),
	// so they are one cache line. The free index's key comes first, so
	// that comparing two blocks reads 16 bytes of each.
	ptr       device.Ptr
	size      uint64 // bytes, a multiple of 512
	prev      *Block // lower neighbour in the segment, nil for the first block
	next      *Block // higher neighbour in the segment, nil for the last block
	seg       *Segment
	Requested uint64 // bytes the caller asked for (allocated or pending blocks)

	heapIdx    int32 // position in its size class's heap (sizeBuckets, largeBuckets), while indexed there
	EventCount int32 // outstanding stream events before a pending free completes
	Uses       int32 // 1 + the index of the allocator's record of the streams RecordStream added; 0 for none: the block is recorded (RecordStream added streams) exactly when Uses is not 0
	Allocated  bool
	indexed    bool // in its free index: set and cleared by the free index alone (add, drop, put, unfile, take)
	unmapped   bool // an address range of an expandable segment with no memory behind it
	// flags holds flagGrows, kept where links and unmapped change, and
	// a copy of its segment's pool and kind (setSeg), so that a free and a
	// hand-out learn the segment's free index and kind from b's first
	// line alone, without reading the segment.
	flags uint8

	// The second cache line: what only the hand-out writes, blocks
	// counted by phase read, and the aging of free blocks and the list
	// of whole segments use. listed is read only of a block that fills
	// its segment (every listed one does), so that the merge's
	// neighbours are read in their first line alone.
	listed bool   // in its free index's list of whole free segments (Index.wholes)
	Lent   bool   // allocated to Borrower, a stream other than its own (the allocator's cross-stream lending); the allocator sets and clears it
	Phase  uint16 // the phase current when the block was handed out (the allocator's phases); written by the allocator's hand-out while blocks are counted by phase, 0 before
	stream device.Stream
	pool   *Pool

	// gcCountBase is the pool's free-block search count (Pool.GCCalls)
	// when the block was last filed in the free index; its age is the
	// difference.
	gcCountBase int64

	// prevWhole and nextWhole link the block into its pool's list of whole
	// free segments while listed is set.
	prevWhole, nextWhole *Block

	Borrower device.Stream // the stream a Lent block was lent to

	_ [8]byte // to 128 bytes
}

// Ptr is the block's address.
func (b *Block) Ptr() device.Ptr { return b.ptr }

// Size is the block's size in bytes, a multiple of 512.
func (b *Block) Size() uint64 { return b.size }

// Stream is the stream of the block's segment.
func (b *Block) Stream() device.Stream { return b.stream }

// Pool is the pool of the block's segment.
func (b *Block) Pool() *Pool { return b.pool }

// Seg is the block's segment.
func (b *Block) Seg() *Segment { return b.seg }

// Prev is the block's lower neighbour in its segment, nil for the first.
func (b *Block) Prev() *Block { return b.prev }

// Next is the block's higher neighbour in its segment, nil for the last.
func (b *Block) Next() *Block { return b.next }

// Indexed reports whether the block is in its free index.
func (b *Block) Indexed() bool { return b.indexed }

// Unmapped reports whether the block is an address range of an expandable
// segment with no memory behind it.
func (b *Block) Unmapped() bool { return b.unmapped }

// GCCountBase is the pool's count of free-block searches (Pool.GCCalls)
// when the block was last filed in the free index: its age is the
// difference.
func (b *Block) GCCountBase() int64 { return b.gcCountBase }

// IsSplit reports whether the block shares its segment with other blocks.
func (b *Block) IsSplit() bool { return b.prev != nil || b.next != nil }

// Busy reports whether the block is in use: allocated, or pending.
func (b *Block) Busy() bool { return b.Allocated || b.EventCount != 0 }

// IsFree reports whether the block is cached: not busy and backed by
// memory.
func (b *Block) IsFree() bool { return !b.Busy() && !b.unmapped }

// linkAfter puts n right after b in b's segment (grows follows, with the
// blocks' unmapped as they are now).
func (b *Block) linkAfter(n *Block) {
	n.prev, n.next = b, b.next
	n.growsAs(b)
	if b.next != nil {
		b.next.prev = n
	}
	b.next = n
	b.setGrows(n.unmapped)
}

// linkBefore puts n right before b in b's segment (grows follows, with
// the blocks' unmapped as they are now).
func (b *Block) linkBefore(n *Block) {
	n.prev, n.next = b.prev, b
	n.setGrows(b.unmapped)
	if b.prev != nil {
		b.prev.next = n
		if n.unmapped != b.unmapped { // else its grows stays
			b.prev.setGrows(n.unmapped)
		}
	} else {
		b.seg.head = n
	}
	b.prev = n
}

// setUnmapped sets b's unmapped, and the grows of the block before it.
func (b *Block) setUnmapped(u bool) {
	b.unmapped = u
	if b.prev != nil {
		b.prev.setGrows(u)
	}
}

// A Segment is one device allocation, or one expandable segment: an
// address range reserved once and backed by memory page by page, made by
// Index.NewSegment. Its fields belong to this package, which alone writes
// them; the allocator reads them through the methods of their names. The
// head is guarded by the lock of its shard (or the world); ptr, size,
// stream, pool, free and page never change.
//
// Invariant: the blocks from head to the last tile [ptr, ptr+size).
type Segment struct {
	ptr    device.Ptr
	size   uint64
	stream device.Stream
	pool   *Pool
	free   *Index // the free index of the segment's pool and stream
	head   *Block // the block at ptr
	// page is the mapping unit of an expandable segment (2 MiB for the
	// small pool, 20 MiB for the large one); 0 for a plain segment.
	page uint64
}

// The bits of a block's flags. The first two are its segment's pool and
// kind, copied (setSeg, sameSeg); flagGrows is the block's own.
const (
	flagLarge      = 1 << iota // the segment's pool is the large one (Pool.Idx 1)
	flagExpandable             // the segment is expandable (Segment.Expandable)
	flagGrows                  // the next block is an unmapped range (CanGrow)

	segFlags = flagLarge | flagExpandable
)

// setSeg makes seg b's segment, with the copy of its pool and kind, for
// a segment's first block, which has no neighbours (grows is cleared).
func (b *Block) setSeg(seg *Segment) {
	f := uint8(seg.pool.idx & 1) // flagLarge
	if seg.page != 0 {
		f |= flagExpandable
	}
	b.seg, b.flags = seg, f
}

// sameSeg makes o's segment b's, with the copy of its flags taken from o,
// so that the segment is not read. b's grows is cleared: the caller links
// b among o's segment's blocks (linkAfter, linkBefore), which sets it.
func (b *Block) sameSeg(o *Block) { b.seg, b.flags = o.seg, o.flags&segFlags }

// growsAs sets b's grows to o's: b takes o's place before o's next block.
func (b *Block) growsAs(o *Block) { b.flags = b.flags&^flagGrows | o.flags&flagGrows }

// grows reports whether the next block is an unmapped range.
func (b *Block) grows() bool { return b.flags&flagGrows != 0 }

// setGrows sets whether the next block is an unmapped range.
func (b *Block) setGrows(g bool) {
	if g {
		b.flags |= flagGrows
	} else {
		b.flags &^= flagGrows
	}
}

// PoolIdx is the Idx of b's pool (b.Seg().Pool().Idx()), read from b's
// first cache line alone.
func (b *Block) PoolIdx() int { return int(b.flags & flagLarge) }

// SegExpandable reports whether b's segment is expandable
// (b.Seg().Expandable()), read from b's first cache line alone.
func (b *Block) SegExpandable() bool { return b.flags&flagExpandable != 0 }

// NewSegment makes a segment of x's pool and stream, size bytes at ptr
// obtained from the device, expandable with pages of page bytes when page
// is not 0, and returns its one block: for a plain segment a free block in
// no index (the caller hands it out or files it), for an expandable one an
// unmapped range, filed in the pool's unmapped index. The caller counts
// the segment (SegmentAdded).
func (x *Index) NewSegment(ptr device.Ptr, size, page uint64) *Block {
	seg := &Segment{ptr: ptr, size: size, stream: x.stream, pool: x.pool, free: x, page: page}
	b := x.spares.get()
	b.ptr, b.size, b.stream, b.pool = ptr, size, x.stream, x.pool
	b.setSeg(seg)
	seg.head = b
	if page != 0 {
		b.unmapped = true
		x.pool.unmapped.ReplaceOrInsert(b)
	}
	return b
}

// Ptr is the segment's address.
func (s *Segment) Ptr() device.Ptr { return s.ptr }

// Size is the segment's size in bytes.
func (s *Segment) Size() uint64 { return s.size }

// Stream is the stream the segment belongs to.
func (s *Segment) Stream() device.Stream { return s.stream }

// Pool is the pool the segment belongs to.
func (s *Segment) Pool() *Pool { return s.pool }

// Free is the free index of the segment's pool and stream.
func (s *Segment) Free() *Index { return s.free }

// Head is the segment's first block, at its address.
func (s *Segment) Head() *Block { return s.head }

// Page is the mapping unit of an expandable segment, 0 for a plain one.
func (s *Segment) Page() uint64 { return s.page }

// Expandable reports whether the segment is an expandable segment.
func (s *Segment) Expandable() bool { return s.page != 0 }

// FreeLess orders free blocks by (stream, size, address): a lower bound on
// (stream, size, 0) finds the best fit on a stream, and among blocks of
// equal size the lowest address. PyTorch 2.6 uses this order; later
// versions put a registration counter before the address. gpumem keeps
// the order per stream: each stream's free blocks have an index of their
// own (Index), ordered by (size, address).
func FreeLess(a, b *Block) bool {
	if a.stream != b.stream {
		return a.stream < b.stream
	}
	if a.size != b.size {
		return a.size < b.size
	}
	return a.ptr < b.ptr
}

// addrLess orders blocks by (stream, address).
func addrLess(a, b *Block) bool {
	if a.stream != b.stream {
		return a.stream < b.stream
	}
	return a.ptr < b.ptr
}

// A Pool is one of the allocator's two sets of segments: small (blocks of
// at most 1 MiB, 2 MiB segments) or large. Its free blocks are indexed per
// stream (Index, in each shard). Its fields change in the world, but
// GCCalls, the clock of block ages, which every search that counts in it
// changes: in the world, or under the low_fragmentation policy on the fast
// path of the default stream's shard while it is the only shard (then no
// other shard, and so no other lock holder, uses the pool).
//
// Whose fields: the unexported ones are this package's, which alone
// writes them (small, idx and stat never change after NewPool); the
// allocator reads them through Small, Idx, Stat, Expandable, Cold,
// NumOwners, Owners and the walks of the unmapped ranges. GCCalls is the
// allocator's: it counts its searches there, and this package reads it to
// stamp the blocks it files.
//
// Invariants: unmapped holds exactly the pool's unmapped blocks, in
// addrLess order; owners holds exactly the free indexes of the pool that
// have segments (Index.NSeg), so that a walk of the pool's free
// blocks on every stream costs the streams that hold memory, not every
// stream there ever was.
type Pool struct {
	small bool
	idx   int // 0 for small, 1 for large: the pool's place in shard.free
	stat  stats.Pool
	// unmapped indexes the unmapped ranges of expandable segments; nil
	// without expandable segments.
	unmapped *btree.BTreeG[*Block]
	owners   []*Index // in no order
	cold     ColdView // the free blocks of the cold shard's streams (cold.go)

	// GCCalls counts best-fit searches while garbage collection or the
	// low_fragmentation policy is active (PyTorch's
	// get_free_blocks_call_count): the clock of block ages.
	GCCalls int64

	key Block // AscendUnmapped's search key (scratch)
}

func NewPool(small, expandable bool) *Pool {
	p := &Pool{small: small, idx: 1, stat: stats.LargePool}
	if small {
		p.idx, p.stat = 0, stats.SmallPool
	}
	if expandable {
		p.unmapped = btree.NewG(32, addrLess)
	}
	return p
}

// Small reports whether p is the small pool.
func (p *Pool) Small() bool { return p.small }

// Idx is p's place among the allocator's pools: 0 for small, 1 for large.
func (p *Pool) Idx() int { return p.idx }

// Stat is p's pool in the statistics.
func (p *Pool) Stat() stats.Pool { return p.stat }

// Expandable reports whether p's segments are expandable segments.
func (p *Pool) Expandable() bool { return p.unmapped != nil }

// Cold is p's view of the cold shard's free blocks.
func (p *Pool) Cold() *ColdView { return &p.cold }

// NumOwners is the number of free indexes of p that have segments.
func (p *Pool) NumOwners() int { return len(p.owners) }

// Owners returns the free indexes of p that have segments, in no order:
// p's own slice, for reading, valid until a segment of p is added or
// removed (SegmentAdded, SegmentRemoved).
func (p *Pool) Owners() []*Index { return p.owners }

// AscendUnmapped calls f on the unmapped ranges of p on stream s, in
// address order, while f returns true.
func (p *Pool) AscendUnmapped(s device.Stream, f func(u *Block) bool) {
	p.key.stream, p.key.ptr = s, 0
	p.unmapped.AscendGreaterOrEqual(&p.key, func(u *Block) bool {
		return u.stream == s && f(u)
	})
}

// EachUnmapped calls f on every unmapped range of p, in (stream, address)
// order, while f returns true.
func (p *Pool) EachUnmapped(f func(u *Block) bool) {
	if p.unmapped != nil {
		p.unmapped.Ascend(f)
	}
}

// HasUnmapped reports whether u is in p's unmapped index.
func (p *Pool) HasUnmapped(u *Block) bool { return p.unmapped != nil && p.unmapped.Has(u) }

// UnmappedLen is the number of unmapped ranges in p's unmapped index.
func (p *Pool) UnmappedLen() int {
	if p.unmapped == nil {
		return 0
	}
	return p.unmapped.Len()
}

// Spares are the recycled block structs of one shard, linked through
// next; guarded by its lock.
type Spares struct {
	head *Block
	n    int
}

// get returns a zeroed block struct, recycled when possible. New structs
// come in slabs of blockSlab, so that blocks created together sit
// together in memory.
func (sp *Spares) get() *Block {
	b := sp.head
	if b == nil {
		return sp.slab()
	}
	sp.head, b.next = b.next, nil
	sp.n--
	return b
}

// slab makes blockSlab block structs, keeps all but the first as spares
// and returns the first. They are made in groups of blockGroup, 512
// bytes: Go lays an object of that size with no header, at an address
// that is a multiple of 512, so that every block starts a cache line
// (a larger object that holds pointers starts with an 8-byte header,
// which would put every block's first 64 bytes across two lines).
func (sp *Spares) slab() *Block {
	var head *Block
	for range blockSlab / blockGroup {
		g := new([blockGroup]Block)
		for i := range blockGroup - 1 {
			g[i].next = &g[i+1]
		}
		g[blockGroup-1].next = head
		head = &g[0]
	}
	sp.head = head.next
	head.next = nil
	sp.n += blockSlab - 1
	return head
}

const (
	blockSlab  = 64
	blockGroup = 4    // 512 bytes of blocks
	maxSpare   = 4096 // spare block structs kept at most, per shard
)

// put keeps a dead block struct for reuse, linked through next.
func (sp *Spares) put(b *Block) {
	if sp.n >= maxSpare {
		*b = Block{}
		return
	}
	*b = Block{next: sp.head}
	sp.head = b
	sp.n++
}

// MappedRuns calls f on each run of mapped pages of the expandable
// segment seg, in address order: the ranges between its unmapped blocks,
// which start and end on page boundaries.
func (seg *Segment) MappedRuns(f func(p device.Ptr, n uint64)) {
	pos := seg.ptr
	for b := seg.head; b != nil; b = b.next {
		if b.unmapped {
			if b.ptr > pos {
				f(pos, uint64(b.ptr-pos))
			}
			pos = b.ptr + device.Ptr(b.size)
		}
	}
	if end := seg.ptr + device.Ptr(seg.size); end > pos {
		f(pos, uint64(end-pos))
	}
}

// MapPages makes the n bytes at offset off of the unmapped range u, pages
// the caller just mapped, a block of their own, backed by memory and in no
// index, and returns it; the parts of u before and after them stay
// unmapped ranges, in the pool's unmapped index. The caller files the
// block (Put), which merges it with its free neighbours. x is the index of
// u's segment.
func (x *Index) MapPages(u *Block, off, n uint64) *Block {
	p := u.pool
	p.unmapped.Delete(u)
	if off > 0 {
		head := x.spares.get()
		head.ptr, head.size, head.stream, head.pool, head.unmapped = u.ptr, off, u.stream, p, true
		head.sameSeg(u)
		u.linkBefore(head)
		p.unmapped.ReplaceOrInsert(head)
		u.ptr, u.size = u.ptr+device.Ptr(off), u.size-off
	}
	if n < u.size {
		rest := x.spares.get()
		rest.ptr, rest.size, rest.stream, rest.pool, rest.unmapped = u.ptr+device.Ptr(n), u.size-n, u.stream, p, true
		rest.sameSeg(u)
		u.linkAfter(rest)
		p.unmapped.ReplaceOrInsert(rest)
		u.size = n
	}
	u.setUnmapped(false)
	return u
}

// UnmapPages makes the n bytes at ptr inside the free block b of x, whole
// pages the caller just unmapped, an unmapped range, in no index, and
// returns it; the free bytes of b before and after them stay free blocks,
// filed in x. The caller files the range (Put), which merges it with its
// unmapped neighbours.
func (x *Index) UnmapPages(b *Block, ptr device.Ptr, n uint64) *Block {
	x.Remove(b)
	if before := uint64(ptr - b.ptr); before > 0 {
		f := x.spares.get()
		f.ptr, f.size, f.stream, f.pool = b.ptr, before, b.stream, b.pool
		f.sameSeg(b)
		b.linkBefore(f)
		x.Insert(f)
	}
	if after := b.size - uint64(ptr-b.ptr) - n; after > 0 {
		f := x.spares.get()
		f.ptr, f.size, f.stream, f.pool = ptr+device.Ptr(n), after, b.stream, b.pool
		f.sameSeg(b)
		b.linkAfter(f)
		x.Insert(f)
	}
	b.ptr, b.size = ptr, n
	b.setUnmapped(true)
	return b
}

// ForgetSegment takes b, the one block of a segment of x released to the
// device, free or an unmapped range, out of its index (or its pool's
// unmapped index) and keeps its struct for reuse. The caller uncounts the
// segment (SegmentRemoved).
func (x *Index) ForgetSegment(b *Block) {
	if b.unmapped {
		x.pool.unmapped.Delete(b)
	} else {
		x.Remove(b)
	}
	x.spares.put(b)
}
