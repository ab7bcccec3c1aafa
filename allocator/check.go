// This file holds the invariant checker.

package allocator

import (
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/stats"
)

// CheckInvariants verifies the allocator's internal consistency and returns
// an error describing every violation found, or nil:
//
//   - the blocks of every segment tile it exactly, in address order, with
//     consistent prev/next links, the segment's head first;
//   - no two neighbouring blocks of a segment are both free (free
//     neighbours are always merged);
//   - every free block is in its own pool's free index, and the index holds
//     nothing else; every allocated block is in the address map under its
//     address, and the map holds nothing else; every pending block has as
//     many queued events as its event count;
//   - every stat's current value equals a count over the blocks
//     (allocation, active, segment, inactive_split, their byte
//     counterparts, requested bytes, oversize counts) and the reserved
//     total;
//   - when the device reports its own bytes in use (the simulated device
//     does), they equal the reserved bytes. This assumes the allocator is
//     the device's only user.
//
// It takes the allocator's lock and walks every block: use it in tests and
// debugging, not on a hot path.
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
	inIndex := map[*block]bool{}
	shardOf := map[device.Stream]*shard{}
	nseg := map[*freeIndex]int{}
	for i, sh := range a.shards {
		if sh.cold {
			if sh != a.cold || i != len(a.shards)-1 {
				bad("the cold shard is not the last shard")
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
			if xs[j].pend != nil || xs[j].front != nil {
				bad("the cold shard's stream %d keeps a pending split", s)
			}
		}
	}
	a.checkColdLocked(a.small, bad)
	a.checkColdLocked(a.large, bad)
	a.checkStepsLocked(bad)
	if len(a.shards) > maxShards+1 || (a.cold == nil) != (a.coldIdx == nil) {
		bad("%d shards (cold shard: %v), at most %d of their own", len(a.shards), a.cold != nil, maxShards)
	}
	if shardOf[device.DefaultStream] != a.def || a.def == nil {
		bad("the default stream's shard is not among the shards")
	}
	queued := map[*block]int32{}
	pending := 0
	for b := range a.events.Items() {
		queued[b]++
		pending++
	}
	seenFree, seenLive, seenUnmapped := 0, 0, 0
	for base, s := range a.segments {
		if base != s.ptr {
			bad("segment %v is filed under %v", s.ptr, base)
		}
		if s.head == nil || s.head.prev != nil || s.head.ptr != s.ptr {
			bad("segment %v: head block is wrong", s.ptr)
			continue
		}
		st := s.pool.stat
		xs := a.streamIndexesLocked(s.stream)
		if s.stream == device.DefaultStream {
			xs = &a.def.free
		}
		if xs == nil || s.free != &xs[s.pool.idx] {
			bad("segment %v does not point to the free index of its stream and pool", s.ptr)
			continue
		}
		nseg[s.free]++
		sh := s.free.sh
		want := wants[sh]
		if want == nil {
			want = new(stats.DeviceStats)
			wants[sh] = want
		}
		if !s.expandable() {
			want.Segment.Increase(st, 1)
			want.ReservedBytes.Increase(st, int64(s.size))
			if a.rule.oversize(s.size) {
				want.OversizeSegments.Increase(1)
			}
		}
		next := s.ptr
		var prev *block
		for b := s.head; b != nil; b = b.next {
			if b.ptr != next {
				bad("segment %v: block at %v, expected %v (gap or overlap)", s.ptr, b.ptr, next)
			}
			if b.prev != prev {
				bad("segment %v: block %v has a wrong prev link", s.ptr, b.ptr)
			}
			if b.seg != s || b.pool != s.pool {
				bad("segment %v: block %v points to another segment or pool", s.ptr, b.ptr)
			}
			if b.size == 0 || b.size%kMinBlockSize != 0 {
				bad("segment %v: block %v has size %d", s.ptr, b.ptr, b.size)
			}
			if b.stream != s.stream {
				bad("segment %v: block %v has stream %d, segment %d", s.ptr, b.ptr, b.stream, s.stream)
			}
			if b.indexed != inIndex[b] {
				bad("block %v is marked indexed %v but is in the free index: %v", b.ptr, b.indexed, inIndex[b])
			}
			if s.expandable() && !b.unmapped {
				want.ReservedBytes.Increase(st, int64(b.size))
			}
			switch {
			case b.unmapped:
				if !s.expandable() {
					bad("segment %v: block %v is unmapped in a plain segment", s.ptr, b.ptr)
					break
				}
				if b.allocated || b.eventCount != 0 || b.recorded || inIndex[b] {
					bad("unmapped block %v is allocated, pending or in the free index", b.ptr)
				}
				if !s.pool.unmapped.Has(b) {
					bad("unmapped block %v is not in its pool's unmapped index", b.ptr)
				}
				if uint64(b.ptr-s.ptr)%s.page != 0 || b.size%s.page != 0 {
					bad("unmapped block %v+%d is not page aligned", b.ptr, b.size)
				}
				if prev != nil && prev.unmapped {
					bad("segment %v: unmapped blocks %v and %v are neighbours (not merged)", s.ptr, prev.ptr, b.ptr)
				}
				seenUnmapped++
			case b.allocated:
				seenLive++
				if sh.live.get(b.ptr) != b {
					bad("allocated block %v is not in its stream's address map", b.ptr)
				}
				if inIndex[b] {
					bad("allocated block %v is in a free index", b.ptr)
				}
				if b.eventCount != 0 {
					bad("allocated block %v has %d events", b.ptr, b.eventCount)
				}
				want.Allocation.Increase(st, 1)
				want.AllocatedBytes.Increase(st, int64(b.size))
				want.Active.Increase(st, 1)
				want.ActiveBytes.Increase(st, int64(b.size))
				want.RequestedBytes.Increase(st, int64(b.requested))
				if a.rule.oversize(b.size) {
					want.OversizeAllocations.Increase(1)
				}
			case !b.isFree():
				if b.eventCount <= 0 || queued[b] != b.eventCount {
					bad("pending block %v has event count %d but %d queued events", b.ptr, b.eventCount, queued[b])
				}
				if inIndex[b] || sh.live.get(b.ptr) == b {
					bad("pending block %v is in the free index or the address map", b.ptr)
				}
				want.Active.Increase(st, 1)
				want.ActiveBytes.Increase(st, int64(b.size))
				want.RequestedBytes.Increase(st, int64(b.requested))
			default:
				seenFree++
				if !inIndex[b] {
					bad("free block %v is not in its pool's free index", b.ptr)
				}
				if prev != nil && prev.isFree() {
					bad("segment %v: free blocks %v and %v are neighbours (not merged)", s.ptr, prev.ptr, b.ptr)
				}
				if b.isSplit() && !s.expandable() {
					want.InactiveSplit.Increase(st, 1)
					want.InactiveSplitBytes.Increase(st, int64(b.size))
				}
			}
			next = b.ptr + device.Ptr(b.size)
			prev = b
		}
		if uint64(next-s.ptr) != s.size {
			bad("segment %v: blocks cover %d bytes of %d", s.ptr, next-s.ptr, s.size)
		}
	}
	for _, p := range [2]*pool{a.small, a.large} {
		for i, x := range p.owners {
			if x.owner != i || x.pool != p {
				bad("the owners of pool %s are misfiled at %d", p.stat, i)
			}
		}
	}
	for x, n := range nseg {
		if x.nseg != n || (n > 0) != (x.owner < len(x.pool.owners) && x.pool.owners[x.owner] == x) {
			bad("the free index of stream %d, pool %s, counts %d segments, has %d, owner %v", x.stream, x.pool.stat, x.nseg, n, n > 0)
		}
	}
	for x := range nseg {
		listed := map[*block]bool{}
		var prev *block
		for b := x.wholes; b != nil; b = b.nextWhole {
			if listed[b] || b.prevWhole != prev {
				bad("the list of whole free segments is broken at %v", b.ptr)
				break
			}
			listed[b] = true
			prev = b
			if !b.listed || !inIndex[b] || b.isSplit() || b.seg.expandable() || b.seg.free != x {
				bad("block %v is in the list of whole free segments but is not one", b.ptr)
			}
		}
		x.each(func(b *block) bool {
			whole := !b.isSplit() && !b.seg.expandable()
			if x.buckets != nil {
				// The whole segments of size buckets are the 2 MiB bucket.
				if whole != (b.size == kSmallBuffer) || b.listed {
					bad("free block %v+%d fills its segment: %v, but the size buckets say otherwise", b.ptr, b.size, whole)
				}
				return true
			}
			if whole != listed[b] || whole != b.listed {
				bad("free block %v fills its segment: %v, but is listed: %v (marked %v)", b.ptr, whole, listed[b], b.listed)
			}
			return true
		})
	}
	unmappedIndexed := 0
	for _, p := range [2]*pool{a.small, a.large} {
		if p.unmapped != nil {
			unmappedIndexed += p.unmapped.Len()
		}
	}
	if unmappedIndexed != seenUnmapped {
		bad("unmapped indexes hold %d blocks, segments have %d unmapped blocks", unmappedIndexed, seenUnmapped)
	}
	if seenFree != len(inIndex) {
		bad("free indexes hold %d blocks, segments have %d free blocks", len(inIndex), seenFree)
	}
	if n := a.liveCountLocked(); seenLive != n {
		bad("address maps hold %d blocks, segments have %d allocated blocks", n, seenLive)
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
			for k, c := range sh.st[row].pool {
				if row < int(stats.NumMetrics) {
					w = want.Of(stats.Metric(row))[statPool(k)]
				} else if k == qLarge {
					w = stats.Stat{}
				}
				if v := sh.value(row, k); v != w.Current || c.cur < 0 {
					bad("stat %s of stream %d, %s: current is %d, blocks say %d", rowName(row), sh.stream, statPool(k), v, w.Current)
				}
			}
		}
	}
	a.checkPeaksLocked(bad)
	a.checkShardsLocked(bad)
	for b, u := range a.uses {
		if lb, _ := a.liveBlockLocked(b.ptr); !b.allocated || !b.recorded || len(u) == 0 || lb != b {
			bad("stream uses are kept for %v, which is not an allocated, recorded block", b.ptr)
		}
	}
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

// checkIndexLocked checks the free index x of stream s and pool j: its
// structure, and that every block in it is a free block of its stream and
// pool, filed once, where a lookup finds it. It marks the blocks in
// inIndex.
func (a *Allocator) checkIndexLocked(x *freeIndex, s device.Stream, j int, inIndex map[*block]bool, bad func(string, ...any)) {
	p := [2]*pool{a.small, a.large}[j]
	if x.pool != p || x.stream != s || x.sh.cold != (x.sh == a.cold) || !x.sh.cold && x.sh.stream != s {
		bad("the free index of stream %d, pool %d, belongs to another", s, j)
		return
	}
	// Size buckets for the small pool of PyTorch's plain segments in a
	// shard of its own, large buckets for the other pools of such a shard.
	buckets := p.small && a.vm == nil && a.pol == nil && !x.sh.cold
	if (x.buckets != nil) != buckets || (x.large != nil) != (!buckets && !x.sh.cold) {
		bad("the free index of stream %d, pool %d, has the wrong kind", s, j)
		return
	}
	if pb := x.pend; pb != nil {
		// The block whose split is pending is filed under its key from
		// before the split: check the index with that key, and that the
		// block split from it is its front.
		if f := pb.prev; !pb.isFree() || !pb.indexed || f == nil || !f.busy() || f.ptr != x.pendKey.ptr || f.size+pb.size != x.pendKey.size {
			bad("the block %v whose split is pending is not free and indexed after its front %v", pb.ptr, x.pendKey.ptr)
		}
		k := keyOf(pb)
		pb.ptr, pb.size = x.pendKey.ptr, x.pendKey.size
		defer func() { pb.ptr, pb.size = k.ptr, k.size }()
	}
	var msg string
	switch {
	case x.buckets != nil:
		msg = x.buckets.check()
	case x.large != nil:
		if msg = x.large.check(); msg == "" {
			msg = x.tree.check()
		}
	default:
		msg = x.tree.check()
	}
	if msg != "" {
		bad("free index of stream %d, pool %s: %s", s, p.stat, msg)
	}
	x.each(func(b *block) bool {
		if inIndex[b] {
			bad("block %v is in a free index twice", b.ptr)
		}
		inIndex[b] = true
		if b.pool != p || b.stream != s || b.seg.free != x {
			bad("free block %v is in the free index of another stream or pool", b.ptr)
		}
		if !b.indexed {
			bad("free block %v is in the index but not marked indexed", b.ptr)
		}
		switch {
		case x.buckets != nil:
		case x.large != nil && b.size <= maxLargeSize:
			if i := x.large.slot(classOf(b.size)); i < 0 || x.large.tab[i].first != b && (int(b.heapIdx) >= len(x.large.tab[i].heap) || x.large.tab[i].heap[b.heapIdx] != b) {
				bad("free block %v+%d is in the index but a lookup does not find it", b.ptr, b.size)
			}
		default:
			if l, i := x.tree.seek(keyOf(b)); l == nil || l.vals[i] != b {
				bad("free block %v+%d is in the index but a lookup does not find it", b.ptr, b.size)
			}
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

// checkPeaksLocked checks the peaks and limits: every shard's value is
// within its limit, the limits add up to at most the peak, the all peak
// is at most the sum of the pool peaks, and a shard whose active counts
// are taken to follow its allocation counts (activeImplied) may have them
// follow.
func (a *Allocator) checkPeaksLocked(bad func(string, ...any)) {
	for _, sh := range a.shards {
		if sh.activeImplied && !sh.impliedNow() {
			bad("stream %d: active is taken to follow allocation, but blocks are pending or its limits are lower", sh.stream)
		}
	}
	for row := range numRows {
		for k := range numQ {
			var total, lims int64
			for _, sh := range a.shards {
				v, lim := sh.value(row, k), *sh.limit(row, k)
				if v > lim {
					bad("stat %s of stream %d, column %d: %d is above its limit %d", rowName(row), sh.stream, k, v, lim)
				}
				total += v
				lims += lim
			}
			peak := a.gst.peak[row][k]
			if lims > peak || total > peak {
				bad("stat %s, column %d: peak %d is below the total %d or the sum of the limits %d", rowName(row), k, peak, total, lims)
			}
		}
		if p := a.gst.peak[row]; p[qAll] > p[qSmall]+p[qLarge] {
			bad("stat %s: the all peak %d is above the sum of the pool peaks", rowName(row), p[qAll])
		}
	}
}

// checkShardsLocked checks the shards' bookkeeping: the lock-free copies of
// the shard list, the routes from addresses to shards (every chunk of
// every segment's memory, and nothing else), the cuts (settled in the
// world), and the block structs kept for the next split.
func (a *Allocator) checkShardsLocked(bad func(string, ...any)) {
	if single := a.single.Load(); (single != nil) != (len(a.shards) == 1) || single != nil && single != a.def {
		bad("the single shard is %v with %d shards", single != nil, len(a.shards))
	}
	if list := *a.byStream.Load(); !slices.Equal(list, *streamList(a.shards)) {
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
		for i := range sh.free {
			if f := sh.free[i].front; f != nil && (f.allocated || f.indexed || f.listed || f.recorded || f.unmapped || f.eventCount != 0 || f.requested != 0) {
				bad("stream %d: the struct kept for the next split is in use", sh.stream)
			}
		}
	}
	if a.routes.on != (len(a.shards) > 1) {
		bad("routes kept: %v, with %d shards", a.routes.on, len(a.shards))
	}
	if !a.routes.on {
		return
	}
	want := routes{on: true, owners: map[uint64]chunkOwners{}}
	for _, seg := range a.segments {
		if !seg.expandable() {
			want.add(seg.ptr, seg.size, seg.free.sh, +1)
			continue
		}
		seg.mappedRuns(func(p device.Ptr, n uint64) {
			for off := uint64(0); off < n; off += seg.page {
				want.add(p+device.Ptr(off), seg.page, seg.free.sh, +1)
			}
		})
	}
	norm := func(o chunkOwners) chunkOwners { // the two entries in either order
		if o.id[0] == 0 || o.id[1] != 0 && o.id[1] < o.id[0] {
			o.id[0], o.id[1], o.n[0], o.n[1] = o.id[1], o.id[0], o.n[1], o.n[0]
		}
		return o
	}
	if !maps.EqualFunc(want.owners, a.routes.owners, func(x, y chunkOwners) bool { return norm(x) == norm(y) }) {
		bad("the routes' owners of %d chunks are not the segments' (%d chunks)", len(a.routes.owners), len(want.owners))
	}
	t := a.routes.tab.Load()
	entries := 0
	for i := range t.slots {
		w := t.slots[i].Load()
		if w == 0 || w == routeNone {
			continue
		}
		entries++
		chunk, v := w>>routeVal-1, uint32(w&(1<<routeVal-1))
		if o, ok := want.owners[chunk]; !ok || o.value() != v {
			bad("the route of chunk %#x says %d, its segments say otherwise", chunk, v)
		}
	}
	if entries != len(want.owners) {
		bad("the route table holds %d chunks, the segments have %d", entries, len(want.owners))
	}
	for chunk, o := range want.owners {
		id, ok := a.routes.lookup(device.Ptr(chunk << chunkShift))
		if v := o.value(); ok != (v != routeAmbig) || ok && id+1 != v {
			bad("chunk %#x: a lookup finds shard %d (%v), its segments say %d", chunk, id, ok, v)
		}
	}
}
