// This file holds the ways the allocator's tests break what this package
// keeps consistent, to show that the allocator's CheckInvariants finds
// each break. Nothing else calls them: they leave the allocator broken.

package freeindex

import "github.com/gpumem/gpumem/device"

// BreakFree points the segment at the free index x, which need not be of
// its pool and stream.
func (s *Segment) BreakFree(x *Index) { s.free = x }

// BreakPage sets the segment's mapping unit to page bytes.
func (s *Segment) BreakPage(page uint64) { s.page = page }

// BreakSize sets the block's size to size bytes.
func (b *Block) BreakSize(size uint64) { b.size = size }

// BreakPoolCopy flips the block's copy of its segment's pool (flagLarge),
// leaving the segment as it is.
func (b *Block) BreakPoolCopy() { b.flags ^= flagLarge }

// BreakIndexed clears the block's mark of being in its free index.
func (b *Block) BreakIndexed() { b.indexed = false }

// BreakKind sets the index's kind to k, leaving its structures as they
// are.
func (x *Index) BreakKind(k Kind) { x.kind = k }

// BreakArenaEnd moves the end of the arena x holds to n bytes past its
// start.
func (x *Index) BreakArenaEnd(n uint64) { x.arenaEnd = x.arena.ptr + device.Ptr(n) }
