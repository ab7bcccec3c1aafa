// This file holds the planned policy: the low_fragmentation policy with
// one pool that, once a step repeats the one before it (or fits within
// the steps before it), serves the steps that fit it from an arena laid
// out for that step in advance. Its record of a step and the step
// boundary are in policy_plan_steps.go, the table that matches its frees
// with its allocations in policy_plan_live.go, the block below each
// place that a served request starts from, and where a walk to a place
// with none starts, in policy_plan_below.go, the packing of a step in
// policy_plan_pack.go.

package allocator

import (
	"math"
	"slices"

	"github.com/gpumem/gpumem/allocator/internal/freeindex"
	"github.com/gpumem/gpumem/device"
)

// The planned policy (PolicyPlanned, gpumem_policy:planned) runs as the
// low_fragmentation policy with one pool (with virtual memory, every
// request goes to the large pool's 2 MiB pages: onePoolLocked) and
// watches the steps MarkStep delimits, or, in a program that marks none,
// the steps it finds where the order of its allocations and frees
// repeats, whatever their sizes (autoSteps, policy_plan_auto.go), whose
// boundaries it marks itself:
//
//   - Recording: from the first step boundary on, every block handed out
//     and every free of the step is logged (its position among the step's
//     allocations, its address, its rounded size, its stream) while the
//     step may still fit the envelope (below), which its packing needs;
//     otherwise (the first step, a step that outgrew the envelope, one
//     under a plan) the rounded sizes and the stream alone, all that the
//     boundary reads of such a step, and of a step that has the plan's
//     sizes so far only their count (planState.recSame).
//   - Planning: at a boundary, if the step just seen fits the envelope
//     of the steps before it (as many allocations on its main stream, the
//     one with most of them, and side ones, on other streams, at the same
//     positions: sideSize; none larger than the envelope's at its
//     position: the step before
//     it, or, where the steps before it had as many allocations on one
//     stream with sizes that went up and down, as batches of varying
//     length make them, the largest of their sizes at each position),
//     the blocks allocated and freed within the step are packed offline
//     (internal/pack: in the order its blocks come into use a step the
//     program marks, by first fit where that lies more than 1 % above
//     the step's peak, and again by first fit if that arena finds no
//     room; greedy by size, by best fit, one the policy finds; a plan
//     under which a step skips a request is packed again by best fit; a
//     step whose packing by size would read more placed blocks than
//     packBudget, in time order: packReqs)
//     into one arena, in the large pool, with the
//     envelope's sizes: an offset for each. A step that repeats the one
//     before it fits it; steps whose sizes only grow (a cache that grows
//     by a token a step) never do.
//     Blocks of every size share the arena (the one pool), since small
//     and large blocks peak at different times: BERT's step peaks at 1,313 MB, its small
//     blocks alone at 80 MB, and two arenas would take their sum. Blocks
//     that outlive the step (weights, optimizer state, anything kept for
//     the next step) and blocks allocated before it stay out of the plan
//     and are served online.
//   - Arena: an address range of free, mapped memory of the large pool
//     and the stream, as long as the packing's footprint (whole pages):
//     the range it had, if still wholly free; else the top of the
//     best-fitting free block (a request served online takes the lowest
//     address of the block that fits it: it carves the block's low end,
//     not the arena); else the stream's free pages are unmapped and the
//     policy's growth maps the footprint, and no page ahead of it, if
//     the device's memory holds it. When it cannot, the step runs online
//     and the next boundary tries again. The arena is ordinary cached
//     memory: reserved bytes (segments' pages), free blocks of its
//     segment, so the stats keep their meaning.
//   - Serving: while the step follows the plan (the n-th allocation has
//     the plan's stream and at most its rounded size), a planned request
//     is handed the block at its offset in the arena, carved out of the
//     free block that holds it (freeindex.Index.Carve): no fit, no device
//     call. A request smaller than the plan's (a last batch that is
//     smaller) takes the start of its place; the rest stays free. That free
//     block is found from the block handed out in the step for the
//     request whose place lies just below, in use then (planReq.below,
//     worked out when the step is planned): its next block, as the plan
//     has it; where none lies below, a walk from the block that holds
//     the arena's address or from the one last handed out, the nearer
//     (walkStart). The first carve takes the free block it carves from
//     out of the free index and holds its range (the free index's held
//     arena):
//     the carves after it and the frees of the range's blocks change the
//     segment's list of blocks alone, until any other use of the index
//     (a fit, a free elsewhere, a walk of the world) files the range's
//     free blocks back, as it settles a pending split; the next carve
//     holds again. A request of a position the plan leaves out is served
//     online.
//   - Skip: a request whose range in the arena is not wholly free (a
//     block of the plan that lives longer in this step than in the step
//     planned, a block of the previous step still live, an online block
//     that landed there, pages reclaimed) is served online, and the step
//     goes on following the plan.
//   - Side streams: a step's allocations on other streams than its main
//     one (an input copied on a stream of its own, a collective's buffer)
//     keep their positions in the plan and are served online; they are
//     no blocks of the arena, which is the main stream's. Steps the
//     program marks only: a step found without marks that allocates on
//     another stream is no pattern (the search's boundaries fall at
//     other places among the other streams' allocations from one step to
//     the next).
//   - Departure: a request larger than the plan's, one on another stream
//     than the plan's at its position, one past the plan's end, or one whose arena's segment was released,
//     ends the plan for the rest of the step: it and the requests after
//     it are served online, without error. A step with the plan's pattern
//     (rounded sizes, order, stream), or one that fits it (as many
//     allocations on its stream, none larger than the plan's at its
//     position: fitsPlan), keeps the plan, served or not; at the end of
//     any other the plan ends, that step grows the envelope (or, with
//     another count or stream, is the envelope), and the next step that
//     fits it is planned; but a step of another shape (another count of
//     allocations, another main stream: an optimizer's step every
//     few micro-batches, an evaluation every few steps) right after a
//     step that kept the plan spares it for the next step. A program
//     whose steps shrink for good keeps the plan, and its arena sized for
//     the larger steps, until a step departs.
//   - Kept plans: a plan that ends is kept, as it was (its requests and
//     offsets, not its arena), the last maxKeptPlans of them
//     (policy_plan_kept.go). A step that fits a kept plan (and the
//     envelope it would grow), at a boundary where no plan is built, or
//     where a kept plan covers the envelope that would be packed, takes
//     that plan up again, packed already: training after an evaluation
//     of several steps is served from its second step back, with no
//     packing. A plan packed drops the kept plans it covers.
//   - Crowded plans: blocks that outlive a planned step can take its
//     places at every step (a KV cache that grows by a token, its sizes
//     rounded alike over several steps: the steps repeat, the caches
//     they keep land in the arena). A step that followed the plan and
//     skipped more requests than it was served drops the plan, not kept,
//     and quiet steps follow, 2^k after the k-th drop (planState.crowded);
//     an arena that had to be mapped anew k times is mapped anew again
//     only 2^k boundaries after the last, the steps before it running
//     online where it is not whole (planState.moves). Without them a
//     rounded KV workload unmapped and mapped an arena at every boundary
//     (TestPlannedRoundedKVSteps).
//
// The policy's fast paths run as under low_fragmentation: the plan is
// asked first by its fit (policyFitLocked, planFitLocked), and the ledger
// logs each block handed out and each free requested for the plan, as it
// does for the step counts, under the shard's lock (the plan, like the
// rest of the policy's state, is the default shard's while that shard is
// the only one, and the world's after).

// planOp is one operation of the recorded step: the allocation of the
// step's pos-th block at ptr, or (pos -1) the free of the block at ptr,
// which the step may not have allocated. The log is appended to, and
// the frees matched with their allocations only when a step is planned,
// so that logging costs an Alloc or a Free no map.
type planOp struct {
	ptr device.Ptr
	pos int32
}

// planReq is the plan for the step's pos-th allocation.
type planReq struct {
	size  uint64 // rounded
	off   uint64 // offset in the arena, when arena
	arena bool   // allocated and freed within the planned step: served from the arena
	// below is the position of the request whose block lies just below
	// this one's place in the arena when it is requested (of the arena's
	// blocks then in use in the plan, the one at the highest offset
	// below), -1 when there is none: the walk to the place starts from
	// that request's block in the step (its at), in use then, whose next
	// block is, as the plan has it, the free block holding the place.
	below int32
	// at is the struct of the block last handed out for this request: a
	// start for the next step's walk to the same place, when it is still
	// a block of the arena's segment holding that place.
	at *freeindex.Block
	// start, end: when arena, the operations of the step planned (its
	// allocations and frees, counted from its boundary) that allocated
	// and freed the block: its lifetime in the packing, kept for a
	// packing again (packReqs).
	start, end int32
}

// planState is the planned policy's state (policyState.plan), changed in
// the world, or by the fast paths of the default stream's shard while it
// is the only one (whose lock the world holds too).
type planState struct {
	// The step being recorded since the last boundary.
	recording bool
	// logOps: the step's operations are logged in rec, as they are
	// while there is no plan and the step may still fit the envelope
	// (prevSize), the one case where they are read: planned, packed from
	// them. A step recorded under a plan is never planned: one that fits
	// the envelope, the plan's sizes then, keeps the plan (any other
	// ends it): its sizes and stream are compared, its operations never
	// read. Nor is a step with no envelope to fit, or one that outgrew
	// it (stopOpsLocked).
	logOps bool
	// same, recSame: under a plan, same is the plan's sizes until the
	// step logs a size (nil otherwise), and the step's first recSame
	// allocations had them (same[:recSame]) on the plan's stream: they
	// are not copied into recSize, which stays empty; the first that
	// differs copies them there, and the log goes on as usual (a
	// boundary copies them too). A step that follows the plan appends
	// nothing.
	same    []uint64
	recSame int
	rec     []planOp
	recSize []uint64 // by position, the rounded size (sideSize: on a side stream)
	// recStream is the step's main stream: the envelope's (the plan's,
	// under a plan), whose allocations are logged with their sizes, the
	// others' as sideSize; in a step without an envelope, the first
	// allocation's, until its boundary chooses (mainStreamLocked) from
	// recStreams, every allocation's stream (none while all are on
	// recStream: logStream).
	recStream  device.Stream
	recStreams []device.Stream

	// The envelope: by position, the largest rounded size of the steps
	// recorded with allocations, on prevStream as their main stream, since
	// the last with another count of them, side allocations elsewhere,
	// another main stream, or a quiet run; a
	// step that fits it is planned. Under a plan, the plan's sizes and
	// stream: a step that keeps the plan, one that fits it with smaller
	// sizes too, leaves them.
	prevSize   []uint64
	prevStream device.Stream

	// Quiet steps, where steps do not repeat (generation, whose caches
	// grow by a token a step): misses counts the steps in a row, recorded
	// with allocations and without a plan, that fit no envelope; from
	// the fourth on, every second miss is followed by quiet steps that log
	// nothing (recording false), 1, 2, 4, ... up to maxQuiet. A repeat
	// or a plan ends them. The step before a recorded step is recorded
	// too (quiet ends a pair of misses), so a repeat is still found
	// between neighbours, at most maxQuiet+2 steps late.
	misses int
	quiet  int

	// spared: the last step had another shape than the plan's and kept
	// it all the same, once (planStepLocked).
	spared bool
	// grew: the last step had the envelope's count of allocations on its
	// stream and some larger; it grew the envelope (a miss all the same).
	grew bool

	// The plan, nil when there is none.
	reqs    []planReq
	packing packing  // how it is packed (packReqs)
	sizes   []uint64 // by position, the rounded size (reqs[k].size), compared at a boundary
	stream  device.Stream
	foot    uint64             // the arena's bytes (whole pages of the large pool)
	addr    device.Ptr         // the arena's address
	seg     *freeindex.Segment // the arena's segment
	last    *freeindex.Block   // the block last handed out of the arena, where a walk starts
	bottom  *freeindex.Block   // the block that held the arena's address when last found (floor)
	follow  bool               // the current step follows the plan so far
	pos     int                // the next allocation's position in the current step
	asked   bool               // the last position taken is served online: a fast path that misses gives it back

	// auto finds the steps of a program that marks none (nil once it
	// marks one, or without virtual memory, where nothing is planned);
	// autoDue: it put a boundary before the next allocation, which the
	// world marks (autoStepLocked; a fast path leaves it to the world).
	auto    *autoSteps
	autoDue bool

	// bestFit: a step under a plan packed in time order or by first fit
	// skipped a request (stepSkips: the skips counted at the step's
	// boundary); that plan and every plan after it are packed by best
	// fit.
	bestFit   bool
	stepSkips int64

	// moves counts the boundaries at which the plan's arena was mapped
	// anew (unmapped pages and mapped the arena: arenaLocked), and
	// sinceMove the boundaries since the last of them. Blocks that
	// outlive a step can land in the arena and break it at every other
	// boundary (a KV cache that grows by a token, its sizes rounded
	// alike over several steps); mapping it anew each time unmaps and
	// maps at every step, so after k moves the arena is mapped anew only
	// 2^k boundaries after the last, and where it is broken before,
	// the steps run online. A new plan starts with none.
	moves, sinceMove int

	// crowded counts the plans dropped because a step that followed one
	// skipped more requests than it was served (stepServed: the served
	// requests counted at the last boundary). Blocks that outlive such a
	// plan's steps take its places (a KV cache that grows by a token,
	// its sizes rounded alike over several steps): followed, it serves
	// little, and its arena is broken at every boundary. The k-th drop
	// is followed by 2^k quiet steps (at most maxQuiet / 2).
	crowded    int
	stepServed int64

	// Counts, PlanStats' figures but walks: skips counts the requests
	// served online because their place was not wholly free, walks the
	// served requests whose place was not found from the block below it,
	// spares the steps of another shape that spared their plan,
	// timeOrdered the packings in time order of steps too large to pack
	// by size (packLarge).
	plans, served, departures, skips, walks, spares, reuses, repacks, timeOrdered int64

	// kept: the plans that ended, the newest last (policy_plan_kept.go).
	kept []keptPlan
}

// onePoolLocked reports whether every request goes to the large pool
// (Index.Merged): under the planned policy with virtual memory, where both
// pools are made of 2 MiB pages. One pool wastes less than two, whose
// pages each hold the rest of the other's, and maps fewer pages: on
// eor_cnn's many tiny blocks the smallest fitting device falls from 1.046
// to 1.007 times the peak requested, on bert_b2 the device calls from 278
// to 106. The arena of a plan holds blocks of every size, too.
func (a *Allocator) onePoolLocked() bool {
	return a.pol != nil && a.pol.plan != nil && a.vm != nil
}

// planFitLocked is step 4 of the allocation ladder under the planned
// policy, before the fit (policyFitLocked, on the fast path too): the
// block planned for a request of rounded bytes whose fit would search x,
// carved out of the arena at its place, in no index and exactly rounded
// bytes (at most the plan's: a smaller request takes the start of its
// place), which takeLocked hands out without a split; nil when the step
// stops following the plan here, or when the request's position is
// served online (a fast path that then misses gives the position back,
// unplanLocked, as the world asks again).
func (a *Allocator) planFitLocked(x *freeindex.Index, rounded uint64) *freeindex.Block {
	p := a.pol.plan
	k := p.pos
	p.pos++
	p.asked = false
	if k >= len(p.reqs) {
		return p.departLocked()
	}
	r := &p.reqs[k]
	if x.Stream() != p.stream && r.size == sideSize {
		p.asked = true // a side allocation where the plan has one: online
		return nil
	}
	// sideSize is below every rounded size: a main allocation where the
	// plan has a side one departs, as a larger one does.
	if x.Stream() != p.stream || r.size < rounded || x.PoolIdx() != qLarge {
		return p.departLocked()
	}
	if !r.arena {
		p.asked = true
		return nil
	}
	ptr := p.addr + device.Ptr(r.off)
	var b *freeindex.Block
	if r.below >= 0 {
		// The block just below the place, handed out in this step and in
		// use, is a block of the segment unless the caller freed it
		// early (its struct then merged away, or the merged free block).
		// Busy (allocated, or freed with events pending), a struct of the
		// segment is one of its blocks (a block leaves the list only
		// free), and the place is most often in the block after it.
		switch c := p.reqs[r.below].at; {
		case c != nil && c.Seg() == p.seg && c.Busy():
			if n := c.Next(); n != nil && n.Ptr() <= ptr && ptr+device.Ptr(rounded) <= n.Ptr()+device.Ptr(n.Size()) {
				// The common case, the place in the block after it,
				// whose segment is the arena's.
				if !n.IsFree() || p.seg.Free() != x {
					return p.skipLocked()
				}
				return p.serveLocked(x, r, n, ptr, rounded)
			}
			b = freeindex.Containing(c, ptr)
		case freeindex.InSegment(c, p.seg):
			b = freeindex.Containing(c, ptr)
		}
	}
	if b == nil {
		if h := p.seg.Head(); h == nil || h.Seg() != p.seg {
			// The arena's segment was released (EmptyCache): its head
			// went back to the spares. (A block below in use holds it.)
			return p.departLocked()
		}
		p.walks++
		if b = r.at; !freeindex.InSegment(b, p.seg) || ptr < b.Ptr() || ptr >= b.Ptr()+device.Ptr(b.Size()) {
			b = freeindex.Containing(p.walkStart(ptr), ptr)
		}
	}
	if b == nil || !b.IsFree() || b.Ptr()+device.Ptr(b.Size()) < ptr+device.Ptr(rounded) || b.Seg().Free() != x {
		return p.skipLocked()
	}
	return p.serveLocked(x, r, b, ptr, rounded)
}

// serveLocked serves the request r from b, a free block of x that holds
// its place [ptr, ptr+rounded): the block carved there.
func (p *planState) serveLocked(x *freeindex.Index, r *planReq, b *freeindex.Block, ptr device.Ptr, rounded uint64) *freeindex.Block {
	p.served++
	b = x.Carve(b, ptr, rounded)
	r.at, p.last = b, b
	return b
}

// departLocked ends the plan for the rest of the step: the request and
// those after it are served online.
func (p *planState) departLocked() *freeindex.Block {
	p.follow = false
	p.departures++
	return nil
}

// skipLocked serves the current request online, its place in the arena
// not wholly free (a block of the plan that lives longer in this step
// than in the step planned, or a block served online that landed
// there); the step goes on following the plan.
func (p *planState) skipLocked() *freeindex.Block {
	p.skips++
	p.asked = true
	return nil
}

// unplanLocked gives back the position that the last planFitLocked took
// for a request served online, when the fast path that asked misses and
// the world asks again.
func (p *policyState) unplanLocked() {
	if p.plan != nil && p.plan.asked {
		p.plan.pos--
		p.plan.asked = false
	}
}

// buildPlanLocked plans the recorded step with the rounded sizes sizes,
// by position (the envelope's: each at least the step's own): the blocks
// it allocated and freed get offsets in the arena, with the lifetimes
// the step gave them; the others, and the side allocations (sideSize),
// are served online. A step with no allocation, or with sizes not
// one for each allocation, or of more than 2^31 - 1 operations (the
// lifetimes kept are 32-bit), leaves no plan; so does any step on a device
// without virtual memory, whose plain segments count their split blocks
// (inactive_split), which a carve would change.
func (a *Allocator) buildPlanLocked(sizes []uint64) {
	p := a.pol.plan
	p.reqs, p.packing = nil, packBest
	n := len(p.recSize)
	if n == 0 || a.vm == nil || len(sizes) != n || len(p.rec) > math.MaxInt32 {
		return
	}
	reqs := make([]planReq, n)
	for k, size := range sizes {
		reqs[k] = planReq{size: size, below: -1, start: -1, end: -1}
	}
	live := newLiveTable(n)
	for t, op := range p.rec {
		if op.pos >= 0 {
			reqs[op.pos].start = int32(t)
			live.slot(op.ptr).pos = op.pos + 1
		} else if s := live.find(op.ptr); s != nil && s.pos > 0 { // a block the step allocated
			reqs[s.pos-1].end = int32(t)
			s.pos = 0
		}
	}
	for k := range reqs {
		reqs[k].arena = reqs[k].end >= 0 && reqs[k].size != sideSize
	}
	want := markedPacking
	if p.bestFit || p.auto != nil {
		want = packBest
	}
	fp, got := packReqs(reqs, want)
	if got == packLarge {
		p.timeOrdered++
	}
	p.foot = pagesFor(fp, a.pol.largePage)
	p.reqs, p.stream, p.packing = reqs, p.recStream, got
	p.sizes = append(p.sizes[:0], sizes...)
	p.moves = 0
	p.plans++
}

// checkPlanLocked adds the planned policy's invariants to
// CheckInvariants: with virtual memory every stream's small-pool index is
// merged into the large pool's and holds no segment (without, none is
// merged); every planned block lies within the arena, and the arena
// within a segment of the large pool; the sizes a boundary compares are
// the plan's.
func (a *Allocator) checkPlanLocked(bad func(format string, args ...any)) {
	p := a.pol.plan
	a.checkAutoLocked(bad)
	a.checkKeptLocked(bad)
	one := a.onePoolLocked()
	merged := func(xs *[2]freeindex.Index) {
		if xs[qSmall].Merged != one || one && xs[qSmall].NSeg() != 0 {
			bad("stream %d's small-pool index: merged %v with %d segments; one pool: %v", xs[qSmall].Stream(), xs[qSmall].Merged, xs[qSmall].NSeg(), one)
		}
	}
	for _, sh := range a.shards {
		if !sh.cold {
			merged(&sh.free)
		}
	}
	for _, xs := range a.coldIdx {
		merged(xs)
	}
	if p.logOps && len(p.rec) < len(p.recSize) || !p.logOps && len(p.rec) > 0 {
		bad("the planned policy logged %d operations for %d allocations (logging them: %v)", len(p.rec), len(p.recSize), p.logOps)
	}
	if p.logOps && (len(p.prevSize) == 0 || !fitsSoFar(p.recSize, p.prevSize) || len(p.recSize) > 0 && p.recStream != p.prevStream) {
		bad("the planned policy logs the operations of a step that cannot fit the envelope (%d sizes on stream %d, the envelope's %d on stream %d)", len(p.recSize), p.recStream, len(p.prevSize), p.prevStream)
	}
	if len(p.recStreams) > 0 && (len(p.prevSize) > 0 || len(p.recStreams) != len(p.recSize)) {
		bad("the planned policy logs %d streams for a step of %d allocations (an envelope of %d)", len(p.recStreams), len(p.recSize), len(p.prevSize))
	}
	if p.recSame > len(p.same) || p.same != nil && (p.logOps || len(p.recSize) > 0 || !slices.Equal(p.same, p.sizes)) {
		bad("the planned policy counts %d allocations as the plan's (%d sizes) beside %d logged (logging operations: %v; the plan's sizes: %d)", p.recSame, len(p.same), len(p.recSize), p.logOps, len(p.sizes))
	}
	if p.quiet < 0 || p.quiet >= maxQuiet || p.quiet > 0 && (p.recording || p.reqs != nil) ||
		!p.recording && (p.logOps || len(p.recSize) > 0 || p.recSame > 0) {
		bad("the planned policy has %d quiet steps to come (recording: %v, logging operations: %v, %d sizes logged, %d counted as the plan's, a plan: %v)",
			p.quiet, p.recording, p.logOps, len(p.recSize), p.recSame, p.reqs != nil)
	}
	if p.reqs != nil && (!slices.Equal(p.prevSize, p.sizes) || p.prevStream != p.stream) {
		bad("the envelope has %d sizes on stream %d, not the plan's %d on stream %d", len(p.prevSize), p.prevStream, len(p.sizes), p.stream)
	}
	if p.spared && p.reqs == nil {
		bad("the planned policy spared a plan it does not have")
	}
	if p.reqs == nil {
		return
	}
	if len(p.sizes) != len(p.reqs) {
		bad("the plan has %d sizes for %d allocations", len(p.sizes), len(p.reqs))
	}
	for k, r := range p.reqs {
		if r.arena && r.off+r.size > p.foot {
			bad("the plan's allocation %d ends at %d, past its arena's %d bytes", k, r.off+r.size, p.foot)
		}
		if k < len(p.sizes) && p.sizes[k] != r.size {
			bad("the plan's allocation %d has %d bytes, its size %d", k, r.size, p.sizes[k])
		}
	}
	if !p.follow || p.foot == 0 {
		return
	}
	if seg := p.seg; seg == nil || seg.Pool().Small() || p.addr < seg.Ptr() || uint64(p.addr-seg.Ptr())+p.foot > seg.Size() {
		bad("the arena at %v (%d bytes) is outside a segment of the large pool", p.addr, p.foot)
	}
}
