// This file holds the low_fragmentation policy's placement and growth:
// the fit among close candidates, where pages are mapped into expandable
// segments, and the free pages unmapped first so that reserved memory
// does not outgrow what is requested.

package allocator

import (
	"fmt"
	"slices"

	"github.com/gpumem/gpumem/allocator/internal/freeindex"
	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/stats"
)

// policyFitLocked is step 4 under the low_fragmentation policy: every
// search counts in its pool's clock of block ages, and in the large pool
// the best fit gives way to the block at the lowest address among at most
// fitWindow free blocks from it up, none more than an eighth larger, that
// max_split_size lets serve the request: live blocks then gather at the
// low end of the address space and free memory at the high end, where it
// forms whole pages that growth reuses and reclaim unmaps in few calls
// (address-ordered fits fragment less than pure best fit). The rule of
// expandable segments follows. One search finds the best fit; the window
// walks on from there, a size at a time (freeindex.Index.FitClose). The
// caller checks that the block may serve the request.
func (a *Allocator) policyFitLocked(x *freeindex.Index, size uint64) *freeindex.Block {
	if p := a.pol.plan; p != nil {
		if p.autoDue && !a.world {
			x.Pool().GCCalls++ // the fast path that misses gives it back
			return nil         // a step starts: the world marks it (allocWorld)
		}
		if p.follow {
			if b := a.planFitLocked(x, size); b != nil {
				return b // planned policy: the block planned for it
			}
		}
	}
	x.Pool().GCCalls++
	var b *freeindex.Block
	if window := a.pol.fitWindow; window > 1 && !isSmall(size) {
		b = x.FitClose(size, 3, a.rule.servesBelow(size), window) // none more than an eighth larger
	} else {
		b = x.Fit(size)
	}
	if b == nil {
		return nil
	}
	if freeindex.CanGrow(b) { // an expandable segment's block; else the rule keeps b
		b = freeindex.ExpandableBestFit(x, b)
	}
	return b
}

// placement is where growth maps pages: n bytes at offset off of the
// unmapped range u, which then merge with the free blocks beside them
// into one block of at least the size asked.
type placement struct {
	u      *freeindex.Block
	off, n uint64
	fresh  bool // u is the only block of a segment reserved for this growth
}

// policyGrowLocked is growLocked under the low_fragmentation policy, with
// expandable segments. It finds where the fewest pages need mapping;
// before growth that would raise reserved memory above the high-water
// mark and above the slack over the peak of requested bytes, or past the
// cap, or when the device refuses, it unmaps free pages of the pool
// elsewhere; with ahead, it maps up to mapAhead bytes more while that
// stays within the slack (a plan's arena, the whole of a step's need,
// maps none). Under the planned policy the two bounds are never below
// those of a roomy device (roomyLimitsLocked). It returns a free block
// of at least size bytes, in the free index.
func (a *Allocator) policyGrowLocked(x *freeindex.Index, size uint64, ahead bool) (*freeindex.Block, error) {
	pl, err := a.placeLocked(x, size)
	if err != nil {
		return nil, err
	}
	pol := a.pol
	if a.allowed > 0 && a.reservedLocked()+pl.n > a.allowed {
		a.reclaimLocked(x, a.reservedLocked()+pl.n-a.allowed, pl.u, false)
		if a.reservedLocked()+pl.n > a.allowed {
			a.dropPlacementLocked(pl)
			return nil, errOverCap
		}
	}
	requested, peak := a.totalLocked(stats.RequestedBytes), uint64(a.peaks.Peak(statRow(int(stats.RequestedBytes), qAll)))
	limit := max(pol.hwm, uint64((1+pol.slack)*float64(max(requested+size, peak))))
	keep, upTo := limit, limit
	if pol.plan != nil {
		k, m := a.roomyLimitsLocked()
		keep, upTo = max(limit, k), max(limit, m)
	}
	if r := a.reservedLocked(); pol.reclaim && r+pl.n > keep {
		a.reclaimLocked(x, r+pl.n-keep, pl.u, true)
	}
	need := pl
	if ahead {
		a.mapAheadLocked(&pl, upTo)
	}
	m, err := a.mapRangeLocked(pl.u, pl.off, pl.n)
	if refused(err) && pl.n > need.n {
		pl = need // the device has not the pages mapped ahead: map what the request needs
		m, err = a.mapRangeLocked(pl.u, pl.off, pl.n)
	}
	if refused(err) && a.reclaimLocked(x, pl.n, pl.u, false) > 0 {
		m, err = a.mapRangeLocked(pl.u, pl.off, pl.n)
	}
	if err != nil {
		a.dropPlacementLocked(pl)
		return nil, err
	}
	pol.hwm = max(pol.hwm, a.reservedLocked())
	return m, nil
}

// mapAheadLocked widens the placement pl by up to mapAhead bytes, as far
// as reserved memory stays within limit and the unmapped range allows, so
// that the next requests find memory mapped already: forward when it maps
// the start of its range, backward when it maps the end.
func (a *Allocator) mapAheadLocked(pl *placement, limit uint64) {
	r := a.reservedLocked()
	if r+pl.n >= limit || pl.n == pl.u.Size() {
		return
	}
	page := pl.u.Seg().Page()
	extra := min(a.pol.mapAhead, limit-r-pl.n, pl.u.Size()-pl.n) / page * page
	if pl.off > 0 {
		extra = min(extra, pl.off)
		pl.off -= extra
	}
	pl.n += extra
}

// dropPlacementLocked gives back the address range of a segment reserved
// for a growth that failed.
func (a *Allocator) dropPlacementLocked(pl placement) {
	if pl.fresh {
		_ = a.releaseExpandableLocked(pl.u) // a refusal leaves it for a later flush
	}
}

// placeLocked finds where to map pages for a request of size bytes in x
// (a pool on one stream): among the stream's unmapped ranges, the one
// where the fewest bytes need mapping, counting the free blocks just
// before and just after it (lowest address on a tie). With no range that
// can hold the request it reserves a new segment.
func (a *Allocator) placeLocked(x *freeindex.Index, size uint64) (placement, error) {
	p, s := x.Pool(), x.Stream()
	var best placement
	consider := func(u *freeindex.Block, off, n uint64) {
		if best.u == nil || n < best.n {
			best = placement{u: u, off: off, n: n}
		}
	}
	p.AscendUnmapped(s, func(u *freeindex.Block) bool {
		page := u.Seg().Page()
		var before, after uint64
		if u.Prev() != nil && u.Prev().IsFree() {
			before = u.Prev().Size()
		}
		if u.Next() != nil && u.Next().IsFree() {
			after = u.Next().Size()
		}
		if n := pagesFor(size-min(before, size-1), page); n <= u.Size() {
			consider(u, 0, n) // the free block before and the first pages
		}
		if after > 0 {
			if n := pagesFor(size-min(after, size-1), page); n <= u.Size() {
				consider(u, u.Size()-n, n) // the last pages and the free block after
			}
		}
		if before+u.Size()+after >= size {
			consider(u, 0, u.Size()) // the whole range joins both
		}
		return best.n != page // nothing needs less than one page
	})
	if best.u != nil {
		return best, nil
	}
	page := a.pol.largePage
	if p.Small() {
		page = kSmallBuffer
	}
	n := max(a.expandableReserve(page), pagesFor(size, page))
	ptr, err := a.vm.Reserve(n)
	if err != nil {
		if refused(err) {
			return placement{}, err
		}
		return placement{}, fmt.Errorf("allocator: device %d: reserving an expandable segment of %d bytes: %w", a.ordinal, n, err)
	}
	u := x.NewSegment(ptr, n, page)
	a.segmentAddedLocked(u.Seg())
	return placement{u: u, n: pagesFor(size, page), fresh: true}, nil
}

// A candidate is a free block that reclaimLocked may unmap, with the bytes
// of the whole pages inside it.
type candidate struct {
	b     *freeindex.Block
	pages uint64
}

// candidateBefore reports whether reclaim takes x before y: more pages
// first, then the lower address.
func candidateBefore(x, y candidate) bool {
	if x.pages != y.pages {
		return x.pages > y.pages
	}
	return x.b.Ptr() < y.b.Ptr()
}

// smallestSufficient returns the index in list of the candidate with the
// fewest pages at least want, the last such in candidateBefore's order
// (the highest address among equal pages), or -1 if none has want.
func smallestSufficient(list []candidate, want uint64) int {
	best := -1
	for i, c := range list {
		if c.pages >= want && (best < 0 || candidateBefore(list[best], c)) {
			best = i
		}
	}
	return best
}

// firstInOrder moves the first n candidates of list in candidateBefore's
// order to its front, in that order, and returns them (list[:n]); the
// rest of list is left in no order. n is at most len(list).
func firstInOrder(list []candidate, n int) []candidate {
	m := 0 // list[:m] holds the first m of those seen, in order
	for j := range list {
		c := list[j]
		if m == n {
			if !candidateBefore(c, list[n-1]) {
				continue
			}
			m--
		}
		i := m
		for i > 0 && candidateBefore(c, list[i-1]) {
			list[i] = list[i-1]
			i--
		}
		list[i] = c
		m++
	}
	return list[:n]
}

// pagesFor rounds n up to whole pages.
func pagesFor(n, page uint64) uint64 { return (n + page - 1) / page * page }

// mapRangeLocked backs [u.ptr+off, u.ptr+off+n) of the unmapped block u
// with memory (off and n whole pages) and makes it a free block merged
// with free neighbours, which it returns; the rest of u stays unmapped on
// either side. On an error nothing changes.
func (a *Allocator) mapRangeLocked(u *freeindex.Block, off, n uint64) (*freeindex.Block, error) {
	seg := u.Seg()
	ptr := u.Ptr() + device.Ptr(off)
	if err := a.vm.Map(ptr, n); err != nil {
		if refused(err) {
			return nil, err
		}
		return nil, fmt.Errorf("allocator: device %d: mapping %d bytes at %v: %w", a.ordinal, n, ptr, err)
	}
	a.routePagesLocked(seg, ptr, n, +1)
	m := seg.Free().MapPages(u, off, n)
	a.pagesMappedLocked(seg, ptr, n)
	return seg.Free().Put(m), nil
}

// wholePages returns the bytes of the whole pages inside the free
// expandable block b.
func wholePages(b *freeindex.Block) uint64 {
	return pagesAt(uint64(b.Ptr()-b.Seg().Ptr()), b.Size(), b.Seg().Page())
}

// pagesAt returns the bytes of the whole pages of page bytes inside a
// block of size bytes at offset off of its segment.
func pagesAt(off, size, page uint64) uint64 {
	begin := (off + page - 1) / page
	end := (off + size) / page
	if end <= begin {
		return 0
	}
	return (end - begin) * page
}

// reclaimLocked unmaps the whole pages of free blocks of the expandable
// segments of x, keep's pool and stream (only those: taking pages from
// the other pool, or from another stream, makes the two trade them back
// and forth on every step of a repeating workload; lending shares the
// streams' caches instead, without device calls) until want bytes are
// unmapped: the one block with the fewest pages that suffices, else the
// largest first, at most victims blocks when bounded (if that many cannot
// give want bytes, nothing is unmapped), and then blocks freed fewer than
// minAge best-fit searches ago stay (the requests that follow a free tend
// to reuse it: unmapping it would be undone at once). The free blocks
// beside keep, an unmapped range about to be mapped, stay too. It
// returns the bytes unmapped; a device error leaves that block mapped.
func (a *Allocator) reclaimLocked(x *freeindex.Index, want uint64, keep *freeindex.Block, bounded bool) uint64 {
	list := a.victimsLocked(x, want, keep, bounded)
	defer a.clearCandidates()
	var got uint64
	for _, c := range list {
		if got >= want {
			break
		}
		if a.unmapLocked(c.b) == nil {
			got += c.pages
			a.pol.reclaimed++
		}
	}
	return got
}

// victimsLocked returns the blocks reclaimLocked unmaps, in its order,
// until want bytes are unmapped: reclaimLocked's doc says which. The list
// is a part of a.pol.candidates, which holds every candidate found until
// clearCandidates.
func (a *Allocator) victimsLocked(x *freeindex.Index, want uint64, keep *freeindex.Block, bounded bool) []candidate {
	var list []candidate
	if bounded {
		list = a.boundedCandidatesLocked(x, want, keep)
	} else {
		list = a.pol.candidates[:0]
		p := x.Pool()
		// A block smaller than a page holds no whole page.
		x.AscendAtLeast(keep.Seg().Page(), func(b *freeindex.Block) bool {
			if n := a.reclaimable(p, b, keep, false); n > 0 {
				list = append(list, candidate{b, n})
			}
			return true
		})
		a.pol.candidates = list
		a.examined += len(list)
	}
	return chooseVictims(list, want, a.pol.victims, bounded)
}

// reclaimable returns the bytes of the whole pages of b, a free block of
// pool p, that reclaim may unmap: none of keep's neighbours', nor, when
// bounded, of a block freed fewer than minAge searches ago (the next
// requests are likely to reuse it).
func (a *Allocator) reclaimable(p *freeindex.Pool, b, keep *freeindex.Block, bounded bool) uint64 {
	if b == keep.Prev() || b == keep.Next() || bounded && p.GCCalls-b.GCCountBase() < a.pol.minAge {
		return 0
	}
	return wholePages(b)
}

// clearCandidates drops the candidates that victimsLocked found, so that
// the array keeps no free block's struct alive, and empties the list.
func (a *Allocator) clearCandidates() {
	clear(a.pol.candidates)
	a.pol.candidates = a.pol.candidates[:0]
}

// chooseVictims returns the victims among the candidates in list, in the
// order "most pages first, then lowest address" (candidateBefore),
// chosen without sorting the whole list unless all of it may go: the
// one with the fewest pages that suffices, else at most victims when
// bounded (none if they do not give want bytes), else all of them. It
// reorders list and returns a part of it.
func chooseVictims(list []candidate, want uint64, victims int, bounded bool) []candidate {
	if i := smallestSufficient(list, want); i >= 0 {
		list[0] = list[i]
		return list[:1]
	}
	if bounded && len(list) > victims {
		list = firstInOrder(list, victims)
		var sum uint64
		for _, c := range list {
			sum += c.pages
		}
		if sum < want {
			return nil // too many calls for what it saves: let the mark rise
		}
		return list
	}
	slices.SortFunc(list, func(x, y candidate) int {
		if candidateBefore(x, y) {
			return -1
		}
		return 1 // two candidates are two blocks: never equal
	})
	return list
}

// boundedCandidatesLocked returns, for a bounded reclaim of want bytes
// beside keep, the candidates whose choice by reclaimLocked is the same
// as from all of them, found without walking every free block (the walk
// of every block of a page or more cost random_mixed under
// low_fragmentation about 2% of its replay: a hundred blocks a growth).
// The candidates are the blocks with whole pages that a bounded reclaim
// may unmap (reclaimable). Its two walks stop early
// because a block of s bytes holds between minPages(s) and maxPages(s)
// of them:
//
//   - up from want, the one with the fewest pages at least want (the
//     last such in candidateBefore's order), if any: no block beyond the
//     first whose fewest possible pages exceed its pages can take its
//     place;
//   - else down from the largest, every candidate until more than
//     victims are found and the block's most possible pages are fewer
//     than the least of the first victims found (the first victims in
//     candidateBefore's order have at least that many each: so many
//     candidates have): none from there on can be among them.
//
// The list it returns is a.pol.candidates (clearCandidates empties it).
func (a *Allocator) boundedCandidatesLocked(x *freeindex.Index, want uint64, keep *freeindex.Block) []candidate {
	page, p := keep.Seg().Page(), x.Pool()
	var best candidate
	seen := 0
	x.AscendAtLeast(max(page, want), func(b *freeindex.Block) bool {
		if best.b != nil && minPages(b.Size(), page) > best.pages {
			return false
		}
		if n := a.reclaimable(p, b, keep, true); n > 0 {
			seen++
			if c := (candidate{b, n}); n >= want && (best.b == nil || candidateBefore(best, c)) {
				best = c
			}
		}
		return true
	})
	if best.b != nil {
		a.examined += seen
		a.pol.candidates = append(a.pol.candidates[:0], best)
		return a.pol.candidates
	}
	list := a.pol.candidates[:0]
	victims := a.pol.victims
	least := uint64(0) // the fewest pages among the first victims found
	x.DescendBelow(^uint64(0), func(b *freeindex.Block) bool {
		if b.Size() < page || len(list) > victims && maxPages(b.Size(), page) < least {
			return false
		}
		if n := a.reclaimable(p, b, keep, true); n > 0 {
			if len(list) < victims && (len(list) == 0 || n < least) {
				least = n
			}
			list = append(list, candidate{b, n})
		}
		return true
	})
	a.examined += seen + len(list)
	a.pol.candidates = list
	return list
}

// minPages and maxPages bound the bytes of the whole pages of page bytes
// inside a block of size bytes at any multiple of 512: at a page
// boundary it holds size/page pages; 512 bytes past one, a page less
// than (size+512)/page.
func minPages(size, page uint64) uint64 {
	if n := (size + freeindex.MinBlockSize) / page; n > 1 {
		return (n - 1) * page
	}
	return 0
}

func maxPages(size, page uint64) uint64 { return size / page * page }

// roomyLimitsLocked returns the planned policy's floors under the
// bounds on reserved bytes of growth: keep, above which it first unmaps
// free pages elsewhere, is all of the device's memory (or the cap, when
// lower); ahead, up to which it maps ahead, is halfway from reserved
// memory to keep, so that the pages mapped ahead take at most half of
// what the device has left. Below them the device has room: freed pages
// stay mapped, as PyTorch's cache keeps them, and growth maps MapAhead
// bytes ahead of a request whatever the slack over the requested peak,
// so a workload pays few device calls where memory is plentiful. Free
// pages are unmapped only for a growth the device has not the memory
// for: first within reclaim's bounds (at most victims blocks, none freed
// in the last minAge searches), then, if the device still refuses, as
// many of the pool's as the map needs. POLICY.md ("The planned policy",
// "Device calls") has the measurements that chose these floors, and what
// they cost kv_legacy's smallest device.
func (a *Allocator) roomyLimitsLocked() (keep, ahead uint64) {
	c := a.total
	if a.allowed > 0 {
		c = min(c, a.allowed)
	}
	if r := a.reservedLocked(); r < c {
		return c, r + (c-r)/roomyShare
	}
	return c, c
}
