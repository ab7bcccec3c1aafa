// This file holds the planned policy: the low_fragmentation policy that,
// once it has seen a whole step, serves the steps that repeat it from an
// arena laid out for that step in advance.

package allocator

import (
	"cmp"
	"context"
	"slices"

	"github.com/gpumem/gpumem/allocator/internal/freeindex"
	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/internal/pack"
)

// The planned policy (PolicyPlanned, gpumem_policy:planned) runs as the
// low_fragmentation policy and watches the steps MarkStep delimits:
//
//   - Recording: from the first step boundary on, every Alloc and Free of
//     the step is logged (its position among the step's allocations, its
//     rounded size, its stream).
//   - Planning: at the next boundary, if the step's allocations were all
//     on one stream, the blocks allocated and freed within the step are
//     packed offline (internal/pack, the greedy packing trace/plan uses)
//     into one arena per pool: an offset for each. Blocks that outlive
//     the step (weights, optimizer state, anything kept for the next
//     step) and blocks allocated before it stay out of the plan and are
//     served online.
//   - Arena: an address range of free, mapped memory of the pool and
//     stream, as long as the packing's footprint (whole pages): the range
//     it had, if still wholly free; else the best-fitting free block;
//     else the pool's free pages are unmapped and the policy's growth
//     maps the footprint. The arena is ordinary cached memory: reserved
//     bytes (segments' pages), free blocks in the free index; nothing is
//     held aside, so the stats keep their meaning.
//   - Serving: while the step follows the plan (the n-th allocation has
//     the plan's rounded size and stream), a planned request is handed the
//     block at its offset in the arena, carved out of the free block that
//     holds it (freeindex.Index.Carve): no fit, no device call. A request
//     of a position the plan leaves out is served online.
//   - Departure: a request of another size or stream, one past the plan's
//     end, or one whose range in the arena is not wholly free (a block of
//     the previous step still live, pages reclaimed, an online block that
//     landed there) ends the plan for the rest of the step: it and the
//     requests after it are served online, without error. At the next
//     boundary the step just seen is planned anew; a step that followed
//     the plan to its end keeps it.
//
// Every Alloc and Free of an allocator with the planned policy runs in the
// world once a step has been marked, as they are logged.

// planOp is one operation of the recorded step: the allocation of the
// step's pos-th block, or its free.
type planOp struct {
	pos  int32
	free bool
}

// planReq is the plan for the step's pos-th allocation.
type planReq struct {
	size  uint64 // rounded
	off   uint64 // offset in its pool's arena, when arena
	q     int    // its pool: qSmall or qLarge
	arena bool   // allocated and freed within the planned step: served from the arena
}

// planState is the planned policy's state (policyState.plan), changed in
// the world only.
type planState struct {
	// The step being recorded since the last boundary.
	recording bool
	rec       []planOp
	recSize   []uint64             // by position, the rounded size
	recLive   map[device.Ptr]int32 // the live blocks allocated in the step, by address: their position
	recStream device.Stream
	recMixed  bool // allocations on more than one stream: not planned

	// The plan, nil when there is none.
	reqs   []planReq
	stream device.Stream
	foot   [2]uint64                       // by pool, the arena's bytes (whole pages)
	base   [2]device.Ptr                   // by pool, the arena's address
	seg    [2]*freeindex.Segment           // by pool, the arena's segment
	recent [2][planRecent]*freeindex.Block // by pool, the blocks last handed out of the arena (a ring), where walks start
	next   [2]int                          // by pool, the ring's next slot
	follow bool                            // the current step follows the plan so far
	pos    int                             // the next allocation's position in the current step

	// Counts for tests and measurements.
	plans, served, departures int64
}

// planningLocked reports whether Alloc and Free must run in the world to
// be logged: the planned policy after the first step boundary.
func (p *policyState) planningLocked() bool {
	return p != nil && p.plan != nil && p.plan.recording
}

// planAllocLocked is step 4 of the allocation ladder under the planned
// policy, before the fit: the block planned for the request, carved out
// of its arena, with the free index it is in; nil when the step does not
// follow the plan or the request's position is served online.
func (a *Allocator) planAllocLocked(xs *[2]freeindex.Index, rounded uint64, s device.Stream) (*freeindex.Index, *freeindex.Block) {
	p := a.pol.plan
	if !p.follow {
		return nil, nil
	}
	k := p.pos
	p.pos++
	if k >= len(p.reqs) || s != p.stream || p.reqs[k].size != rounded {
		p.follow = false
		p.departures++
		return nil, nil
	}
	r := &p.reqs[k]
	if !r.arena {
		return nil, nil
	}
	x := &xs[r.q]
	ptr := p.base[r.q] + device.Ptr(r.off)
	b := freeindex.Containing(a.arenaStartLocked(r.q, ptr), ptr)
	if b == nil || !b.IsFree() || b.Ptr+device.Ptr(b.Size) < ptr+device.Ptr(rounded) || b.Seg.Free != x {
		p.follow = false
		p.departures++
		return nil, nil
	}
	p.served++
	return x, x.Carve(b, ptr, rounded)
}

// planRecent is how many of the blocks last handed out of an arena the
// planned policy keeps as starts of its walks.
const planRecent = 16

// arenaStartLocked returns a block of pool q's arena segment to start a
// walk to ptr from: of the structs of the blocks last handed out of the
// arena that are still blocks of the segment (freed, a struct usually
// stays as the merged free block), the nearest to ptr; else the
// segment's first block.
func (a *Allocator) arenaStartLocked(q int, ptr device.Ptr) *freeindex.Block {
	p := a.pol.plan
	best, dist := p.seg[q].Head, uint64(ptr-p.seg[q].Head.Ptr)
	for _, c := range &p.recent[q] {
		if !freeindex.InSegment(c, p.seg[q]) {
			continue
		}
		d := uint64(ptr - c.Ptr)
		if c.Ptr > ptr {
			d = uint64(c.Ptr - ptr)
		}
		if d < dist {
			best, dist = c, d
		}
	}
	return best
}

// planHandedLocked notes b, just handed out of pool q's arena, as a start
// of the next walks.
func (a *Allocator) planHandedLocked(q int, b *freeindex.Block) {
	p := a.pol.plan
	p.recent[q][p.next[q]] = b
	p.next[q] = (p.next[q] + 1) % planRecent
}

// planAllocatedLocked logs the allocation of b, of rounded bytes on
// stream s, in the step being recorded.
func (a *Allocator) planAllocatedLocked(b *freeindex.Block, rounded uint64, s device.Stream) {
	p := a.pol.plan
	if !p.recording {
		return
	}
	if len(p.recSize) == 0 {
		p.recStream = s
	} else if s != p.recStream {
		p.recMixed = true
	}
	pos := int32(len(p.recSize))
	p.recSize = append(p.recSize, rounded)
	p.rec = append(p.rec, planOp{pos: pos})
	p.recLive[b.Ptr] = pos
}

// planFreedLocked logs the free of the block at ptr in the step being
// recorded, if the step allocated it.
func (a *Allocator) planFreedLocked(ptr device.Ptr) {
	p := a.pol.plan
	if !p.recording {
		return
	}
	if pos, ok := p.recLive[ptr]; ok {
		delete(p.recLive, ptr)
		p.rec = append(p.rec, planOp{pos: pos, free: true})
	}
}

// planStepLocked runs at a step boundary under the planned policy: a step
// that followed the plan to its end, or allocated nothing, keeps it;
// otherwise the step just recorded is planned. The arena is then found for the next step, and
// recording starts again.
func (a *Allocator) planStepLocked() {
	p := a.pol.plan
	kept := p.reqs != nil && p.follow && p.pos == len(p.reqs)
	if p.recording && !kept && len(p.recSize) > 0 {
		a.buildPlanLocked()
	}
	p.rec, p.recSize = p.rec[:0], p.recSize[:0]
	clear(p.recLive)
	p.recMixed, p.recording = false, true
	p.pos = 0
	p.follow = p.reqs != nil && a.arenasLocked()
}

// buildPlanLocked plans the recorded step: the blocks it allocated and
// freed get offsets in their pool's arena; the others are served online.
// A step with no allocation, or with allocations on several streams,
// leaves no plan; so does any step on a device without virtual memory,
// whose plain segments count their split blocks (inactive_split), which
// a carve would change.
func (a *Allocator) buildPlanLocked() {
	p := a.pol.plan
	p.reqs = nil
	n := len(p.recSize)
	if n == 0 || p.recMixed || a.vm == nil {
		return
	}
	start, end := make([]int, n), make([]int, n)
	for k := range end {
		end[k] = -1
	}
	for t, op := range p.rec {
		if op.free {
			end[op.pos] = t
		} else {
			start[op.pos] = t
		}
	}
	reqs := make([]planReq, n)
	var items [2][]pack.Item
	var which [2][]int32
	var live, bound [2]uint64
	for _, op := range p.rec { // the peak of live bytes per pool: the bound
		k := op.pos
		q := qLarge
		if isSmall(p.recSize[k]) {
			q = qSmall
		}
		if end[k] < 0 {
			continue
		}
		if op.free {
			live[q] -= p.recSize[k]
			continue
		}
		live[q] += p.recSize[k]
		bound[q] = max(bound[q], live[q])
	}
	for k, size := range p.recSize {
		q := qLarge
		if isSmall(size) {
			q = qSmall
		}
		reqs[k] = planReq{size: size, q: q, arena: end[k] >= 0}
		if end[k] >= 0 {
			items[q] = append(items[q], pack.Item{Start: start[k], End: end[k], Bytes: size})
			which[q] = append(which[q], int32(k))
		}
	}
	for q := range 2 {
		p.foot[q] = 0
		if len(items[q]) == 0 {
			continue
		}
		// The classic greedy by size alone: the other passes gain little
		// on a step and cost as much each (the arena is whole pages).
		idx := make([]int32, len(items[q]))
		for i := range idx {
			idx[i] = int32(i)
		}
		slices.SortFunc(idx, func(x, y int32) int {
			return cmp.Or(pack.Orders[0].Less(&items[q][x], &items[q][y]), cmp.Compare(x, y))
		})
		offsets := make([]uint64, len(idx))
		fp := pack.Greedy(context.Background(), items[q], len(p.rec), idx, offsets)
		for i, k := range which[q] {
			reqs[k].off = offsets[i]
		}
		page := a.pol.largePage
		if q == qSmall {
			page = kSmallBuffer
		}
		p.foot[q] = pagesFor(fp, page)
	}
	p.reqs, p.stream = reqs, p.recStream
	p.plans++
}

// arenasLocked finds each pool's arena for the plan: an address range of
// p.foot bytes wholly free and mapped. It reports false when a pool has
// none and cannot get one (the step then runs online).
func (a *Allocator) arenasLocked() bool {
	p := a.pol.plan
	xs := a.indexesLocked(p.stream)
	if xs == nil {
		return false
	}
	for q := range 2 {
		f := p.foot[q]
		if f == 0 {
			continue
		}
		if seg := p.seg[q]; seg != nil && a.segments[seg.Ptr] == seg {
			if b := freeindex.Containing(seg.Head, p.base[q]); b != nil && b.IsFree() && b.Ptr+device.Ptr(b.Size) >= p.base[q]+device.Ptr(f) {
				continue // the arena is still whole
			}
		}
		x := &xs[q]
		b := x.Fit(f)
		if b == nil {
			// The step's blocks are free again: give back their pages
			// and map the arena in one range.
			a.collected = a.collected[:0]
			x.AscendAtLeast(kSmallBuffer, func(b *freeindex.Block) bool {
				a.collected = append(a.collected, b)
				return true
			})
			for _, c := range a.collected {
				if wholePages(c) > 0 {
					_ = a.unmapLocked(c) // a refusal leaves it mapped
				}
			}
			clear(a.collected)
			a.collected = a.collected[:0]
			b, _ = a.policyGrowLocked(x, f)
		}
		if b == nil {
			return false
		}
		p.base[q], p.seg[q] = b.Ptr, b.Seg
		p.recent[q] = [planRecent]*freeindex.Block{}
	}
	return true
}

// checkPlanLocked adds the planned policy's invariants to
// CheckInvariants: every planned block of the arena lies within its
// pool's arena, and the arena within its segment.
func (a *Allocator) checkPlanLocked(bad func(format string, args ...any)) {
	p := a.pol.plan
	if p.recording && len(p.rec) < len(p.recSize) {
		bad("the planned policy logged %d operations for %d allocations", len(p.rec), len(p.recSize))
	}
	if p.reqs == nil {
		return
	}
	for k, r := range p.reqs {
		if r.arena && r.off+r.size > p.foot[r.q] {
			bad("the plan's allocation %d ends at %d, past its arena's %d bytes", k, r.off+r.size, p.foot[r.q])
		}
	}
	if !p.follow {
		return
	}
	for q := range 2 {
		if seg := p.seg[q]; p.foot[q] > 0 && (seg == nil || p.base[q] < seg.Ptr || uint64(p.base[q]-seg.Ptr)+p.foot[q] > seg.Size) {
			bad("the arena of pool %d at %v (%d bytes) is outside its segment", q, p.base[q], p.foot[q])
		}
	}
}
