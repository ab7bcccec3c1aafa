// This file holds the ledger: the one place where the allocator's
// statistics change and its observers hear of it. Every state change that
// a stat counts or an observer sees goes through one method here, which
// updates the stats and notifies the observers together, so that the two
// can never disagree.

package allocator

import (
	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/stats"
)

// segmentAllocatedLocked records a plain segment obtained from the
// device (segment_alloc).
func (a *Allocator) segmentAllocatedLocked(seg *segment) {
	st, n := seg.pool.stat, int64(seg.size)
	a.st.of(stats.Segment).increase(st, 1)
	a.st.of(stats.ReservedBytes).increase(st, n)
	if a.rule.oversize(seg.size) {
		a.st.oversizeSegments.Increase(1)
	}
	a.st.numDeviceAlloc++
	if len(a.observers) > 0 {
		a.notifyLocked(Action{Kind: ActionSegmentAlloc, Ptr: seg.ptr, Size: seg.size, Stream: seg.stream})
	}
}

// segmentFreedLocked records a plain segment returned to the device
// (segment_free).
func (a *Allocator) segmentFreedLocked(seg *segment) {
	st, n := seg.pool.stat, int64(seg.size)
	a.st.of(stats.Segment).decrease(st, 1)
	a.st.of(stats.ReservedBytes).decrease(st, n)
	if a.rule.oversize(seg.size) {
		a.st.oversizeSegments.Decrease(1)
	}
	a.st.numDeviceFree++
	if len(a.observers) > 0 {
		a.notifyLocked(Action{Kind: ActionSegmentFree, Ptr: seg.ptr, Size: seg.size, Stream: seg.stream})
	}
}

// pagesMappedLocked records n bytes of pages mapped at ptr into the
// expandable segment seg (segment_map). Mapping counts as a device
// allocation and adds to reserved bytes, but not to the segment count.
func (a *Allocator) pagesMappedLocked(seg *segment, ptr device.Ptr, n uint64) {
	a.st.of(stats.ReservedBytes).increase(seg.pool.stat, int64(n))
	a.st.numDeviceAlloc++
	if len(a.observers) > 0 {
		a.notifyLocked(Action{Kind: ActionSegmentMap, Ptr: ptr, Size: n, Stream: seg.stream})
	}
}

// pagesUnmappedLocked records n bytes of pages unmapped at ptr from the
// expandable segment seg (segment_unmap).
func (a *Allocator) pagesUnmappedLocked(seg *segment, ptr device.Ptr, n uint64) {
	a.st.of(stats.ReservedBytes).decrease(seg.pool.stat, int64(n))
	a.st.numDeviceFree++
	if len(a.observers) > 0 {
		a.notifyLocked(Action{Kind: ActionSegmentUnmap, Ptr: ptr, Size: n, Stream: seg.stream})
	}
}

// blockAllocatedLocked records b handed to a caller who asked for
// b.requested bytes (alloc): it is now allocated and active.
func (a *Allocator) blockAllocatedLocked(b *block) {
	st, n := b.pool.stat, int64(b.size)
	a.st.of(stats.Allocation).increase(st, 1)
	a.st.of(stats.AllocatedBytes).increase(st, n)
	a.st.of(stats.Active).increase(st, 1)
	a.st.of(stats.ActiveBytes).increase(st, n)
	a.st.of(stats.RequestedBytes).increase(st, int64(b.requested))
	if a.rule.oversize(b.size) {
		a.st.oversizeAllocations.Increase(1)
	}
	ph := &a.phases[b.phase]
	ph.bytes.Increase(n)
	ph.allocations.Increase(1)
	if len(a.observers) > 0 {
		a.notifyLocked(Action{Kind: ActionAlloc, Ptr: b.ptr, Size: b.size, Requested: b.requested, Stream: a.userStreamLocked(b), Phase: ph.name})
	}
}

// freeRequestedLocked records the caller's free of b (free_requested): it
// is no longer allocated, but stays active until its free completes.
func (a *Allocator) freeRequestedLocked(b *block) {
	st := b.pool.stat
	a.st.of(stats.Allocation).decrease(st, 1)
	a.st.of(stats.AllocatedBytes).decrease(st, int64(b.size))
	if a.rule.oversize(b.size) {
		a.st.oversizeAllocations.Decrease(1)
	}
	ph := &a.phases[b.phase]
	ph.bytes.Decrease(int64(b.size))
	ph.allocations.Decrease(1)
	if len(a.observers) > 0 {
		a.notifyLocked(Action{Kind: ActionFreeRequested, Ptr: b.ptr, Size: b.size, Requested: b.requested, Stream: b.stream, Phase: ph.name})
	}
}

// freeCompletedLocked records that the block of size bytes at ptr, freed
// by its caller, returned to the cache (free_completed): it is no longer
// active. The block itself may already be merged into a neighbour, so its
// figures are passed, not the block.
func (a *Allocator) freeCompletedLocked(p *pool, ptr device.Ptr, size, requested uint64, s device.Stream, phase uint16) {
	a.st.of(stats.Active).decrease(p.stat, 1)
	a.st.of(stats.ActiveBytes).decrease(p.stat, int64(size))
	a.st.of(stats.RequestedBytes).decrease(p.stat, int64(requested))
	if len(a.observers) > 0 {
		a.notifyLocked(Action{Kind: ActionFreeCompleted, Ptr: ptr, Size: size, Requested: requested, Stream: s, Phase: a.phases[phase].name})
	}
}

// inactiveSplitLocked moves the count and bytes of free blocks in split
// segments (inactive_split) by the given signed amounts. Observers see no
// action: the split and merge that cause it are part of alloc and
// free_completed.
func (a *Allocator) inactiveSplitLocked(p *pool, blocks, bytes int64) {
	a.st.of(stats.InactiveSplit).add(p.stat, blocks)
	a.st.of(stats.InactiveSplitBytes).add(p.stat, bytes)
}

// streamRecordedLocked tells observers that b was recorded on stream s
// (record_stream); no stat counts it.
func (a *Allocator) streamRecordedLocked(b *block, s device.Stream) {
	if len(a.observers) > 0 {
		a.notifyLocked(Action{Kind: ActionRecordStream, Ptr: b.ptr, Size: b.size, Requested: b.requested, Stream: s, Phase: a.phases[b.phase].name})
	}
}

// cacheEmptiedLocked tells observers that EmptyCache was called
// (empty_cache); the releases it causes are recorded one by one.
func (a *Allocator) cacheEmptiedLocked() {
	if len(a.observers) > 0 {
		a.notifyLocked(Action{Kind: ActionEmptyCache})
	}
}

// outOfMemoryRecordedLocked counts an out-of-memory error (num_ooms) and
// tells observers (oom).
func (a *Allocator) outOfMemoryRecordedLocked(e *OutOfMemoryError) {
	a.st.numOOMs++
	if len(a.observers) > 0 {
		a.notifyLocked(Action{Kind: ActionOutOfMemory, Size: e.AllocSize, Requested: e.Requested, Stream: e.Stream, Phase: e.Phase})
	}
}

// phaseSetLocked tells observers that the current phase is now name
// (phase); the per-phase stats change with the blocks.
func (a *Allocator) phaseSetLocked(name string) {
	if len(a.observers) > 0 {
		a.notifyLocked(Action{Kind: ActionPhase, Phase: name})
	}
}

// stepMarkedLocked tells observers that a step boundary named name was
// marked (step).
func (a *Allocator) stepMarkedLocked(name string) {
	if len(a.observers) > 0 {
		a.notifyLocked(Action{Kind: ActionStep, Step: name, Phase: a.phases[a.phase].name})
	}
}

// retriedLocked counts a device allocation retried after the whole cache
// was released (num_alloc_retries).
func (a *Allocator) retriedLocked() { a.st.numAllocRetries++ }

// streamsSyncedLocked counts a wait for every outstanding stream event
// (num_sync_all_streams).
func (a *Allocator) streamsSyncedLocked() { a.st.numSyncAllStreams++ }

// reservedLocked returns the bytes obtained from the device: segments plus
// mapped pages (PyTorch's total_allocated_memory).
func (a *Allocator) reservedLocked() uint64 {
	return uint64(a.st.of(stats.ReservedBytes).current())
}

// allocatedLocked returns the bytes of allocated blocks.
func (a *Allocator) allocatedLocked() uint64 {
	return uint64(a.st.of(stats.AllocatedBytes).current())
}
