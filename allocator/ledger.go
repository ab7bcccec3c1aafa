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
// checks the source). The other files read them.

package allocator

import (
	"math/bits"
	"slices"

	"github.com/gpumem/gpumem/allocator/internal/freeindex"
	"github.com/gpumem/gpumem/allocator/internal/peaks"
	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/stats"
)

// segmentAllocatedLocked records a plain segment obtained from the
// device (segment_alloc).
func (a *Allocator) segmentAllocatedLocked(seg *freeindex.Segment) {
	sh, k, n := a.shardOf(seg.Free), seg.Pool.Idx, int64(seg.Size)
	a.increase(sh, int(stats.Segment), k, 1)
	a.increase(sh, int(stats.ReservedBytes), k, n)
	if a.rule.oversize(seg.Size) {
		a.increase(sh, oversizeS, qSmall, 1)
	}
	a.gst.numDeviceAlloc++
	if len(a.observers) > 0 {
		a.notifyLocked(Action{Kind: ActionSegmentAlloc, Ptr: seg.Ptr, Size: seg.Size, Stream: seg.Stream})
	}
}

// segmentFreedLocked records a plain segment returned to the device
// (segment_free).
func (a *Allocator) segmentFreedLocked(seg *freeindex.Segment) {
	sh, k, n := a.shardOf(seg.Free), seg.Pool.Idx, int64(seg.Size)
	sh.decrease(int(stats.Segment), k, 1)
	sh.decrease(int(stats.ReservedBytes), k, n)
	if a.rule.oversize(seg.Size) {
		sh.decrease(oversizeS, qSmall, 1)
	}
	a.gst.numDeviceFree++
	if len(a.observers) > 0 {
		a.notifyLocked(Action{Kind: ActionSegmentFree, Ptr: seg.Ptr, Size: seg.Size, Stream: seg.Stream})
	}
}

// pagesMappedLocked records n bytes of pages mapped at ptr into the
// expandable segment seg (segment_map). Mapping counts as a device
// allocation and adds to reserved bytes, but not to the segment count.
func (a *Allocator) pagesMappedLocked(seg *freeindex.Segment, ptr device.Ptr, n uint64) {
	a.increase(a.shardOf(seg.Free), int(stats.ReservedBytes), seg.Pool.Idx, int64(n))
	a.gst.numDeviceAlloc++
	if len(a.observers) > 0 {
		a.notifyLocked(Action{Kind: ActionSegmentMap, Ptr: ptr, Size: n, Stream: seg.Stream})
	}
}

// pagesUnmappedLocked records n bytes of pages unmapped at ptr from the
// expandable segment seg (segment_unmap).
func (a *Allocator) pagesUnmappedLocked(seg *freeindex.Segment, ptr device.Ptr, n uint64) {
	a.shardOf(seg.Free).decrease(int(stats.ReservedBytes), seg.Pool.Idx, int64(n))
	a.gst.numDeviceFree++
	if len(a.observers) > 0 {
		a.notifyLocked(Action{Kind: ActionSegmentUnmap, Ptr: ptr, Size: n, Stream: seg.Stream})
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
	wasSplit := b.IsSplit()
	split := a.rule.shouldSplit(x.PoolIdx == qSmall, b.Size, size)
	f := x.Take(b, size, split) // with split, b is the rest
	var splitBlocks, splitBytes int64
	switch {
	case b.Seg.Expandable():
	case split && wasSplit:
		splitBytes = -int64(size)
	case split:
		splitBlocks, splitBytes = 1, int64(b.Size)
	case wasSplit:
		splitBlocks, splitBytes = -1, -int64(b.Size)
	}
	f.Allocated, f.Requested, f.Phase = true, requested, a.phase
	sh.live.Put(f)
	b = f
	k, n := x.PoolIdx, int64(b.Size)
	st := &sh.st
	var rows uint32 // the rows past a limit
	if st[stats.Allocation].bump(k, 1) {
		rows |= 1<<stats.Allocation | activeRows
	}
	if st[stats.AllocatedBytes].bump(k, n) {
		rows |= 1<<stats.AllocatedBytes | activeRows
	}
	if st[stats.RequestedBytes].bump(k, int64(b.Requested)) {
		rows |= 1 << stats.RequestedBytes
	}
	if !sh.activeImplied && sh.activeOver(k) { // active = allocation + pending rises too
		rows |= activeRows
	}
	if b.Size >= a.rule.maxSplit && st[oversizeA].bump(qSmall, 1) {
		rows |= 1 << oversizeA
	}
	if st[stats.InactiveSplit].move(k, splitBlocks) {
		rows |= 1 << stats.InactiveSplit
	}
	if st[stats.InactiveSplitBytes].move(k, splitBytes) {
		rows |= 1 << stats.InactiveSplitBytes
	}
	if a.phased && sh.phaseCount(b.Phase).add(n) {
		rows |= phaseBit
	}
	if rows != 0 {
		d := opDelta{k: k}
		d.row[stats.Allocation], d.row[stats.AllocatedBytes], d.row[stats.RequestedBytes] = 1, n, int64(b.Requested)
		d.row[stats.InactiveSplit], d.row[stats.InactiveSplitBytes] = splitBlocks, splitBytes
		if b.Size >= a.rule.maxSplit {
			d.row[oversizeA] = 1
		}
		if a.phased {
			d.phased, d.phase, d.ph = true, b.Phase, [2]int64{n, 1}
		}
		a.exceedRows(sh, k, rows, &d)
	}
	if a.listening {
		if a.stepping {
			sh.steps.note(b, +1)
		}
		if len(a.observers) > 0 {
			a.notifyLocked(Action{Kind: ActionAlloc, Ptr: b.Ptr, Size: b.Size, Requested: b.Requested, Stream: a.userStreamLocked(b), Phase: a.phases[b.Phase].name})
		}
	}
	return b
}

// freeRequestedLocked records the caller's free of b, of free index x
// (free_requested), when the free waits for stream events: b is no
// longer allocated, but stays active until its free completes.
func (a *Allocator) freeRequestedLocked(x *freeindex.Index, b *freeindex.Block) {
	sh := a.shardOf(x)
	st := &sh.st
	st[stats.Allocation].pool[x.PoolIdx&1].Drop(1)
	st[stats.AllocatedBytes].pool[x.PoolIdx&1].Drop(int64(b.Size))
	if b.Size >= a.rule.maxSplit {
		st[oversizeA].pool[qSmall].Drop(1)
	}
	// Active (allocation + pending) stays as it is: the block is pending.
	st[stats.Active].pool[x.PoolIdx].Carry(1)
	st[stats.ActiveBytes].pool[x.PoolIdx].Carry(int64(b.Size))
	sh.activeImplied = false
	if a.phased {
		c := &sh.ph[b.Phase]
		c.bytes.Drop(int64(b.Size))
		c.blocks.Drop(1)
	}
	if a.listening {
		if a.stepping {
			sh.steps.note(b, -1)
		}
		if len(a.observers) > 0 {
			a.notifyLocked(Action{Kind: ActionFreeRequested, Ptr: b.Ptr, Size: b.Size, Requested: b.Requested, Stream: b.Stream, Phase: a.phases[b.Phase].name})
		}
	}
}

// finishFreeLocked completes the free of b, which is no longer allocated
// and has no events outstanding: it records the free as completed
// (free_completed: b is no longer active; with requested, the caller's
// free too: free_requested, for a free that did not wait for events),
// then the free index merges b with free neighbours and files the result
// (freeindex.Index.Put, PyTorch's free_block). The merge's change to the free
// blocks of split plain segments counts in inactive_split: the neighbours
// it absorbs go, the merged block counts if its segment stays split (an
// unsplit is such a merge too: its rest goes, and the block from before
// the split counts if its segment stays split); expandable blocks never
// count. Observers see the merge as part of free_completed. The record
// and the merge are one function, so that the cached path makes one call
// fewer. sh is the shard of b's free index.
func (a *Allocator) finishFreeLocked(sh *shard, b *freeindex.Block, requested bool) {
	x := b.Seg.Free
	var blocks, bytes int64
	if !b.Seg.Expandable() {
		prev, next := b.Prev, b.Next
		first, last, size := b, b, b.Size
		if prev != nil && prev.IsFree() {
			first, size = prev, size+prev.Size
			blocks, bytes = -1, -int64(prev.Size)
		}
		if next != nil && next.IsFree() {
			last, size = next, size+next.Size
			blocks, bytes = blocks-1, bytes-int64(next.Size)
		}
		if first.Prev != nil || last.Next != nil {
			blocks, bytes = blocks+1, bytes+int64(size)
		}
	}
	k, st, size := x.PoolIdx, &sh.st, int64(b.Size)
	if requested {
		st[stats.Allocation].pool[k&1].Drop(1)
		st[stats.AllocatedBytes].pool[k&1].Drop(size)
		if b.Size >= a.rule.maxSplit {
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
			d := opDelta{k: k}
			if requested {
				d.row[stats.Allocation], d.row[stats.AllocatedBytes] = -1, -size
				if b.Size >= a.rule.maxSplit {
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
	} else {
		st[stats.InactiveSplit].pool[k&1].Carry(blocks) // zero or less
		st[stats.InactiveSplitBytes].pool[k&1].Carry(bytes)
	}
	if a.listening {
		if requested && a.stepping {
			sh.steps.note(b, -1)
		}
		if len(a.observers) > 0 {
			ph := a.phases[b.Phase].name
			if requested {
				a.notifyLocked(Action{Kind: ActionFreeRequested, Ptr: b.Ptr, Size: b.Size, Requested: b.Requested, Stream: b.Stream, Phase: ph})
			}
			a.notifyLocked(Action{Kind: ActionFreeCompleted, Ptr: b.Ptr, Size: b.Size, Requested: b.Requested, Stream: b.Stream, Phase: ph})
		}
	}
	b.Requested = 0
	x.Put(b)
}

// streamRecordedLocked tells observers that b was recorded on stream s
// (record_stream); no stat counts it.
func (a *Allocator) streamRecordedLocked(b *freeindex.Block, s device.Stream) {
	if len(a.observers) > 0 {
		a.notifyLocked(Action{Kind: ActionRecordStream, Ptr: b.Ptr, Size: b.Size, Requested: b.Requested, Stream: s, Phase: a.phases[b.Phase].name})
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

// The counts' changes. A change that may pass a limit (bump, move,
// increase) reports it, and its caller runs exceedRows.

// bump adds n > 0 to pool k and reports whether the pool's or the
// total's limit is passed (then the caller runs exceedRows).
func (s *shardCounts) bump(k int, n int64) bool {
	c := &s.pool[k&1]
	c.increases += n
	return c.Bump(n) || s.pool[0].Value()+s.pool[1].Value() > s.allLim
}

// move adds n, which may be negative or zero, to pool k, and reports
// whether a limit is passed, as bump.
func (s *shardCounts) move(k int, n int64) bool {
	if n > 0 {
		return s.bump(k, n)
	}
	s.pool[k&1].Carry(n)
	return false
}

// increase adds n > 0 to quantity row, pool k of shard sh.
func (a *Allocator) increase(sh *shard, row, k int, n int64) {
	if sh.st[row].bump(k, n) {
		d := opDelta{k: k}
		d.row[row] = n
		a.exceedRows(sh, k, 1<<row, &d)
	}
}

// decrease subtracts n > 0 from quantity row, pool k of shard sh.
func (sh *shard) decrease(row, k int, n int64) { sh.st[row].pool[k&1].Drop(n) }

// add counts a block of n bytes handed out and reports whether a limit is
// passed.
func (c *phaseCount) add(n int64) bool {
	c.bytes.increases += n
	c.blocks.increases++
	over := c.bytes.Bump(n)
	return c.blocks.Bump(1) || over
}

// exceedRows runs after an operation d, on pool k of shard sh, passed a
// limit of one of the rows in the bit set rows. With one shard, whose
// limits are the peaks, it raises each passed limit and peak to the value
// (Sole); with several, it runs the peaks' Exceed for every quantity of
// those rows, in the world, or leaves a cut waiting with d.
//
// With one shard the active limits stay at least the allocation limits
// (active, allocation + pending, is never below allocation, and passing an
// allocation limit with nothing pending passes the active limit too), so
// activeImplied changes only with pending blocks.
func (a *Allocator) exceedRows(sh *shard, k int, rows uint32, d *opDelta) {
	if len(a.shards) == 1 {
		if rows&phaseBit != 0 {
			c := &sh.ph[d.phase]
			for j := range 2 {
				if n := c.of(j); n.Value() > n.Limit() {
					n.SetLimit(n.Value())
					a.peaks.Sole(phaseRow(d.phase, j), n.Value())
				}
			}
			rows &^= phaseBit
		}
		k &= 1
		for ; rows != 0; rows &= rows - 1 {
			row := bits.TrailingZeros32(rows) % numRows
			col := k
			if row >= oversizeA {
				col = qSmall // the oversize stats have one column
			}
			s := &sh.st[row]
			v, all := s.pool[col].Value(), s.pool[0].Value()+s.pool[1].Value()
			if d := derivedFrom[row]; d != 0 {
				base := &sh.st[uint(d-1)%uint(numRows)]
				v += base.pool[col].Value()
				all += base.pool[0].Value() + base.pool[1].Value()
			}
			r := statRow(row, 0)
			if v > s.pool[col].Limit() {
				s.pool[col].SetLimit(v)
				a.peaks.Sole(r+col, v)
			}
			if all > s.allLim {
				s.allLim = all
				a.peaks.Sole(r+qAll, all)
			}
		}
		return
	}
	if !a.world {
		// Under the shard's lock alone: the other shards' counts are out of
		// reach, so the peaks wait for a cut in the world (cutsLocked).
		sh.cut, sh.cutOp = true, *d // the fast path makes the shard slow as it leaves
		return
	}
	ps := a.parts()
	if rows&phaseBit != 0 {
		for j := range 2 {
			a.peaks.Exceed(ps, sh.id, phaseRow(d.phase, j))
		}
		rows &^= phaseBit
	}
	for ; rows != 0; rows &= rows - 1 {
		row := bits.TrailingZeros32(rows)
		for c := range numQ {
			a.peaks.Exceed(ps, sh.id, statRow(row, c))
		}
	}
	sh.refreshImplied()
}

// cutsLocked settles the peaks that shards left waiting (shards.go says
// when and why): their operations, kept as the shards' cutOp, are counted
// by the peaks' Cut in the order of the shards.
func (a *Allocator) cutsLocked() {
	if !slices.ContainsFunc(a.shards, func(sh *shard) bool { return sh.cut }) {
		return
	}
	cs, ops := a.cutChanges[:0], a.cutOps[:0]
	for _, sh := range a.shards {
		if sh.cut {
			n := len(cs)
			cs = sh.cutOp.changes(cs)
			ops = append(ops, peaks.Op{Part: sh.id, Changes: cs[n:]})
		}
	}
	from := 0 // cs may have moved as it grew: each operation takes its part of the last
	for i := range ops {
		n := len(ops[i].Changes)
		ops[i].Changes = cs[from : from+n]
		from += n
	}
	a.peaks.Cut(a.parts(), ops)
	for _, sh := range a.shards {
		if sh.cut {
			sh.cut = false
			sh.refreshImplied()
		}
	}
	clear(ops)
	a.cutChanges, a.cutOps = cs[:0], ops[:0]
}

// peaksStarted gives the peaks their rows of stats, all zero (New).
func (a *Allocator) peaksStarted() {
	for range numStatRows {
		a.peaks.AddRow(0)
	}
}

// peaksResetLocked makes every peak equal to its current value, the
// phases' included, and every shard's limits its values
// (torch.cuda.reset_peak_memory_stats).
func (a *Allocator) peaksResetLocked() {
	a.peaks.ResetPeaks(a.parts())
	for _, o := range a.shards {
		o.refreshImplied()
	}
}

// accumulatedResetLocked zeroes the cumulative sums and counters
// (torch.cuda.reset_accumulated_memory_stats), those of phases included,
// as the stats package's table says: it resets a DeviceStats and loads
// back the counters; the cumulative sums all become zero.
func (a *Allocator) accumulatedResetLocked() {
	d := a.statsLocked()
	d.ResetAccumulated()
	for _, o := range a.shards {
		for row := range o.st {
			for k := range o.st[row].pool {
				c := &o.st[row].pool[k]
				c.increases, c.base = 0, o.value(row, k)
			}
		}
		for i := range o.ph {
			for _, c := range []*count{&o.ph[i].bytes, &o.ph[i].blocks} {
				c.increases, c.base = 0, c.Value()
			}
		}
	}
	g := &a.gst
	g.numAllocRetries, g.numOOMs, g.numSyncAllStreams = d.NumAllocRetries, d.NumOOMs, d.NumSyncAllStreams
	g.numDeviceAlloc, g.numDeviceFree = d.NumDeviceAlloc, d.NumDeviceFree
}

// phasesStartedLocked starts counting by phase, when a second phase is
// named: every block so far is of the first phase, whose counts on each
// shard are its allocation and allocated_bytes counts, with limits at
// their values, and whose peaks, the peaks' first phase rows, are theirs.
func (a *Allocator) phasesStartedLocked() {
	for _, sh := range a.shards {
		c := sh.phaseCount(0)
		for j, row := range [2]stats.Metric{stats.AllocatedBytes, stats.Allocation} {
			var v, inc, base int64
			for _, p := range sh.st[row].pool {
				v += p.Value()
				inc += p.increases
				base += p.base
			}
			*c.of(j) = count{Count: peaks.NewCount(v), increases: inc, base: base}
		}
	}
	a.peaks.AddRow(a.peaks.Peak(statRow(int(stats.AllocatedBytes), qAll)))
	a.peaks.AddRow(a.peaks.Peak(statRow(int(stats.Allocation), qAll)))
	a.phased = true
}

// phaseAddedLocked gives the phase just added, while blocks are counted
// by phase, its rows of the peaks (phaseRow): zero, as its counts.
func (a *Allocator) phaseAddedLocked() {
	a.peaks.AddRow(0)
	a.peaks.AddRow(0)
}

// shardParts is the shards as the parts of the peaks (peaks.Parts): part
// p is the shard whose id is p (Allocator.byID); its value and limit of a
// row are those of the quantity or phase count the row stands for. The
// peaks' methods call it in the world only.
type shardParts Allocator

func (a *Allocator) parts() *shardParts { return (*shardParts)(a) }

func (s *shardParts) Len() int { return len(*s.byID.Load()) }

func (s *shardParts) Value(p, r int) int64 {
	sh := (*s.byID.Load())[p]
	if r < numStatRows {
		return sh.value(r/numQ, r%numQ)
	}
	if c := sh.peekPhase(uint16((r - numStatRows) / 2)); c != nil {
		return c.of((r - numStatRows) % 2).Value()
	}
	return 0
}

func (s *shardParts) Limit(p, r int) int64 {
	sh := (*s.byID.Load())[p]
	if r < numStatRows {
		return sh.limit(r/numQ, r%numQ)
	}
	if c := sh.peekPhase(uint16((r - numStatRows) / 2)); c != nil {
		return c.of((r - numStatRows) % 2).Limit()
	}
	return 0
}

// SetLimit sets a limit. A shard whose stat limits change may no longer
// have its active limits at least its allocation limits: it checks them
// (activeImplied false) until refreshImplied looks again.
func (s *shardParts) SetLimit(p, r int, lim int64) {
	sh := (*s.byID.Load())[p]
	if r < numStatRows {
		row, k := r/numQ, r%numQ
		if k == qAll {
			sh.st[row].allLim = lim
		} else {
			sh.st[row].pool[k].SetLimit(lim)
		}
		sh.activeImplied = false
		return
	}
	id := uint16((r - numStatRows) / 2)
	if lim == 0 && sh.peekPhase(id) == nil {
		return // no counts of the phase: all zero already
	}
	sh.phaseCount(id).of((r - numStatRows) % 2).SetLimit(lim)
}

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
