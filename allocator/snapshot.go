// This file holds the allocator snapshot (every segment and its blocks)
// and the largest free block.

package allocator

import (
	"slices"

	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/stats"
)

// BlockState is the state of a block in a snapshot.
type BlockState uint8

// Block states, named as PyTorch's snapshots name them.
const (
	// BlockFree: cached, free for reuse ("inactive").
	BlockFree BlockState = iota
	// BlockAllocated: handed to a caller ("active_allocated").
	BlockAllocated
	// BlockPendingFree: freed by the caller, but waiting for the work of
	// other streams it was recorded on ("active_pending_free").
	BlockPendingFree
)

// String returns PyTorch's name for the state.
func (s BlockState) String() string {
	switch s {
	case BlockFree:
		return "inactive"
	case BlockAllocated:
		return "active_allocated"
	case BlockPendingFree:
		return "active_pending_free"
	}
	return "unknown"
}

// BlockInfo describes one block of a segment.
type BlockInfo struct {
	Ptr       device.Ptr
	Size      uint64
	Requested uint64 // bytes asked for; 0 for free blocks
	State     BlockState
}

// SegmentInfo describes one segment (one device allocation) and its blocks
// in address order.
type SegmentInfo struct {
	Ptr       device.Ptr
	Size      uint64        // total bytes
	Allocated uint64        // bytes in allocated blocks
	Active    uint64        // bytes in allocated and pending blocks
	Requested uint64        // bytes asked for, over active blocks
	Stream    device.Stream // the stream the segment was allocated for
	Pool      stats.Pool    // stats.SmallPool or stats.LargePool
	// PoolID is the id of the named pool that holds the segment
	// (Pool.ID), 0 for the default pool: PyTorch's segment_pool_id.
	PoolID uint64
	// Expandable marks a mapped range of an expandable segment; each
	// contiguous mapped range is reported as a segment of its own.
	Expandable bool
	Blocks     []BlockInfo
}

// Snapshot returns every segment the allocator holds, in address order,
// with its blocks (PyTorch's memory_snapshot). A paused pool's segments
// (PausePool) are listed as they are when it is resumed: their pages are
// unmapped, their blocks keep their states. It holds the allocator's
// lock while it copies, which takes time proportional to the number of
// blocks.
func (a *Allocator) Snapshot() []SegmentInfo {
	if !a.made() {
		return nil
	}
	a.lockAll()
	defer a.unlockAll()
	segs := make([]SegmentInfo, 0, len(a.segments))
	for _, s := range a.segments {
		s.Free().Unhold() // the block from before the split, as one
		// An expandable segment is reported as one segment per run of
		// mapped blocks, as PyTorch reports it.
		var info *SegmentInfo
		for b := s.Head(); b != nil; b = b.Next() {
			if b.Unmapped() {
				info = nil
				continue
			}
			if info == nil {
				segs = append(segs, SegmentInfo{Ptr: b.Ptr(), Stream: s.Stream(), Pool: s.Pool().Stat(), PoolID: a.poolIDOf(s.Free()), Expandable: s.Expandable()})
				info = &segs[len(segs)-1]
			}
			bi := BlockInfo{Ptr: b.Ptr(), Size: b.Size(), Requested: b.Requested}
			switch {
			case b.Allocated:
				bi.State = BlockAllocated
				info.Allocated += b.Size()
			case !b.IsFree():
				bi.State = BlockPendingFree
			}
			if bi.State != BlockFree {
				info.Active += b.Size()
				info.Requested += b.Requested
			}
			info.Size += b.Size()
			info.Blocks = append(info.Blocks, bi)
		}
	}
	slices.SortFunc(segs, func(x, y SegmentInfo) int {
		switch {
		case x.Ptr < y.Ptr:
			return -1
		case x.Ptr > y.Ptr:
			return 1
		}
		return 0
	})
	return segs
}

// LargestFreeBlock returns the size of the largest cached free block.
func (a *Allocator) LargestFreeBlock() uint64 {
	if !a.made() {
		return 0
	}
	a.lockAll()
	defer a.unlockAll()
	a.settleAllLocked()
	return a.largestFreeLocked()
}
