// This file holds the ledger: the one place where the allocator's
// statistics change and its observers hear of it. Every state change that
// a stat counts or an observer sees goes through one method here, which
// updates the stats and notifies the observers together, so that the two
// can never disagree.
//
// The ledger is the only writer of the counts' values and cumulative
// sums, their limits and the peaks (counters.go, the phases' counts,
// Allocator.peaks): the methods of the peaks package that change them
// (Bump, Drop, Carry, SetLimit, AddRow, Sole, Exceed, Cut, ResetPeaks)
// are called here and nowhere else in the package, nor are the limits of
// the all columns and the sums written elsewhere (TestOnlyTheLedgerWrites
// checks the source). The other files read them. The changes of the
// counts, the cuts and the resets are in ledger_peaks.go, their passes
// of limits while no shard runs alone in ledger_serial.go; the hand-out
// and the free of a free index's held front in ledger_held.go.

package allocator

import (
	"github.com/gpumem/gpumem/allocator/internal/freeindex"
	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/stats"
)

// segmentAllocatedLocked records a plain segment obtained from the
// device (segment_alloc).
func (a *Allocator) segmentAllocatedLocked(seg *freeindex.Segment) {
	sh, k, n := a.shardOf(seg.Free()), seg.Pool().Idx(), int64(seg.Size())
	a.increase(sh, int(stats.Segment), k, 1)
	a.increase(sh, int(stats.ReservedBytes), k, n)
	if a.rule.oversize(seg.Size()) {
		a.increase(sh, oversizeS, qSmall, 1)
	}
	if sh.pool != nil {
		a.poolGrewLocked(sh.pool)
	}
	a.gst.numDeviceAlloc++
	if len(a.observers) > 0 {
		a.notifyLocked(Action{Kind: ActionSegmentAlloc, Ptr: seg.Ptr(), Size: seg.Size(), Stream: seg.Stream()})
	}
}

// segmentFreedLocked records a plain segment returned to the device
// (segment_free).
func (a *Allocator) segmentFreedLocked(seg *freeindex.Segment) {
	sh, k, n := a.shardOf(seg.Free()), seg.Pool().Idx(), int64(seg.Size())
	sh.decrease(int(stats.Segment), k, 1)
	sh.decrease(int(stats.ReservedBytes), k, n)
	if a.rule.oversize(seg.Size()) {
		sh.decrease(oversizeS, qSmall, 1)
	}
	a.gst.numDeviceFree++
	if len(a.observers) > 0 {
		a.notifyLocked(Action{Kind: ActionSegmentFree, Ptr: seg.Ptr(), Size: seg.Size(), Stream: seg.Stream()})
	}
}

// poolGrewLocked raises the peak of named pool p's reserved bytes to
// their value, after p's memory grew.
func (a *Allocator) poolGrewLocked(p *Pool) {
	p.peakRes = max(p.peakRes, a.poolReservedLocked(p))
}

// poolPausedLocked records the pause of pool p, whose pages in runs were
// unmapped (segment_unmap for each run): every count of its shards, and
// its shards' phase counts, is parked in p.parked (p.parkedPh) and leaves
// the stats until poolResumedLocked. A pause frees nothing: each parked
// value goes into its count's base too (and into the base of the row
// derived from it, active from allocation), so the sums of decreases
// (.freed) stay as they were.
func (a *Allocator) poolPausedLocked(p *Pool, runs []pageRun) {
	p.parked = make([][numRows][2]int64, len(p.shards))
	p.parkedPh = make([][][2]int64, len(p.shards))
	for i, sh := range p.shards {
		for row := range numRows {
			for k := range 2 {
				if v := sh.st[row].pool[k].Value(); v > 0 {
					p.parked[i][row][k] = v
					sh.decrease(row, k, v)
					sh.st[row].pool[k].base -= v
				}
			}
		}
		for row, d := range derivedFrom {
			if d != 0 {
				for k := range 2 {
					sh.st[row].pool[k].base -= p.parked[i][d-1][k]
				}
			}
		}
		p.parkedPh[i] = make([][2]int64, len(sh.ph))
		for id := range sh.ph {
			for j := range 2 {
				if c := sh.ph[id].of(j); c.Value() > 0 {
					p.parkedPh[i][id][j] = c.Value()
					c.base -= c.Value()
					c.Drop(c.Value())
				}
			}
		}
	}
	a.runsNotedLocked(runs, ActionSegmentUnmap)
}

// poolResumedLocked records the resume of pool p, whose pages in runs were
// mapped again (segment_map for each run): its parked counts come back,
// raising the limits and peaks as a hand-out would, but not the sums of
// increases (.allocated): a resume allocates nothing.
func (a *Allocator) poolResumedLocked(p *Pool, runs []pageRun) {
	for i, sh := range p.shards {
		for k := range 2 {
			// One change per pool column, as takeLocked makes one: active
			// follows allocation, so its limits rise with it.
			d := opDelta{k: k}
			var rows uint32
			for row := range numRows {
				v := p.parked[i][row][k]
				if dr := derivedFrom[row]; dr != 0 {
					sh.st[row].pool[k].base += p.parked[i][dr-1][k]
				}
				if v <= 0 {
					continue
				}
				d.row[row] = v
				c := &sh.st[row].pool[k]
				over := sh.st[row].bump(k, v)
				c.increases -= v
				c.base += v
				if over {
					rows |= 1 << row
					if row == int(stats.Allocation) || row == int(stats.AllocatedBytes) {
						rows |= activeRows
					}
				}
			}
			if !sh.activeImplied && sh.activeOver(k) {
				rows |= activeRows
			}
			if rows != 0 {
				a.exceedRows(sh, k, rows, &d)
			}
		}
		for id, v := range p.parkedPh[i] {
			over := false
			for j := range 2 {
				if v[j] > 0 {
					c := sh.ph[id].of(j)
					c.base += v[j]
					over = c.Bump(v[j]) || over
				}
			}
			if over {
				a.exceedRows(sh, 0, phaseBit, &opDelta{phased: true, phase: uint16(id), ph: v})
			}
		}
	}
	p.parked, p.parkedPh = nil, nil
	a.poolGrewLocked(p)
	a.runsNotedLocked(runs, ActionSegmentMap)
}

// runsNotedLocked counts a device call for each run of pages mapped or
// unmapped (kind) and tells the observers.
func (a *Allocator) runsNotedLocked(runs []pageRun, kind ActionKind) {
	for _, r := range runs {
		if kind == ActionSegmentMap {
			a.gst.numDeviceAlloc++
		} else {
			a.gst.numDeviceFree++
		}
		if len(a.observers) > 0 {
			a.notifyLocked(Action{Kind: kind, Ptr: r.ptr, Size: r.n, Stream: r.seg.Stream()})
		}
	}
}

// pagesMappedLocked records n bytes of pages mapped at ptr into the
// expandable segment seg (segment_map). Mapping counts as a device
// allocation and adds to reserved bytes, but not to the segment count.
func (a *Allocator) pagesMappedLocked(seg *freeindex.Segment, ptr device.Ptr, n uint64) {
	sh := a.shardOf(seg.Free())
	a.increase(sh, int(stats.ReservedBytes), seg.Pool().Idx(), int64(n))
	if sh.pool != nil {
		a.poolGrewLocked(sh.pool)
	}
	a.gst.numDeviceAlloc++
	if len(a.observers) > 0 {
		a.notifyLocked(Action{Kind: ActionSegmentMap, Ptr: ptr, Size: n, Stream: seg.Stream()})
	}
}

// pagesUnmappedLocked records n bytes of pages unmapped at ptr from the
// expandable segment seg (segment_unmap).
func (a *Allocator) pagesUnmappedLocked(seg *freeindex.Segment, ptr device.Ptr, n uint64) {
	a.shardOf(seg.Free()).decrease(int(stats.ReservedBytes), seg.Pool().Idx(), int64(n))
	a.gst.numDeviceFree++
	if len(a.observers) > 0 {
		a.notifyLocked(Action{Kind: ActionSegmentUnmap, Ptr: ptr, Size: n, Stream: seg.Stream()})
	}
}

// takeLocked hands out the free block b of x for a request of size
// rounded bytes, requested as asked (alloc): the index splits off the
// rest of the block when that is worth keeping (freeindex.Index.Take: the front
// is handed out, the rest stays free), and the block handed out is marked
// allocated, filed in its shard's address table and recorded here: it is
// now allocated and active, and what handing it out changed in the free
// blocks of split plain segments counts in inactive_split (expandable
// blocks never count). It returns that block. The hand-out and its record
// are one function, so that the cached path makes one call fewer.
//
// b is either in the free index (found by fitLocked, or mapped into an
// expandable segment) or a new segment's block, in no index yet; sh is
// x's shard.
func (a *Allocator) takeLocked(sh *shard, x *freeindex.Index, b *freeindex.Block, size, requested uint64) *freeindex.Block {
	// The counts first, from what the hand-out will be, so that little
	// lives across the calls below.
	k := x.PoolIdx()
	split := a.rule.shouldSplit(k == qSmall, b.Size(), size)
	n := int64(b.Size()) // the bytes handed out
	var splitBlocks, splitBytes int64
	if split {
		n = int64(size)
	}
	if !b.SegExpandable() {
		switch wasSplit := b.IsSplit(); {
		case split && wasSplit:
			splitBytes = -n
		case split:
			splitBlocks, splitBytes = 1, int64(b.Size()-size) // the rest
		case wasSplit:
			splitBlocks, splitBytes = -1, -n
		}
	}
	st := &sh.st
	var rows uint32 // the rows past a limit
	if st[stats.Allocation].bump(k, 1) {
		rows |= 1<<stats.Allocation | activeRows
	}
	if st[stats.AllocatedBytes].bump(k, n) {
		rows |= 1<<stats.AllocatedBytes | activeRows
	}
	if st[stats.RequestedBytes].bump(k, int64(requested)) {
		rows |= 1 << stats.RequestedBytes
	}
	if !sh.activeImplied && sh.activeOver(k) { // active = allocation + pending rises too
		rows |= activeRows
	}
	oversize := uint64(n) >= a.rule.maxSplit
	if oversize && st[oversizeA].bump(qSmall, 1) {
		rows |= 1 << oversizeA
	}
	if st[stats.InactiveSplit].move(k, splitBlocks) {
		rows |= 1 << stats.InactiveSplit
	}
	if st[stats.InactiveSplitBytes].move(k, splitBytes) {
		rows |= 1 << stats.InactiveSplitBytes
	}
	if a.phased && sh.phaseCount(a.phase).add(n) {
		rows |= phaseBit
	}
	if rows != 0 {
		a.takeExceeded(sh, k, rows, n, int64(requested), splitBlocks, splitBytes, oversize)
	}
	f := x.Take(b, size, split) // with split, b is the rest
	f.Allocated, f.Requested = true, requested
	if a.phased { // else the phase is the first, 0, as every block's (checkPhasesLocked)
		f.Phase = a.phase
	}
	if !sh.live.PutHome(f) {
		sh.live.Put(f)
	}
	if h := a.hooks; h != 0 {
		if h&hookListen != 0 {
			a.handedOutLocked(sh, f, size)
		} else {
			a.searchStepsLocked(sh, f) // the planned policy's search for steps alone
		}
	}
	return f
}

// handedOutLocked logs the hand-out of f, for a request rounded to size
// bytes, where steps or observers listen (hookListen): the step counts,
// the planned policy's record of a step and its search for steps, the
// observers.
func (a *Allocator) handedOutLocked(sh *shard, f *freeindex.Block, size uint64) {
	if a.stepping {
		sh.steps.note(f, +1)
	}
	if pol := a.pol; pol != nil && pol.plan != nil {
		p := pol.plan
		if p.recording { // a quiet step logs nothing
			if s, k := a.userStreamLocked(f), len(p.recSize); s == p.recStream && k > 0 && (!p.logOps || k < len(p.prevSize) && size <= p.prevSize[k]) {
				// A step's allocation on its main stream (its operations
				// logged too while it may fit the envelope; with no
				// envelope, its stream): its log, in line.
				if p.logOps {
					p.rec = append(p.rec, planOp{ptr: f.Ptr(), pos: int32(k)})
				} else if len(p.prevSize) == 0 {
					p.logStream(s, k)
				}
				p.recSize = append(p.recSize, size)
			} else if !p.countSameLocked(size, s) {
				a.planAllocatedLocked(f, size, s)
			}
		}
		if p.auto != nil { // no mark yet: the search for steps
			a.searchStepsLocked(sh, f)
		}
	}
	if len(a.observers) > 0 {
		a.notifyLocked(Action{Kind: ActionAlloc, Ptr: f.Ptr(), Size: f.Size(), Requested: f.Requested, Stream: a.userStreamLocked(f), Phase: a.phases[f.Phase].name})
	}
}

// takeExceeded runs exceedRows for a hand-out of n bytes (requested as
// asked) in pool k of shard sh that passed a limit of the rows in rows; it
// is apart from takeLocked so that the cached path's frame stays small.
//
//go:noinline
func (a *Allocator) takeExceeded(sh *shard, k int, rows uint32, n, requested, splitBlocks, splitBytes int64, oversize bool) {
	d := opDelta{k: k}
	d.row[stats.Allocation], d.row[stats.AllocatedBytes], d.row[stats.RequestedBytes] = 1, n, requested
	d.row[stats.InactiveSplit], d.row[stats.InactiveSplitBytes] = splitBlocks, splitBytes
	if oversize {
		d.row[oversizeA] = 1
	}
	if a.phased {
		d.phased, d.phase, d.ph = true, a.phase, [2]int64{n, 1}
	}
	a.exceedRows(sh, k, rows, &d)
}

// freeRequestedLocked records the caller's free of b, of free index x
// (free_requested), when the free waits for stream events: b is no
// longer allocated, but stays active until its free completes.
func (a *Allocator) freeRequestedLocked(x *freeindex.Index, b *freeindex.Block) {
	sh := a.shardOf(x)
	st := &sh.st
	st[stats.Allocation].pool[x.PoolIdx()&1].Drop(1)
	st[stats.AllocatedBytes].pool[x.PoolIdx()&1].Drop(int64(b.Size()))
	if b.Size() >= a.rule.maxSplit {
		st[oversizeA].pool[qSmall].Drop(1)
	}
	// Active (allocation + pending) stays as it is: the block is pending.
	st[stats.Active].pool[x.PoolIdx()].Carry(1)
	st[stats.ActiveBytes].pool[x.PoolIdx()].Carry(int64(b.Size()))
	sh.activeImplied, sh.impliedOff = false, true // something is pending
	if a.phased {
		c := &sh.ph[b.Phase]
		c.bytes.Drop(int64(b.Size()))
		c.blocks.Drop(1)
	}
	if a.hooks&hookListen != 0 {
		if a.stepping {
			sh.steps.note(b, -1)
		}
		if a.pol.freesHeard() {
			a.planFreedLocked(sh, b.Ptr())
		}
		if len(a.observers) > 0 {
			a.notifyLocked(Action{Kind: ActionFreeRequested, Ptr: b.Ptr(), Size: b.Size(), Requested: b.Requested, Stream: b.Stream(), Phase: a.phases[b.Phase].name})
		}
	}
}

// finishFreeLocked completes the free of b, which is no longer allocated
// and has no events outstanding: it records the free as completed
// (free_completed: b is no longer active; with requested, the caller's
// free too: free_requested, for a free that did not wait for events),
// then the free index merges b with free neighbours and files the result
// (freeindex.Index.Put, PyTorch's free_block), or, for the front of its
// pending split, holds it and leaves the merge for later
// (freeindex.Index.Hold; the counts are the merge's all the same). The merge's change to the free
// blocks of split plain segments counts in inactive_split: the neighbours
// it absorbs go, the merged block counts if its segment stays split (an
// unsplit is such a merge too: its rest goes, and the block from before
// the split counts if its segment stays split); expandable blocks never
// count. Observers see the merge as part of free_completed. The record
// and the merge are one function, so that the cached path makes one call
// fewer. x is b's free index (its segment's, which the fast path finds
// from b's own flags: freeindex.Block.PoolIdx), sh x's shard.
func (a *Allocator) finishFreeLocked(sh *shard, x *freeindex.Index, b *freeindex.Block, requested bool) {
	if x.Again() { // size buckets in a loop of one size
		if requested && x.Hold(b) {
			a.freeHeldLocked(sh, b)
			return
		}
		x.Unhold() // b may be the held front's neighbour
	}
	var blocks, bytes int64
	if !b.SegExpandable() {
		prev, next := b.Prev(), b.Next()
		first, last, size := b, b, b.Size()
		if prev != nil && prev.IsFree() {
			first, size = prev, size+prev.Size()
			blocks, bytes = -1, -int64(prev.Size())
		}
		if next != nil && next.IsFree() {
			last, size = next, size+next.Size()
			blocks, bytes = blocks-1, bytes-int64(next.Size())
		}
		if first.Prev() != nil || last.Next() != nil {
			blocks, bytes = blocks+1, bytes+int64(size)
		}
	}
	k, st, size := x.PoolIdx(), &sh.st, int64(b.Size())
	if requested {
		st[stats.Allocation].pool[k&1].Drop(1)
		st[stats.AllocatedBytes].pool[k&1].Drop(size)
		if b.Size() >= a.rule.maxSplit {
			st[oversizeA].pool[qSmall].Drop(1)
		}
		if a.phased {
			c := &sh.ph[b.Phase]
			c.bytes.Drop(size)
			c.blocks.Drop(1)
		}
	} else { // it was pending: active (allocation + pending) falls with pending
		st[stats.Active].pool[k&1].Drop(1)
		st[stats.ActiveBytes].pool[k&1].Drop(size)
		sh.refreshImplied()
	}
	st[stats.RequestedBytes].pool[k&1].Drop(int64(b.Requested))
	if blocks > 0 || bytes > 0 {
		over := st[stats.InactiveSplit].move(k, blocks)
		over = st[stats.InactiveSplitBytes].move(k, bytes) || over
		if over {
			a.freeExceeded(sh, k, b, requested, blocks, bytes)
		}
	} else {
		st[stats.InactiveSplit].pool[k&1].Carry(blocks) // zero or less
		st[stats.InactiveSplitBytes].pool[k&1].Carry(bytes)
	}
	if a.hooks&hookListen != 0 {
		a.freedLocked(sh, b, requested)
	}
	b.Requested = 0
	x.Put(b)
}

// completeFreeLocked is finishFreeLocked for b in the free index of its
// segment, found through the segment: the free ladder's way, which knows
// no shard.
func (a *Allocator) completeFreeLocked(b *freeindex.Block, requested bool) {
	x := b.Seg().Free()
	a.finishFreeLocked(a.shardOf(x), x, b, requested)
}

// freeExceeded runs exceedRows for the free of b (requested: by the
// caller, else a pending free completed) in pool k of shard sh, whose
// merge changed inactive_split by blocks and bytes and passed a limit; it
// is apart from finishFreeLocked so that the cached path's frame stays
// small.
//
//go:noinline
func (a *Allocator) freeExceeded(sh *shard, k int, b *freeindex.Block, requested bool, blocks, bytes int64) {
	size := int64(b.Size())
	d := opDelta{k: k}
	if requested {
		d.row[stats.Allocation], d.row[stats.AllocatedBytes] = -1, -size
		if b.Size() >= a.rule.maxSplit {
			d.row[oversizeA] = -1
		}
		if a.phased {
			d.phased, d.phase, d.ph = true, b.Phase, [2]int64{-size, -1}
		}
	} else {
		d.row[stats.Active], d.row[stats.ActiveBytes] = -1, -size
	}
	d.row[stats.RequestedBytes] = -int64(b.Requested)
	d.row[stats.InactiveSplit], d.row[stats.InactiveSplitBytes] = blocks, bytes
	a.exceedRows(sh, k, splitRows, &d)
}

// freedLocked logs the free of b (requested: by the caller, else a
// pending free completed) where steps, the planned policy's record of a
// step or observers listen (hookListen).
func (a *Allocator) freedLocked(sh *shard, b *freeindex.Block, requested bool) {
	if requested {
		if a.stepping {
			sh.steps.note(b, -1)
		}
		if a.pol.freesHeard() {
			a.planFreedLocked(sh, b.Ptr())
		}
	}
	if len(a.observers) > 0 {
		ph := a.phases[b.Phase].name
		if requested {
			a.notifyLocked(Action{Kind: ActionFreeRequested, Ptr: b.Ptr(), Size: b.Size(), Requested: b.Requested, Stream: b.Stream(), Phase: ph})
		}
		a.notifyLocked(Action{Kind: ActionFreeCompleted, Ptr: b.Ptr(), Size: b.Size(), Requested: b.Requested, Stream: b.Stream(), Phase: ph})
	}
}

// streamRecordedLocked tells observers that b was recorded on stream s
// (record_stream); no stat counts it.
func (a *Allocator) streamRecordedLocked(b *freeindex.Block, s device.Stream) {
	if len(a.observers) > 0 {
		a.notifyLocked(Action{Kind: ActionRecordStream, Ptr: b.Ptr(), Size: b.Size(), Requested: b.Requested, Stream: s, Phase: a.phases[b.Phase].name})
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
