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
//   - free: cached, backed by memory; in its pool's free index (indexed).
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

	allocated  bool
	indexed    bool   // in its pool's free index: set and cleared by pool.insert and pool.remove only
	listed     bool   // in its pool's list of whole free segments (pool.wholes)
	recorded   bool   // allocated and RecordStream added streams: they are in Allocator.uses
	unmapped   bool   // an address range of an expandable segment with no memory behind it
	eventCount int32  // outstanding stream events before a pending free completes
	phase      uint16 // the phase current when the block was handed out (Allocator.phases)
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
	head   *block // the block at ptr
	// page is the mapping unit of an expandable segment (2 MiB for the
	// small pool, 20 MiB for the large one); 0 for a plain segment.
	page uint64
}

// expandable reports whether the segment is an expandable segment.
func (s *segment) expandable() bool { return s.page != 0 }

// freeLess orders free blocks by (stream, size, address): a lower bound on
// (stream, size, 0) finds the best fit on a stream, and among blocks of
// equal size the lowest address. PyTorch 2.6 uses this order; later
// versions put a registration counter before the address.
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
// at most 1 MiB, 2 MiB segments) or large. Its fields are guarded by
// Allocator.mu, and so are its methods.
//
// Invariants: free holds exactly the pool's free blocks, in freeLess
// order; unmapped holds exactly its unmapped blocks, in addrLess order;
// wholes lists exactly the free blocks that fill a plain segment, the
// segments that releasing the cache returns to the device, so that a
// release costs what it releases, not a walk of every cached block.
type pool struct {
	small  bool
	stat   stats.Pool
	free   *btree.BTreeG[*block]
	wholes *block // head of the list of whole free segments, through nextWhole
	// unmapped indexes the unmapped ranges of expandable segments; nil
	// without expandable segments.
	unmapped *btree.BTreeG[*block]

	// gcCalls counts best-fit searches while garbage collection is active
	// (PyTorch's get_free_blocks_call_count): the clock of block ages.
	gcCalls int64
}

func newPool(small, expandable bool) *pool {
	p := &pool{small: small, stat: stats.LargePool, free: btree.NewG(32, freeLess)}
	if small {
		p.stat = stats.SmallPool
	}
	if expandable {
		p.unmapped = btree.NewG(32, addrLess)
	}
	return p
}

// insert files a free block in the free index and stamps its age base.
func (p *pool) insert(b *block) {
	b.gcCountBase = p.gcCalls
	b.indexed = true
	p.free.ReplaceOrInsert(b)
	p.relist(b)
}

// remove takes a free block out of the free index.
func (p *pool) remove(b *block) {
	p.free.Delete(b)
	b.indexed = false
	p.relist(b)
}

// relist puts b in the list of whole free segments, or takes it out, as
// it now is or is not one. Every change to a filed block's neighbours or
// index membership ends with it.
func (p *pool) relist(b *block) {
	whole := b.indexed && !b.isSplit() && !b.seg.expandable()
	switch {
	case whole && !b.listed:
		b.listed, b.prevWhole, b.nextWhole = true, nil, p.wholes
		if p.wholes != nil {
			p.wholes.prevWhole = b
		}
		p.wholes = b
	case !whole && b.listed:
		if b.prevWhole != nil {
			b.prevWhole.nextWhole = b.nextWhole
		} else {
			p.wholes = b.nextWhole
		}
		if b.nextWhole != nil {
			b.nextWhole.prevWhole = b.prevWhole
		}
		b.listed, b.prevWhole, b.nextWhole = false, nil, nil
	}
}

// wholeSegments appends the blocks of the list of whole free segments to
// list, in free-index order (the order PyTorch releases them in), and
// returns it.
func (p *pool) wholeSegments(list []*block) []*block {
	n := len(list)
	for b := p.wholes; b != nil; b = b.nextWhole {
		list = append(list, b)
	}
	slices.SortFunc(list[n:], func(x, y *block) int {
		if freeLess(x, y) {
			return -1
		}
		return 1
	})
	return list
}

// file puts a free block in the free index, an unmapped one in the
// unmapped index.
func (p *pool) file(b *block) {
	if b.unmapped {
		p.unmapped.ReplaceOrInsert(b)
	} else {
		p.insert(b)
	}
}

// unfile takes a block out of the index file put it in.
func (p *pool) unfile(b *block) {
	if b.unmapped {
		p.unmapped.Delete(b)
	} else {
		p.remove(b)
	}
}

// keepsPlace reports whether x, filed in an index, keeps its place there
// when it absorbs a neighbour (its size grows; absorbing the block before
// it also lowers its address). In the unmapped index, ordered by address,
// it always does: no other range lies between x and its neighbour. In the
// free index it does when x is the largest block. A search for x's
// successor would tell in more cases, but fails most of the time and then
// costs more than the delete and insert it tries to save.
func (p *pool) keepsPlace(x *block) bool {
	if x.unmapped {
		return true
	}
	last, _ := p.free.Max()
	return last == x
}

// newBlockLocked returns a zeroed block struct, recycled when possible.
// New structs come in slabs of blockSlab, so that blocks created together
// sit together in memory, which helps the free index's comparisons.
func (a *Allocator) newBlockLocked() *block {
	if len(a.spare) == 0 {
		slab := make([]block, blockSlab)
		for i := range slab {
			a.spare = append(a.spare, &slab[len(slab)-1-i])
		}
	}
	n := len(a.spare)
	b := a.spare[n-1]
	a.spare[n-1] = nil
	a.spare = a.spare[:n-1]
	return b
}

const blockSlab = 64

// recycleLocked keeps a dead block struct for reuse.
func (a *Allocator) recycleLocked(b *block) {
	*b = block{}
	if len(a.spare) < 4096 {
		a.spare = append(a.spare, b)
	}
}
