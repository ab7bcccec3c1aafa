// This file holds the allocator's own representation of its statistics,
// laid out for the hot path: counts per stream shard and pool, and the
// peaks of their totals. Only the ledger (ledger.go) changes them.

package allocator

import (
	"math/bits"

	"github.com/gpumem/gpumem/stats"
)

// The quantities whose peaks are tracked: each of the nine metrics in
// each pool and in all (qAll), and the oversize allocations and segments.
const (
	qSmall    = 0 // pool.idx of the small pool
	qLarge    = 1 // pool.idx of the large pool
	qAll      = 2
	numQ      = 3
	oversizeA = int(stats.NumMetrics)     // row of oversize allocations (pool column qSmall only)
	oversizeS = int(stats.NumMetrics) + 1 // row of oversize segments (pool column qSmall only)
	numRows   = int(stats.NumMetrics) + 2
)

// count is one quantity's counts on one shard: its current value, the sum
// of its increases, and its limit: the value it may reach without a new
// peak being possible (see peaks). The sum of its decreases is alloc - cur
// + base, so that a decrease changes one field; base is what makes that
// sum zero after a reset of the cumulative sums.
//
// The rows of active and active_bytes are kept as the pending blocks (and
// bytes) alone: a block is active when it is allocated or pending, so
// active = allocation + pending, and both rise only when a block is
// handed out, so their sums of increases are allocation's. An Alloc then
// updates three counts instead of five, and while a shard has nothing
// pending and its active limits are at least its allocation limits
// (activeImplied), checking allocation's limits checks active's too.
type count struct {
	cur, alloc, base, lim int64
}

// derivedFrom maps the rows kept as pending amounts to the rows they add
// to, plus one (zero: not derived): active = allocation + pending,
// active_bytes = allocated_bytes + pending bytes.
var derivedFrom = [numRows]int{
	stats.Active:      int(stats.Allocation) + 1,
	stats.ActiveBytes: int(stats.AllocatedBytes) + 1,
}

// shardCounts is one metric's counts on one shard, per pool, and the
// limit of the shard's total over both pools (whose current value is the
// sum of the pools').
type shardCounts struct {
	pool   [2]count
	allLim int64
}

// Peaks and limits. The peak of a quantity is the highest value its total
// over every shard has reached. Each shard may let its own value rise to
// its limit without looking at the others, because the limits add up to
// at most the peak: whatever the order of the shards' changes, the total
// stays at or below the peak. When a change passes a shard's limit,
// exceed computes the total over every shard, raises the peak if the
// total passes it, and hands out new limits that again add up to at most
// the peak. With one shard its limit is the peak itself, and passing it
// is just a new peak.
//
// Invariants (checked by the invariant checker): for every quantity,
// cur <= lim on every shard, and the limits of all shards add up to at
// most the peak, which is at least the total.
type peaks [numRows][numQ]int64

// globalCounts is what only the slow paths count, and the peaks: changed
// in the world, or, with one shard, under its lock (exceedRows).
type globalCounts struct {
	peak peaks

	numAllocRetries   int64
	numOOMs           int64
	numSyncAllStreams int64
	numDeviceAlloc    int64
	numDeviceFree     int64

	maxSplitSize int64 // the setting, -1 when unlimited
}

// bump adds n > 0 to pool k and reports whether the pool's or the
// total's limit is passed (then the caller runs exceedRows).
func (s *shardCounts) bump(k int, n int64) bool {
	c := &s.pool[k&1]
	c.cur += n
	c.alloc += n
	return c.cur > c.lim || s.pool[0].cur+s.pool[1].cur > s.allLim
}

// move adds n, which may be negative or zero, to pool k, and reports
// whether a limit is passed, as bump.
func (s *shardCounts) move(k int, n int64) bool {
	if n > 0 {
		return s.bump(k, n)
	}
	s.pool[k&1].cur += n
	return false
}

// drop subtracts n > 0 from pool k.
func (s *shardCounts) drop(k int, n int64) { s.pool[k&1].cur -= n }

// increase adds n > 0 to quantity row, pool k of shard sh.
func (a *Allocator) increase(sh *shard, row, k int, n int64) {
	if sh.st[row].bump(k, n) {
		d := opDelta{k: k}
		d.row[row] = n
		a.exceedRows(sh, k, 1<<row, &d)
	}
}

// decrease subtracts n > 0 from quantity row, pool k of shard sh.
func (sh *shard) decrease(row, k int, n int64) { sh.st[row].drop(k, n) }

// activeOver reports whether shard sh's active or active bytes in pool k
// (or in all) passed a limit, for an Alloc that is not sure
// (!sh.activeImplied).
func (sh *shard) activeOver(k int) bool {
	for _, row := range [2]int{int(stats.Active), int(stats.ActiveBytes)} {
		if sh.value(row, k) > *sh.limit(row, k) || sh.value(row, qAll) > *sh.limit(row, qAll) {
			return true
		}
	}
	return false
}

// Rows as bit sets, for exceedRows. An Alloc that passes a limit of
// allocation passes active's with it when active follows allocation
// (activeImplied), so it names the active rows too.
const (
	activeRows = 1<<stats.Active | 1<<stats.ActiveBytes
	splitRows  = 1<<stats.InactiveSplit | 1<<stats.InactiveSplitBytes
	phaseRow   = 1 << numRows // the counts of the block's phase (phases.go)
)

// refreshImplied recomputes sh.activeImplied.
func (sh *shard) refreshImplied() { sh.activeImplied = sh.impliedNow() }

// impliedNow reports whether the shard has nothing pending and its active
// limits are at least its allocation limits.
func (sh *shard) impliedNow() bool {
	for _, row := range [2]int{int(stats.Active), int(stats.ActiveBytes)} {
		base := derivedFrom[row] - 1
		for k := range numQ {
			if k < qAll && sh.st[row].pool[k].cur != 0 || *sh.limit(row, k) < *sh.limit(base, k) {
				return false
			}
		}
	}
	return true
}

// opDelta is what one operation changed in one shard's counts: by row, in
// pool column k (the oversize rows in column qSmall). A shard that leaves
// a cut waiting keeps its operation's (shard.cutOp), so that the cut can
// count it at its place among the other waiting operations.
//
// While blocks are counted by phase (phased), it holds the change of the
// block's phase too: its bytes and blocks (ph).
type opDelta struct {
	k      int
	row    [numRows]int64
	phased bool
	phase  uint16
	ph     [2]int64
}

// of returns the change of quantity (row, col), the derived rows (active =
// allocation + pending) and the all column included.
func (d *opDelta) of(row, col int) int64 {
	v := d.row[row]
	if dr := derivedFrom[row]; dr != 0 {
		v += d.row[dr-1]
	}
	c := d.k
	if row >= oversizeA {
		c = qSmall
	}
	if col == qAll || col == c {
		return v
	}
	return 0
}

// exceedRows runs after an operation d, on pool k of shard sh, passed a
// limit of one of the rows in the bit set rows. With one shard, whose
// limits are the peaks, it raises each passed limit and peak to the
// value; with several, it runs exceed for every quantity of those rows
// past its limit, in the world, or leaves a cut waiting with d.
//
// With one shard the active limits stay at least the allocation limits
// (active, allocation + pending, is never below allocation, and passing an
// allocation limit with nothing pending passes the active limit too), so
// activeImplied changes only with pending blocks.
func (a *Allocator) exceedRows(sh *shard, k int, rows uint32, d *opDelta) {
	if len(a.shards) == 1 {
		if rows&phaseRow != 0 {
			a.raisePhasePeaks(sh, d.phase)
			rows &^= phaseRow
		}
		k &= 1
		for ; rows != 0; rows &= rows - 1 {
			row := bits.TrailingZeros32(rows) % numRows
			col := k
			if row >= oversizeA {
				col = qSmall // the oversize stats have one column
			}
			s, peak := &sh.st[row], &a.gst.peak[row]
			v, all := s.pool[col].cur, s.pool[0].cur+s.pool[1].cur
			if d := derivedFrom[row]; d != 0 {
				base := &sh.st[(d-1)%numRows]
				v += base.pool[col].cur
				all += base.pool[0].cur + base.pool[1].cur
			}
			if v > s.pool[col].lim {
				s.pool[col].lim, peak[col] = v, v
			}
			if all > s.allLim {
				s.allLim, peak[qAll] = all, all
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
	if rows&phaseRow != 0 {
		a.exceedPhaseLocked(sh, d.phase)
		rows &^= phaseRow
	}
	for ; rows != 0; rows &= rows - 1 {
		row := bits.TrailingZeros32(rows)
		for c := range numQ {
			if sh.value(row, c) > *sh.limit(row, c) {
				a.exceed(sh, row, c)
			}
		}
	}
	sh.refreshImplied()
}

// value returns shard sh's current value of quantity row in pool k
// (qAll for the sum of the pools).
func (sh *shard) value(row, k int) int64 {
	v := sh.st[row].value(k)
	if d := derivedFrom[row]; d != 0 {
		v += sh.st[d-1].value(k)
	}
	return v
}

// value returns the pool k's count (qAll: the sum of the pools).
func (s *shardCounts) value(k int) int64 {
	if k == qAll {
		return s.pool[0].cur + s.pool[1].cur
	}
	return s.pool[k].cur
}

// limit returns a pointer to shard sh's limit of quantity row in pool k.
func (sh *shard) limit(row, k int) *int64 {
	if k == qAll {
		return &sh.st[row].allLim
	}
	return &sh.st[row].pool[k].lim
}

// exceed runs when shard sh's value of quantity (row, k) passed its
// limit: it raises the peak to the total if the total passed it, and
// gives the shard a limit it is within again. When the other shards'
// limits leave too little room, they shrink to their current values.
func (a *Allocator) exceed(sh *shard, row, k int) {
	peak := &a.gst.peak[row][k]
	var total, others int64
	for _, o := range a.shards {
		total += o.value(row, k)
		if o != sh {
			others += *o.limit(row, k)
		}
	}
	*peak = max(*peak, total)
	if others+sh.value(row, k) > *peak {
		others = 0
		for _, o := range a.shards {
			if o != sh {
				*o.limit(row, k) = o.value(row, k)
				others += o.value(row, k)
				// Its active limits may be below its allocation limits now:
				// it checks them until unlockAll (or its next cut) looks again.
				o.activeImplied = false
			}
		}
	}
	*sh.limit(row, k) = *peak - others
}

// resetLimitsLocked sets every shard's limits to its current values and
// the peaks to the totals (the start after a peak reset).
func (a *Allocator) resetLimitsLocked() {
	for row := range numRows {
		for k := range numQ {
			var total int64
			for _, o := range a.shards {
				v := o.value(row, k)
				total += v
				*o.limit(row, k) = v
			}
			a.gst.peak[row][k] = total
		}
	}
	for _, o := range a.shards {
		o.refreshImplied()
	}
	a.resetPhasePeaksLocked()
}

// stats returns the counters as the stats.DeviceStats callers see.
func (a *Allocator) statsLocked() stats.DeviceStats {
	g := &a.gst
	d := stats.DeviceStats{
		NumAllocRetries:   g.numAllocRetries,
		NumOOMs:           g.numOOMs,
		NumSyncAllStreams: g.numSyncAllStreams,
		NumDeviceAlloc:    g.numDeviceAlloc,
		NumDeviceFree:     g.numDeviceFree,
		MaxSplitSize:      g.maxSplitSize,
	}
	for m := range stats.NumMetrics {
		arr := d.Of(m)
		a.sumLocked(int(m), arr)
	}
	var over stats.StatArray
	a.sumLocked(oversizeA, &over)
	d.OversizeAllocations = over[stats.SmallPool]
	d.OversizeAllocations.Peak = g.peak[oversizeA][qSmall]
	a.sumLocked(oversizeS, &over)
	d.OversizeSegments = over[stats.SmallPool]
	d.OversizeSegments.Peak = g.peak[oversizeS][qSmall]
	return d
}

// sumLocked adds up quantity row over the shards into arr.
func (a *Allocator) sumLocked(row int, arr *stats.StatArray) {
	*arr = stats.StatArray{}
	for _, o := range a.shards {
		for k, c := range o.st[row].pool {
			s := &arr[statPool(k)]
			cur, alloc := o.value(row, k), c.alloc
			if d := derivedFrom[row]; d != 0 {
				alloc = o.st[d-1].pool[k].alloc
			}
			s.Current += cur
			s.Allocated += alloc
			s.Freed += alloc - cur + c.base
		}
	}
	all := &arr[stats.All]
	for _, p := range [2]stats.Pool{stats.SmallPool, stats.LargePool} {
		all.Current += arr[p].Current
		all.Allocated += arr[p].Allocated
		all.Freed += arr[p].Freed
	}
	arr[stats.SmallPool].Peak = a.gst.peak[row][qSmall]
	arr[stats.LargePool].Peak = a.gst.peak[row][qLarge]
	arr[stats.All].Peak = a.gst.peak[row][qAll]
}

// statPool maps a pool column (qSmall, qLarge) to its stats.Pool.
func statPool(k int) stats.Pool {
	if k == qSmall {
		return stats.SmallPool
	}
	return stats.LargePool
}

// resetPeakLocked makes every peak equal to its current value
// (torch.cuda.reset_peak_memory_stats).
func (a *Allocator) resetPeakLocked() { a.resetLimitsLocked() }

// resetAccumulatedLocked zeroes the cumulative sums and counters
// (torch.cuda.reset_accumulated_memory_stats), as the stats package's
// table says: it resets a DeviceStats and loads back the counters; the
// cumulative sums all become zero.
func (a *Allocator) resetAccumulatedLocked() {
	d := a.statsLocked()
	d.ResetAccumulated()
	for _, o := range a.shards {
		for row := range o.st {
			for k := range o.st[row].pool {
				c := &o.st[row].pool[k]
				c.alloc, c.base = 0, o.value(row, k)
			}
		}
	}
	for _, o := range a.shards {
		for i := range o.ph {
			for _, c := range []*count{&o.ph[i].bytes, &o.ph[i].blocks} {
				c.alloc, c.base = 0, c.cur
			}
		}
	}
	g := &a.gst
	g.numAllocRetries, g.numOOMs, g.numSyncAllStreams = d.NumAllocRetries, d.NumOOMs, d.NumSyncAllStreams
	g.numDeviceAlloc, g.numDeviceFree = d.NumDeviceAlloc, d.NumDeviceFree
}
