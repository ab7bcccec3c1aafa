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
	sh, k, n := seg.free.sh, seg.pool.idx, int64(seg.size)
	a.increase(sh, int(stats.Segment), k, 1)
	a.increase(sh, int(stats.ReservedBytes), k, n)
	if a.rule.oversize(seg.size) {
		a.increase(sh, oversizeS, qSmall, 1)
	}
	a.gst.numDeviceAlloc++
	if len(a.observers) > 0 {
		a.notifyLocked(Action{Kind: ActionSegmentAlloc, Ptr: seg.ptr, Size: seg.size, Stream: seg.stream})
	}
}

// segmentFreedLocked records a plain segment returned to the device
// (segment_free).
func (a *Allocator) segmentFreedLocked(seg *segment) {
	sh, k, n := seg.free.sh, seg.pool.idx, int64(seg.size)
	sh.decrease(int(stats.Segment), k, 1)
	sh.decrease(int(stats.ReservedBytes), k, n)
	if a.rule.oversize(seg.size) {
		sh.decrease(oversizeS, qSmall, 1)
	}
	a.gst.numDeviceFree++
	if len(a.observers) > 0 {
		a.notifyLocked(Action{Kind: ActionSegmentFree, Ptr: seg.ptr, Size: seg.size, Stream: seg.stream})
	}
}

// pagesMappedLocked records n bytes of pages mapped at ptr into the
// expandable segment seg (segment_map). Mapping counts as a device
// allocation and adds to reserved bytes, but not to the segment count.
func (a *Allocator) pagesMappedLocked(seg *segment, ptr device.Ptr, n uint64) {
	a.increase(seg.free.sh, int(stats.ReservedBytes), seg.pool.idx, int64(n))
	a.gst.numDeviceAlloc++
	if len(a.observers) > 0 {
		a.notifyLocked(Action{Kind: ActionSegmentMap, Ptr: ptr, Size: n, Stream: seg.stream})
	}
}

// pagesUnmappedLocked records n bytes of pages unmapped at ptr from the
// expandable segment seg (segment_unmap).
func (a *Allocator) pagesUnmappedLocked(seg *segment, ptr device.Ptr, n uint64) {
	seg.free.sh.decrease(int(stats.ReservedBytes), seg.pool.idx, int64(n))
	a.gst.numDeviceFree++
	if len(a.observers) > 0 {
		a.notifyLocked(Action{Kind: ActionSegmentUnmap, Ptr: ptr, Size: n, Stream: seg.stream})
	}
}

// blockAllocatedLocked records b, of free index x (its pool and stream),
// handed to a caller who asked for b.requested bytes (alloc): it is now
// allocated and active. splitBlocks and splitBytes are what handing it out
// changed in the free blocks of split segments (inactive_split), by
// splitting it or by taking a free block of a split segment.
func (a *Allocator) blockAllocatedLocked(x *freeIndex, b *block, splitBlocks, splitBytes int64) {
	k, n := x.k, int64(b.size)
	st := &x.sh.st
	var rows uint32 // the rows past a limit
	if st[stats.Allocation].bump(k, 1) {
		rows |= 1<<stats.Allocation | activeRows
	}
	if st[stats.AllocatedBytes].bump(k, n) {
		rows |= 1<<stats.AllocatedBytes | activeRows
	}
	if st[stats.RequestedBytes].bump(k, int64(b.requested)) {
		rows |= 1 << stats.RequestedBytes
	}
	if !x.sh.activeImplied && x.sh.activeOver(k) { // active = allocation + pending rises too
		rows |= activeRows
	}
	if b.size >= a.rule.maxSplit && st[oversizeA].bump(qSmall, 1) {
		rows |= 1 << oversizeA
	}
	if st[stats.InactiveSplit].move(k, splitBlocks) {
		rows |= 1 << stats.InactiveSplit
	}
	if st[stats.InactiveSplitBytes].move(k, splitBytes) {
		rows |= 1 << stats.InactiveSplitBytes
	}
	if a.phased && x.sh.phaseCount(b.phase).add(n) {
		rows |= phaseRow
	}
	if rows != 0 {
		d := opDelta{k: k}
		d.row[stats.Allocation], d.row[stats.AllocatedBytes], d.row[stats.RequestedBytes] = 1, n, int64(b.requested)
		d.row[stats.InactiveSplit], d.row[stats.InactiveSplitBytes] = splitBlocks, splitBytes
		if b.size >= a.rule.maxSplit {
			d.row[oversizeA] = 1
		}
		if a.phased {
			d.phased, d.phase, d.ph = true, b.phase, [2]int64{n, 1}
		}
		a.exceedRows(x.sh, k, rows, &d)
	}
	if a.listening {
		if a.stepping {
			x.sh.steps.note(b, +1)
		}
		if len(a.observers) > 0 {
			a.notifyLocked(Action{Kind: ActionAlloc, Ptr: b.ptr, Size: b.size, Requested: b.requested, Stream: a.userStreamLocked(b), Phase: a.phases[b.phase].name})
		}
	}
}

// freeRequestedLocked records the caller's free of b, of free index x
// (free_requested), when the free waits for stream events: b is no
// longer allocated, but stays active until its free completes.
func (a *Allocator) freeRequestedLocked(x *freeIndex, b *block) {
	st := &x.sh.st
	st[stats.Allocation].drop(x.k, 1)
	st[stats.AllocatedBytes].drop(x.k, int64(b.size))
	if b.size >= a.rule.maxSplit {
		st[oversizeA].drop(qSmall, 1)
	}
	// Active (allocation + pending) stays as it is: the block is pending.
	st[stats.Active].pool[x.k].cur++
	st[stats.ActiveBytes].pool[x.k].cur += int64(b.size)
	x.sh.activeImplied = false
	if a.phased {
		x.sh.ph[b.phase].sub(int64(b.size))
	}
	if a.listening {
		if a.stepping {
			x.sh.steps.note(b, -1)
		}
		if len(a.observers) > 0 {
			a.notifyLocked(Action{Kind: ActionFreeRequested, Ptr: b.ptr, Size: b.size, Requested: b.requested, Stream: b.stream, Phase: a.phases[b.phase].name})
		}
	}
}

// blockFreedLocked records that b, of free index x, freed by its caller,
// returns to the cache (free_completed): it is no longer active. With
// requested, the caller's free is recorded first (free_requested): a free
// that did not wait for stream events. splitBlocks and splitBytes are
// what the merge that follows changes in the free blocks of split
// segments (inactive_split). Observers see the merge as part of
// free_completed.
func (a *Allocator) blockFreedLocked(x *freeIndex, b *block, requested bool, splitBlocks, splitBytes int64) {
	k, st, size := x.k, &x.sh.st, int64(b.size)
	if requested {
		st[stats.Allocation].drop(k, 1)
		st[stats.AllocatedBytes].drop(k, size)
		if b.size >= a.rule.maxSplit {
			st[oversizeA].drop(qSmall, 1)
		}
		if a.phased {
			x.sh.ph[b.phase].sub(size)
		}
	} else { // it was pending: active (allocation + pending) falls with pending
		st[stats.Active].drop(k, 1)
		st[stats.ActiveBytes].drop(k, size)
		x.sh.refreshImplied()
	}
	st[stats.RequestedBytes].drop(k, int64(b.requested))
	if splitBlocks > 0 || splitBytes > 0 {
		over := st[stats.InactiveSplit].move(k, splitBlocks)
		over = st[stats.InactiveSplitBytes].move(k, splitBytes) || over
		if over {
			d := opDelta{k: k}
			if requested {
				d.row[stats.Allocation], d.row[stats.AllocatedBytes] = -1, -size
				if b.size >= a.rule.maxSplit {
					d.row[oversizeA] = -1
				}
				if a.phased {
					d.phased, d.phase, d.ph = true, b.phase, [2]int64{-size, -1}
				}
			} else {
				d.row[stats.Active], d.row[stats.ActiveBytes] = -1, -size
			}
			d.row[stats.RequestedBytes] = -int64(b.requested)
			d.row[stats.InactiveSplit], d.row[stats.InactiveSplitBytes] = splitBlocks, splitBytes
			a.exceedRows(x.sh, k, splitRows, &d)
		}
	} else {
		st[stats.InactiveSplit].pool[k&1].cur += splitBlocks
		st[stats.InactiveSplitBytes].pool[k&1].cur += splitBytes
	}
	if a.listening {
		if requested && a.stepping {
			x.sh.steps.note(b, -1)
		}
		if len(a.observers) == 0 {
			return
		}
		ph := a.phases[b.phase].name
		if requested {
			a.notifyLocked(Action{Kind: ActionFreeRequested, Ptr: b.ptr, Size: b.size, Requested: b.requested, Stream: b.stream, Phase: ph})
		}
		a.notifyLocked(Action{Kind: ActionFreeCompleted, Ptr: b.ptr, Size: b.size, Requested: b.requested, Stream: b.stream, Phase: ph})
	}
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
	a.gst.numOOMs++
	if len(a.observers) > 0 {
		a.notifyLocked(Action{Kind: ActionOutOfMemory, Size: e.AllocSize, Requested: e.Requested, Stream: e.Stream, Phase: e.Phase})
	}
}

// phaseSetLocked tells observers that the current phase is now name; the
// per-phase stats change with the blocks.
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
func (a *Allocator) retriedLocked() { a.gst.numAllocRetries++ }

// streamsSyncedLocked counts a wait for every outstanding stream event
// (num_sync_all_streams).
func (a *Allocator) streamsSyncedLocked() { a.gst.numSyncAllStreams++ }

// reservedLocked returns the bytes obtained from the device: segments plus
// mapped pages (PyTorch's total_allocated_memory).
func (a *Allocator) reservedLocked() uint64 { return a.totalLocked(stats.ReservedBytes) }

// allocatedLocked returns the bytes of allocated blocks.
func (a *Allocator) allocatedLocked() uint64 { return a.totalLocked(stats.AllocatedBytes) }

// totalLocked returns the current value of metric m over every shard and
// pool.
func (a *Allocator) totalLocked(m stats.Metric) uint64 {
	var t int64
	for _, sh := range a.shards {
		t += sh.value(int(m), qAll)
	}
	return uint64(t)
}
