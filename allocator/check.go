// This file holds the invariant checker.

package allocator

import (
	"errors"
	"fmt"

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
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.checkLocked()
}

func (a *Allocator) checkLocked() error {
	var errs []error
	bad := func(format string, args ...any) {
		if len(errs) < 20 {
			errs = append(errs, fmt.Errorf(format, args...))
		}
	}
	var want stats.DeviceStats
	inIndex := map[*block]bool{}
	for _, p := range [2]*pool{a.small, a.large} {
		var last *block
		p.free.Ascend(func(b *block) bool {
			if last != nil && !freeLess(last, b) {
				bad("free index out of order: %v+%d (stream %d) before %v+%d (stream %d)", last.ptr, last.size, last.stream, b.ptr, b.size, b.stream)
			}
			last = b
			if !p.free.Has(b) {
				bad("free block %v+%d is in the index but a lookup does not find it", b.ptr, b.size)
			}
			if inIndex[b] {
				bad("block %v is in a free index twice", b.ptr)
			}
			inIndex[b] = true
			if b.pool != p {
				bad("free block %v is in the wrong pool's index", b.ptr)
			}
			if !b.indexed {
				bad("free block %v is in the index but not marked indexed", b.ptr)
			}
			return true
		})
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
				if a.live.get(b.ptr) != b {
					bad("allocated block %v is not in the address map", b.ptr)
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
				if inIndex[b] || a.live.get(b.ptr) == b {
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
		listed := map[*block]bool{}
		var prev *block
		for b := p.wholes; b != nil; b = b.nextWhole {
			if listed[b] || b.prevWhole != prev {
				bad("the list of whole free segments is broken at %v", b.ptr)
				break
			}
			listed[b] = true
			prev = b
			if !b.listed || !inIndex[b] || b.isSplit() || b.seg.expandable() || b.pool != p {
				bad("block %v is in the list of whole free segments but is not one", b.ptr)
			}
		}
		p.free.Ascend(func(b *block) bool {
			if whole := !b.isSplit() && !b.seg.expandable(); whole != listed[b] || whole != b.listed {
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
	if seenLive != a.live.len() {
		bad("address map holds %d blocks, segments have %d allocated blocks", a.live.len(), seenLive)
	}
	got := a.st.stats()
	for m := range stats.NumMetrics {
		g, w := got.Of(m), want.Of(m)
		for p := stats.All; p < stats.NumPools; p++ {
			if g[p].Current != w[p].Current {
				bad("stat %s.%s.current is %d, blocks say %d", m, p, g[p].Current, w[p].Current)
			}
			if g[p].Peak < g[p].Current {
				bad("stat %s.%s.peak %d is below current %d", m, p, g[p].Peak, g[p].Current)
			}
			if p == stats.All && g[p].Peak > g[stats.SmallPool].Peak+g[stats.LargePool].Peak {
				bad("stat %s.all.peak %d is above the sum of the pool peaks", m, g[p].Peak)
			}
		}
	}
	for _, c := range []struct {
		name      string
		got, want stats.Stat
	}{
		{"oversize_allocations", got.OversizeAllocations, want.OversizeAllocations},
		{"oversize_segments", got.OversizeSegments, want.OversizeSegments},
	} {
		if c.got.Current != c.want.Current {
			bad("%s.current is %d, blocks say %d", c.name, c.got.Current, c.want.Current)
		}
	}
	for b, u := range a.uses {
		if !b.allocated || !b.recorded || len(u) == 0 || a.live.get(b.ptr) != b {
			bad("stream uses are kept for %v, which is not an allocated, recorded block", b.ptr)
		}
	}
	if pending != a.events.Len() {
		bad("pending event count %d, queues hold %d", a.events.Len(), pending)
	}
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
