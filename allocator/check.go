// This file holds the invariant checker.

package allocator

import (
	"errors"
	"fmt"
	"slices"

	"github.com/gpumem/gpumem/allocator/internal/freeindex"
	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/stats"
)

// CheckInvariants verifies the allocator's internal consistency and returns
// an error describing every violation found (the first 20), or nil. It
// checks:
//
//   - segments: every segment is filed under its base address; its blocks
//     tile it exactly, in address order, with consistent prev/next links,
//     the segment's head first, each block of the segment's pool and
//     stream and a multiple of 512 bytes; no two neighbouring blocks are
//     both free, nor both unmapped (neighbours are always merged), but
//     a free index's held front and the rest after it, one block as the
//     stats count it; a
//     block knows whether an unmapped range follows it (CanGrow), and
//     its segment's pool and kind (PoolIdx, SegExpandable); an
//     unmapped block is in an expandable segment, page aligned, in its
//     pool's unmapped index and nowhere else; with the policy and
//     expandable segments, every segment's page is its pool's;
//   - blocks and their indexes: every free block but a held front is in
//     the free index of its stream and pool, once, where a lookup finds it, marked indexed,
//     and the indexes hold nothing else; every allocated block is in its
//     shard's address table and nowhere else, without events; every
//     pending block has as many queued events as its event count; the
//     unmapped indexes hold exactly the
//     unmapped blocks; stream uses are kept only for allocated, recorded
//     blocks;
//   - the free indexes: each is of the kind its stream and pool call for
//     (size buckets, large buckets and a tree, or a tree), and its own
//     structure checks out (heaps, bitmaps, tables, tree order and
//     fill); a pending split and its held front are consistent; the index counts its segments
//     and is its pool's owner when it has some; the list of wholly free
//     segments holds exactly them;
//   - shards: the shards of their own are in stream order, the default
//     stream's among them, the cold shard (if any) last, at most
//     maxShards of their own; a stream is either in a shard of its own or
//     in the cold shard; the lock-free copies (the single shard, the list
//     by stream, the list by id) match the shards; no cut waits; a fast
//     shard is one whose lock the world holds, and the cold shard is
//     never fast;
//     the block structs kept for the next split are unused;
//   - routes: kept exactly when there are two shards or more; the list of
//     every region holds exactly the memory of the segments there (mapped
//     pages for expandable segments), by shard, in sorted, disjoint,
//     coalesced pieces within the region, and nothing else; a lookup of
//     the first and last address of each piece finds its shard;
//   - stats: every shard's current value of every stat equals a count
//     over its blocks (allocation, active, segment, reserved bytes,
//     inactive_split, their byte counterparts, requested bytes, oversize
//     counts) and is not negative;
//   - limits and peaks: for every row of the peaks (every stat in every
//     pool column and all, and while blocks are counted by phase the
//     bytes and blocks of every phase), every shard's value is within its
//     limit, and the limits add up to at most the peak, which is at least
//     the total; the all peak of a stat is at most the sum of its pool
//     peaks; a shard whose active counts are taken to follow its
//     allocation counts (activeImplied) has nothing pending and active
//     limits at least its allocation limits;
//   - phases: the current phase and every allocated block's phase are
//     phases; the peaks have two rows per phase exactly while blocks are
//     counted by phase, and then every shard's count of a phase's bytes
//     and blocks equals its allocated blocks of that phase;
//   - the low_fragmentation policy: every lent block is allocated and
//     recorded on the stream that borrowed it, no block is being lent
//     outside Alloc, and with expandable segments reserved bytes are at
//     most the policy's high-water mark;
//   - when the device reports its own bytes in use (the simulated device
//     does), they equal the reserved bytes. This assumes the allocator is
//     the device's only user.
//
// It takes the world (every lock, DESIGN.md) and walks every block: use it in
// tests and debugging, not on a hot path.
func (a *Allocator) CheckInvariants() error {
	if !a.made() {
		return errNotMade
	}
	a.lockAll()
	defer a.unlockAll()
	return a.checkLocked()
}

// selfCheck runs the self-check of builds with the gpumem_invariants tag
// after an operation that ran under its shard's lock alone.
func (a *Allocator) selfCheck(op string) {
	a.lockAll()
	a.selfCheckLocked(op)
	a.unlockAll()
}

func (a *Allocator) checkLocked() error {
	var errs []error
	bad := func(format string, args ...any) {
		if len(errs) < 20 {
			errs = append(errs, fmt.Errorf(format, args...))
		}
	}
	wants := map[*shard]*stats.DeviceStats{}
	inIndex := map[*freeindex.Block]bool{}
	shardOf := map[device.Stream]*shard{}
	nseg := map[*freeindex.Index]int{}
	var recorded []*freeindex.Block // blocks with Recorded or Uses set, for checkUsesLocked
	own := a.ownShardsLocked()
	for i, sh := range a.shards {
		if (i >= own+boolInt(a.cold != nil)) != (sh.pool != nil || sh.idle) {
			bad("the shards of named pools are not the last shards")
		}
		if sh.pool != nil || sh.idle {
			for j := range sh.free {
				a.checkIndexLocked(&sh.free[j], sh.stream, j, inIndex, bad)
				nseg[&sh.free[j]] = 0
			}
			continue
		}
		if sh.cold {
			if sh != a.cold || i != own {
				bad("the cold shard is not the last shard of the default pool")
			}
			continue
		}
		if i > 0 && a.shards[i-1].stream >= sh.stream {
			bad("shards out of order: stream %d after %d", sh.stream, a.shards[i-1].stream)
		}
		shardOf[sh.stream] = sh
		for j := range sh.free {
			a.checkIndexLocked(&sh.free[j], sh.stream, j, inIndex, bad)
			nseg[&sh.free[j]] = 0
		}
	}
	for s, xs := range a.coldIdx {
		if shardOf[s] != nil {
			bad("stream %d has a shard and a place in the cold shard", s)
		}
		for j := range xs {
			a.checkIndexLocked(&xs[j], s, j, inIndex, bad)
			nseg[&xs[j]] = 0
		}
	}
	a.checkColdLocked(a.small, bad)
	a.checkColdLocked(a.large, bad)
	a.checkStepsLocked(bad)
	a.checkPoolsLocked(bad)
	if own > maxShards || (a.cold == nil) != (a.coldIdx == nil) {
		bad("%d shards (cold shard: %v), at most %d of their own", len(a.shards), a.cold != nil, maxShards)
	}
	if shardOf[device.DefaultStream] != a.def || a.def == nil {
		bad("the default stream's shard is not among the shards")
	}
	queued := map[*freeindex.Block]int32{}
	pending := 0
	for b := range a.events.Items() {
		queued[b]++
		pending++
	}
	a.checkCaptureLocked(queued, bad)
	seenFree, seenLive, seenUnmapped := 0, 0, 0
	for base, s := range a.segments {
		if base != s.Ptr() {
			bad("segment %v is filed under %v", s.Ptr(), base)
		}
		if s.Head() == nil || s.Head().Prev() != nil || s.Head().Ptr() != s.Ptr() {
			bad("segment %v: head block is wrong", s.Ptr())
			continue
		}
		st := s.Pool().Stat()
		xs := a.streamIndexesLocked(s.Stream())
		if s.Stream() == device.DefaultStream {
			xs = &a.def.free
		}
		if p := a.shardOf(s.Free()).pool; p != nil {
			xs = nil
			for _, sh := range p.shards {
				if sh.stream == s.Stream() {
					xs = &sh.free
				}
			}
		}
		if xs == nil || s.Free() != &xs[s.Pool().Idx()] {
			bad("segment %v does not point to the free index of its stream and pool", s.Ptr())
			continue
		}
		nseg[s.Free()]++
		sh := a.shardOf(s.Free())
		want := wants[sh]
		if want == nil {
			want = new(stats.DeviceStats)
			wants[sh] = want
		}
		if !s.Expandable() {
			want.Segment.Increase(st, 1)
			want.ReservedBytes.Increase(st, int64(s.Size()))
			if a.rule.oversize(s.Size()) {
				want.OversizeSegments.Increase(1)
			}
		}
		next := s.Ptr()
		var prev *freeindex.Block
		held := s.Free().Held() // with the rest after it, the block from before the split
		for b := s.Head(); b != nil; b = b.Next() {
			if b.Uses != 0 {
				recorded = append(recorded, b)
			}
			if b.Ptr() != next {
				bad("segment %v: block at %v, expected %v (gap or overlap)", s.Ptr(), b.Ptr(), next)
			}
			if b.Prev() != prev {
				bad("segment %v: block %v has a wrong prev link", s.Ptr(), b.Ptr())
			}
			if b.Seg() != s || b.Pool() != s.Pool() {
				bad("segment %v: block %v points to another segment or pool", s.Ptr(), b.Ptr())
			}
			if b.PoolIdx() != s.Pool().Idx() || b.SegExpandable() != s.Expandable() || freeindex.CanGrow(b) != (b.Next() != nil && b.Next().Unmapped()) {
				bad("segment %v: block %v says pool %d, expandable %v, an unmapped range after it %v; its segment and next block say %d, %v, %v", s.Ptr(), b.Ptr(), b.PoolIdx(), b.SegExpandable(), freeindex.CanGrow(b), s.Pool().Idx(), s.Expandable(), b.Next() != nil && b.Next().Unmapped())
			}
			if b.Size() == 0 || b.Size()%kMinBlockSize != 0 {
				bad("segment %v: block %v has size %d", s.Ptr(), b.Ptr(), b.Size())
			}
			if b.Stream() != s.Stream() {
				bad("segment %v: block %v has stream %d, segment %d", s.Ptr(), b.Ptr(), b.Stream(), s.Stream())
			}
			if b.Indexed() != inIndex[b] {
				bad("block %v is marked indexed %v but is in the free index: %v", b.Ptr(), b.Indexed(), inIndex[b])
			}
			if s.Expandable() && !b.Unmapped() {
				want.ReservedBytes.Increase(st, int64(b.Size()))
			}
			switch {
			case b.Unmapped():
				if !s.Expandable() {
					bad("segment %v: block %v is unmapped in a plain segment", s.Ptr(), b.Ptr())
					break
				}
				if b.Allocated || b.EventCount != 0 || b.Uses != 0 || inIndex[b] {
					bad("unmapped block %v is allocated, pending or in the free index", b.Ptr())
				}
				if !s.Pool().HasUnmapped(b) {
					bad("unmapped block %v is not in its pool's unmapped index", b.Ptr())
				}
				if uint64(b.Ptr()-s.Ptr())%s.Page() != 0 || b.Size()%s.Page() != 0 {
					bad("unmapped block %v+%d is not page aligned", b.Ptr(), b.Size())
				}
				if prev != nil && prev.Unmapped() {
					bad("segment %v: unmapped blocks %v and %v are neighbours (not merged)", s.Ptr(), prev.Ptr(), b.Ptr())
				}
				seenUnmapped++
			case b.Allocated:
				seenLive++
				if sh.live.Get(b.Ptr()) != b {
					bad("allocated block %v is not in its shard's address table", b.Ptr())
				}
				if inIndex[b] {
					bad("allocated block %v is in a free index", b.Ptr())
				}
				if b.EventCount != 0 {
					bad("allocated block %v has %d events", b.Ptr(), b.EventCount)
				}
				want.Allocation.Increase(st, 1)
				want.AllocatedBytes.Increase(st, int64(b.Size()))
				want.Active.Increase(st, 1)
				want.ActiveBytes.Increase(st, int64(b.Size()))
				want.RequestedBytes.Increase(st, int64(b.Requested))
				if a.rule.oversize(b.Size()) {
					want.OversizeAllocations.Increase(1)
				}
			case !b.IsFree():
				if !a.isDeferred(b) && (b.EventCount <= 0 || queued[b] != b.EventCount) {
					bad("pending block %v has event count %d but %d queued events", b.Ptr(), b.EventCount, queued[b])
				}
				if inIndex[b] || sh.live.Entry(b.Ptr()) == b {
					bad("pending block %v is in the free index or the address table", b.Ptr())
				}
				want.Active.Increase(st, 1)
				want.ActiveBytes.Increase(st, int64(b.Size()))
				want.RequestedBytes.Increase(st, int64(b.Requested))
			case b == held:
				// Counted with the rest, as the one block it stands for
				// (the free index checks the pair).
				if inTable, parked := sh.live.Entry(b.Ptr()) == b, s.Free().IsParked(); inTable != parked {
					bad("held front %v: in its shard's address table %v, but its free index says parked %v", b.Ptr(), inTable, parked)
				}
			default:
				switch held := s.Free().InArena(b); {
				case held && inIndex[b]:
					bad("free block %v of a held arena is in its pool's free index", b.Ptr())
				case !held && !inIndex[b]:
					bad("free block %v is not in its pool's free index", b.Ptr())
				case !held:
					seenFree++
				}
				first, size := b, b.Size()
				if prev != nil && prev == held {
					first, size = prev, size+prev.Size()
				} else if prev != nil && prev.IsFree() {
					bad("segment %v: free blocks %v and %v are neighbours (not merged)", s.Ptr(), prev.Ptr(), b.Ptr())
				}
				if (first.Prev() != nil || b.Next() != nil) && !s.Expandable() {
					want.InactiveSplit.Increase(st, 1)
					want.InactiveSplitBytes.Increase(st, int64(size))
				}
			}
			next = b.Ptr() + device.Ptr(b.Size())
			prev = b
		}
		if uint64(next-s.Ptr()) != s.Size() {
			bad("segment %v: blocks cover %d bytes of %d", s.Ptr(), next-s.Ptr(), s.Size())
		}
	}
	for _, p := range a.freePoolsLocked() {
		p.CheckOwners(bad)
	}
	for x, n := range nseg {
		x.CheckSegments(n, bad)
	}
	unmappedIndexed := 0
	for _, p := range a.freePoolsLocked() {
		unmappedIndexed += p.UnmappedLen()
	}
	if unmappedIndexed != seenUnmapped {
		bad("unmapped indexes hold %d blocks, segments have %d unmapped blocks", unmappedIndexed, seenUnmapped)
	}
	if seenFree != len(inIndex) {
		bad("free indexes hold %d blocks, segments have %d free blocks", len(inIndex), seenFree)
	}
	if n := a.liveCountLocked(); seenLive != n {
		bad("address tables hold %d blocks, segments have %d allocated blocks", n, seenLive)
	}
	for _, sh := range a.shards {
		want := wants[sh]
		if want == nil {
			want = new(stats.DeviceStats)
		}
		for row := range numRows {
			var w stats.Stat
			switch row {
			case oversizeA:
				w = want.OversizeAllocations
			case oversizeS:
				w = want.OversizeSegments
			}
			for k := range sh.st[row].pool {
				if row < int(stats.NumMetrics) {
					w = want.Of(stats.Metric(row))[statPool(k)]
				} else if k == qLarge {
					w = stats.Stat{}
				}
				if p := sh.pool; p != nil && p.paused {
					// A paused pool counts nothing; what it parked is what
					// its blocks say.
					if v, pv := sh.value(row, k), a.parkedLocked(sh, row, k); v != 0 || pv != w.Current {
						bad("stat %s of stream %d in paused pool %q, %s: current is %d, parked %d, blocks say %d", rowName(row), sh.stream, p.name, statPool(k), v, pv, w.Current)
					}
					continue
				}
				if v := sh.value(row, k); v != w.Current || sh.st[row].pool[k].Value() < 0 {
					bad("stat %s of stream %d, %s: current is %d, blocks say %d", rowName(row), sh.stream, statPool(k), v, w.Current)
				}
			}
		}
	}
	a.checkPeaksLocked(bad)
	a.checkShardsLocked(bad)
	a.checkUsesLocked(recorded, bad)
	if pending != a.events.Len() {
		bad("pending event count %d, queues hold %d", a.events.Len(), pending)
	}
	a.checkPhasesLocked(bad)
	if a.pol != nil {
		a.checkPolicyLocked(bad) // policy: its own structures
	}
	if d, ok := a.dev.(device.UsageReporter); ok {
		if used, reserved := d.BytesInUse(), a.reservedLocked(); used != reserved {
			bad("device reports %d bytes in use, allocator reserved %d", used, reserved)
		}
	}
	return errors.Join(errs...)
}

// freePoolsLocked returns the freeindex pools: the default pool's two,
// then each named pool's.
func (a *Allocator) freePoolsLocked() []*freeindex.Pool {
	ps := []*freeindex.Pool{a.small, a.large}
	for _, p := range a.pools {
		ps = append(ps, p.small, p.large)
	}
	return ps
}

// boolInt is 1 for true, 0 for false.
func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// checkIndexLocked checks the free index x of stream s and pool j: its
// structure, and that every block in it is a free block of its stream and
// pool, filed once, where a lookup finds it. It marks the blocks in
// inIndex.
func (a *Allocator) checkIndexLocked(x *freeindex.Index, s device.Stream, j int, inIndex map[*freeindex.Block]bool, bad func(string, ...any)) {
	p := [2]*freeindex.Pool{a.small, a.large}[j]
	if q := a.shardOf(x).pool; q != nil {
		p = [2]*freeindex.Pool{q.small, q.large}[j]
	}
	if x.Pool() != p && !a.shardOf(x).idle || x.Stream() != s || a.shardOf(x).cold != (a.shardOf(x) == a.cold) || !a.shardOf(x).cold && a.shardOf(x).stream != s {
		bad("the free index of stream %d, pool %d, belongs to another", s, j)
		return
	}
	// Size buckets for the small pool of PyTorch's plain segments in a
	// shard of its own, large buckets for the other pools of such a shard,
	// the tree alone in the cold shard.
	kind := freeindex.KindLarge
	switch {
	case a.shardOf(x).cold:
		kind = freeindex.KindTree
	case p.Small() && a.vm == nil && a.pol == nil:
		kind = freeindex.KindSmall
	}
	if x.Kind() != kind {
		bad("the free index of stream %d, pool %d, has the wrong kind", s, j)
		return
	}
	x.Check(bad)
	x.Each(func(b *freeindex.Block) bool {
		if inIndex[b] {
			bad("block %v is in a free index twice", b.Ptr())
		}
		inIndex[b] = true
		if b.Pool() != p || b.Stream() != s || b.Seg().Free() != x {
			bad("free block %v is in the free index of another stream or pool", b.Ptr())
		}
		return true
	})
}

// rowName names a row of the counts: a metric or an oversize stat.
func rowName(row int) string {
	switch row {
	case oversizeA:
		return "oversize_allocations"
	case oversizeS:
		return "oversize_segments"
	}
	return stats.Metric(row).String()
}

// checkPeaksLocked checks the peaks and limits: the invariants of every
// row of the peaks (the peaks package: every shard's value is within its
// limit, and the limits add up to at most the peak, which is at least the
// total), for the stats' rows and the phases' alike; the all peak of a
// stat is at most the sum of its pool peaks; and a shard whose active
// counts are taken to follow its allocation counts (activeImplied) may
// have them follow.
func (a *Allocator) checkPeaksLocked(bad func(string, ...any)) {
	for _, sh := range a.shards {
		if sh.activeImplied && !sh.impliedNow() {
			bad("stream %d: active is taken to follow allocation, but blocks are pending or its limits are lower", sh.stream)
		}
	}
	ids := *a.byID.Load()
	a.peaks.Check(a.parts(), func(r, p int, msg string) {
		where := a.rowNameLocked(r)
		if p >= 0 && p < len(ids) {
			where += fmt.Sprintf(" of stream %d", ids[p].stream)
		}
		bad("%s: %s", where, msg)
	})
	for row := range numRows {
		pk := func(k int) int64 { return a.peaks.Peak(statRow(row, k)) }
		if pk(qAll) > pk(qSmall)+pk(qLarge) {
			bad("stat %s: the all peak %d is above the sum of the pool peaks", rowName(row), pk(qAll))
		}
	}
}

// rowNameLocked names a row of the peaks: a stat and its column, or a
// phase's bytes or blocks.
func (a *Allocator) rowNameLocked(r int) string {
	if r < numStatRows {
		return fmt.Sprintf("stat %s, column %d", rowName(r/numQ), r%numQ)
	}
	id, j := (r-numStatRows)/2, (r-numStatRows)%2
	name := fmt.Sprintf("phase %d", id)
	if id < len(a.phases) {
		name = fmt.Sprintf("phase %q", a.phases[id].name)
	}
	return name + [2]string{" bytes", " blocks"}[j]
}

// checkShardsLocked checks the shards' bookkeeping: the lock-free copies of
// the shard list, the routes from addresses to shards (every segment's
// memory, and nothing else), the cuts (settled in the
// world), and the block structs kept for the next split.
func (a *Allocator) checkShardsLocked(bad func(string, ...any)) {
	if single := a.single.Load(); (single != nil) != (len(a.shards) == 1) || single != nil && single != a.def {
		bad("the single shard is %v with %d shards", single != nil, len(a.shards))
	}
	if t, want := a.byStream.Load(), streamList(a.shards); !slices.Equal(t.list, want.list) || t.slot != want.slot {
		bad("the lock-free list of shards differs from the shards")
	}
	ids := *a.byID.Load()
	if len(ids) != len(a.shards) {
		bad("%d shards by id, %d shards", len(ids), len(a.shards))
	}
	for i, sh := range ids {
		if sh.id != i || !slices.Contains(a.shards, sh) {
			bad("shard %d (stream %d) is filed by id under %d", sh.id, sh.stream, i)
		}
	}
	for _, sh := range a.shards {
		if sh.cut {
			bad("stream %d: a cut waits in the world", sh.stream)
		}
		// The world holds the lock of every fast shard (lockAll): a
		// TryLock of one fails.
		if sh.fast.Load() && sh.mu.TryLock() {
			sh.mu.Unlock()
			bad("stream %d is fast, but the world does not hold its lock", sh.stream)
		}
		if sh.cold && sh.fast.Load() {
			bad("the cold shard is fast")
		}
		if sh.fast.Load() && a.settling != 0 {
			bad("stream %d is fast while stream events settle (%d world exits to go)", sh.stream, a.settling)
		}
	}
	if a.settling < 0 || a.settling > settleExits {
		bad("settling %d is not within 0 to %d", a.settling, settleExits)
	}
	if a.routes.on != (len(a.shards) > 1) {
		bad("routes kept: %v, with %d shards", a.routes.on, len(a.shards))
	}
	if !a.routes.on {
		return
	}
	a.routes.checkCache(bad) // first: the lookups below fill slots
	var want routes          // the routes the segments make, built afresh
	want.start()
	for _, seg := range a.segments {
		if p := a.shardOf(seg.Free()).pool; p != nil && p.paused {
			continue // its pages are unmapped
		}
		if !seg.Expandable() {
			want.add(seg.Ptr(), seg.Size(), a.shardOf(seg.Free()), +1)
			continue
		}
		seg.MappedRuns(func(p device.Ptr, n uint64) {
			want.add(p, n, a.shardOf(seg.Free()), +1)
		})
	}
	got := map[uint64][]routePiece{}
	a.routes.each(func(region uint64, ps []routePiece) { got[region] = ps })
	regions := 0
	want.each(func(region uint64, ps []routePiece) {
		regions++
		if g := got[region]; !slices.Equal(g, ps) {
			bad("the routes of region %#x are %v, its segments say %v", region, g, ps)
		}
		for _, x := range ps {
			for _, p := range [2]uint64{x.start, x.end - 1} {
				if id, ok := a.routes.lookup(device.Ptr(p)); !ok || id != x.id {
					bad("address %#x: a lookup finds shard %d (%v), its segments say %d", p, id, ok, x.id)
				}
			}
		}
	})
	if len(got) != regions {
		bad("the routes of %d regions hold memory, the segments have %d", len(got), regions)
	}
	for region, ps := range got {
		for i, x := range ps {
			if x.start >= x.end || x.start>>regionShift != region || (x.end-1)>>regionShift != region ||
				i > 0 && (ps[i-1].end > x.start || ps[i-1].end == x.start && ps[i-1].id == x.id) {
				bad("the routes of region %#x are not sorted, disjoint, coalesced pieces within it: %v", region, ps)
				break
			}
		}
	}
}

// checkColdLocked checks the cold view of pool p against the cold free
// indexes.
func (a *Allocator) checkColdLocked(p *freeindex.Pool, bad func(string, ...any)) {
	p.CheckCold(func(f func(*freeindex.Index)) {
		for _, xs := range a.coldIdx {
			f(&xs[p.Idx()])
		}
	}, a.pol != nil, bad)
}
