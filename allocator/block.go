// This file holds blocks, segments and the free-block index of one pool.

package allocator

import (
	"github.com/google/btree"

	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/stats"
)

// A block is a contiguous range of a segment. The blocks of a segment tile
// it exactly, in address order, linked through prev and next. All fields
// are guarded by Allocator.mu.
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
	// last inserted into the free index; its age is the difference.
	gcCountBase int64

	allocated  bool
	recorded   bool  // RecordStream added streams: they are in Allocator.uses
	unmapped   bool  // an address range of an expandable segment with no memory behind it
	eventCount int32 // outstanding stream events before the free completes
}

// isSplit reports whether the block shares its segment with other blocks.
func (b *block) isSplit() bool { return b.prev != nil || b.next != nil }

// isFree reports whether the block is cached: not allocated, not waiting
// for stream events, and backed by memory.
func (b *block) isFree() bool {
	return !b.allocated && b.eventCount == 0 && !b.recorded && !b.unmapped
}

// available reports whether the block is not in use: free, or an unmapped
// range of an expandable segment (PyTorch's "allocatable").
func (b *block) available() bool {
	return b != nil && !b.allocated && b.eventCount == 0 && !b.recorded
}

// A segment is one device allocation, or one expandable segment: an
// address range reserved once and backed by memory page by page.
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

// A pool is one of the allocator's two sets of segments: small (blocks of at
// most 1 MiB, 2 MiB segments) or large. Its free blocks are indexed by
// freeLess in a B-tree.
type pool struct {
	small bool
	stat  stats.Pool
	free  *btree.BTreeG[*block]
	// unmapped indexes the unmapped ranges of expandable segments by
	// (stream, address); nil without expandable segments.
	unmapped *btree.BTreeG[*block]

	// gcCalls counts best-fit searches while garbage collection is active
	// (PyTorch's get_free_blocks_call_count): the clock of block ages.
	gcCalls int64
}

// addrLess orders blocks by (stream, address).
func addrLess(a, b *block) bool {
	if a.stream != b.stream {
		return a.stream < b.stream
	}
	return a.ptr < b.ptr
}

func newPool(small bool) *pool {
	p := &pool{small: small, stat: stats.LargePool, free: btree.NewG(32, freeLess)}
	if small {
		p.stat = stats.SmallPool
	}
	return p
}

// insert adds a free block to the index and stamps its age base.
func (p *pool) insert(b *block) {
	b.gcCountBase = p.gcCalls
	p.free.ReplaceOrInsert(b)
}

// remove takes a free block out of the index.
func (p *pool) remove(b *block) {
	p.free.Delete(b)
}
