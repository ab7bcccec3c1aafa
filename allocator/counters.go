// This file holds the allocator's own representation of its statistics,
// laid out for the hot path: counts per stream shard and pool, and the
// peaks of their totals; their reads; and the statistics' public methods
// (Stats, ResetPeakStats, ResetAccumulatedStats). The ledger (ledger.go,
// ledger_peaks.go) is the only writer of their values, limits and peaks.

package allocator

import (
	"github.com/gpumem/gpumem/allocator/internal/peaks"
	"github.com/gpumem/gpumem/stats"
)

// The quantities whose peaks are tracked: each of the nine metrics in
// each pool and in all (qAll), and the oversize allocations and segments.
const (
	qSmall    = 0 // freeindex.Pool.Idx of the small pool
	qLarge    = 1 // freeindex.Pool.Idx of the large pool
	qAll      = 2
	numQ      = 3
	oversizeA = int(stats.NumMetrics)     // row of oversize allocations (pool column qSmall only)
	oversizeS = int(stats.NumMetrics) + 1 // row of oversize segments (pool column qSmall only)
	numRows   = int(stats.NumMetrics) + 2
)

// count is one quantity's counts on one shard: its value and limit (the
// peaks' Count), the sum of its increases, and base: the sum of its
// decreases is increases - value + base, so that a decrease changes one
// field; base is what makes that sum zero after a reset of the
// cumulative sums.
//
// The rows of active and active_bytes are kept as the pending blocks (and
// bytes) alone: a block is active when it is allocated or pending, so
// active = allocation + pending, and both rise only when a block is
// handed out, so their sums of increases are allocation's. An Alloc then
// updates three counts instead of five, and while a shard has nothing
// pending and its active limits are at least its allocation limits
// (activeImplied), checking allocation's limits checks active's too.
type count struct {
	peaks.Count
	increases, base int64
}

// decreases returns the sum of the decreases of a count whose value is v
// and whose sum of increases is inc (for a derived row, those of the
// whole quantity).
func (c *count) decreases(v, inc int64) int64 { return inc - v + c.base }

// derivedFrom maps the rows kept as pending amounts to the rows they add
// to, plus one (zero: not derived): active = allocation + pending,
// active_bytes = allocated_bytes + pending bytes.
var derivedFrom = [numRows]int{
	stats.Active:      int(stats.Allocation) + 1,
	stats.ActiveBytes: int(stats.AllocatedBytes) + 1,
}

// shardCounts is one metric's counts on one shard, per pool, and the
// limit of the shard's total over both pools (whose value is the sum of
// the pools').
type shardCounts struct {
	pool   [2]count
	allLim int64
}

// The peaks: every quantity (row, column) and, while blocks are counted
// by phase, the bytes and blocks of every phase are rows of one
// peaks.Table (Allocator.peaks), whose parts are the shards (shardParts,
// ledger.go): the peak of a quantity is the highest value its total over
// every shard has reached. Each shard may let its own value rise to its
// limit without looking at the others, because the limits add up to at
// most the peak; a change that passes a limit runs the table's Exceed in
// the world, or leaves a cut waiting (shards.go), or, with one shard,
// whose limits are the peaks, raises the limit and the peak (Sole). The
// peaks package states the model and its invariants, which the invariant
// checker checks.
const numStatRows = numRows * numQ // the table's rows of stats; the phases' follow

// statRow returns the peaks' row of quantity row in column k.
func statRow(row, k int) int { return row*numQ + k }

// phaseRow returns the peaks' row of phase id's bytes (j = 0) or blocks
// (j = 1), while blocks are counted by phase.
func phaseRow(id uint16, j int) int { return numStatRows + 2*int(id) + j }

// globalCounts is what only the slow paths count, in the world.
type globalCounts struct {
	numAllocRetries   int64
	numOOMs           int64
	numSyncAllStreams int64
	numDeviceAlloc    int64
	numDeviceFree     int64

	maxSplitSize int64 // the setting, -1 when unlimited
}

// activeOver reports whether shard sh's active or active bytes in pool k
// (qSmall or qLarge) or in all passed a limit, for an Alloc that is not
// sure (!sh.activeImplied): shard.value and shard.limit of the rows that
// derivedFrom names, written out (it runs for every Alloc while blocks
// are pending).
func (sh *shard) activeOver(k int) bool {
	st := &sh.st
	k &= 1
	d, b := &st[stats.Active], &st[stats.Allocation]
	db, bb := &st[stats.ActiveBytes], &st[stats.AllocatedBytes]
	return d.pool[k].Value()+b.pool[k].Value() > d.pool[k].Limit() ||
		d.pool[0].Value()+d.pool[1].Value()+b.pool[0].Value()+b.pool[1].Value() > d.allLim ||
		db.pool[k].Value()+bb.pool[k].Value() > db.pool[k].Limit() ||
		db.pool[0].Value()+db.pool[1].Value()+bb.pool[0].Value()+bb.pool[1].Value() > db.allLim
}

// Rows as bit sets, for exceedRows. An Alloc that passes a limit of
// allocation passes active's with it when active follows allocation
// (activeImplied), so it names the active rows too.
const (
	activeRows = 1<<stats.Active | 1<<stats.ActiveBytes
	splitRows  = 1<<stats.InactiveSplit | 1<<stats.InactiveSplitBytes
	phaseBit   = 1 << numRows // the counts of the block's phase (phases.go)
)

// refreshImplied recomputes sh.activeImplied (and impliedOff).
func (sh *shard) refreshImplied() {
	sh.activeImplied = sh.impliedNow()
	sh.impliedOff = !sh.activeImplied
}

// impliedNow reports whether the shard has nothing pending and its active
// limits are at least its allocation limits, in each pool and in all:
// the rows that derivedFrom names, written out (it runs for every shard
// whose limits the peaks set, as the world leaves).
func (sh *shard) impliedNow() bool {
	st := &sh.st
	d, b := &st[stats.Active], &st[stats.Allocation]
	db, bb := &st[stats.ActiveBytes], &st[stats.AllocatedBytes]
	return d.pool[0].Value()|d.pool[1].Value()|db.pool[0].Value()|db.pool[1].Value() == 0 &&
		d.pool[0].Limit() >= b.pool[0].Limit() && d.pool[1].Limit() >= b.pool[1].Limit() && d.allLim >= b.allLim &&
		db.pool[0].Limit() >= bb.pool[0].Limit() && db.pool[1].Limit() >= bb.pool[1].Limit() && db.allLim >= bb.allLim
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

// changes appends the operation's changes to the peaks' rows to cs.
// In the order of the rows, a row's columns in order: its pool column (of
// returns the same change there as in all, and zero in the other pool's).
func (d *opDelta) changes(cs []peaks.Change) []peaks.Change {
	for row := range numRows {
		v := d.row[row]
		if dr := derivedFrom[row]; dr != 0 {
			v += d.row[dr-1]
		}
		if v == 0 {
			continue
		}
		c := d.k
		if row >= oversizeA {
			c = qSmall
		}
		cs = append(cs, peaks.Change{Row: statRow(row, c), Delta: v})
		if c != qAll {
			cs = append(cs, peaks.Change{Row: statRow(row, qAll), Delta: v})
		}
	}
	if d.phased {
		for j, v := range d.ph {
			if v != 0 {
				cs = append(cs, peaks.Change{Row: phaseRow(d.phase, j), Delta: v})
			}
		}
	}
	return cs
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
		return s.pool[0].Value() + s.pool[1].Value()
	}
	return s.pool[k].Value()
}

// limit returns shard sh's limit of quantity row in pool k.
func (sh *shard) limit(row, k int) int64 {
	if k == qAll {
		return sh.st[row].allLim
	}
	return sh.st[row].pool[k].Limit()
}

// statsLocked returns the counters as the stats.DeviceStats callers see.
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
	a.sumLocked(oversizeS, &over)
	d.OversizeSegments = over[stats.SmallPool]
	return d
}

// sumLocked adds up quantity row over the shards into arr.
func (a *Allocator) sumLocked(row int, arr *stats.StatArray) {
	*arr = stats.StatArray{}
	for _, o := range a.shards {
		for k := range o.st[row].pool {
			c := &o.st[row].pool[k]
			s := &arr[statPool(k)]
			cur, inc := o.value(row, k), c.increases
			if d := derivedFrom[row]; d != 0 {
				inc = o.st[d-1].pool[k].increases
			}
			s.Current += cur
			s.Allocated += inc
			s.Freed += c.decreases(cur, inc)
		}
	}
	all := &arr[stats.All]
	for _, p := range [2]stats.Pool{stats.SmallPool, stats.LargePool} {
		all.Current += arr[p].Current
		all.Allocated += arr[p].Allocated
		all.Freed += arr[p].Freed
	}
	arr[stats.SmallPool].Peak = a.peaks.Peak(statRow(row, qSmall))
	arr[stats.LargePool].Peak = a.peaks.Peak(statRow(row, qLarge))
	arr[stats.All].Peak = a.peaks.Peak(statRow(row, qAll))
}

// statPool maps a pool column (qSmall, qLarge) to its stats.Pool.
func statPool(k int) stats.Pool {
	if k == qSmall {
		return stats.SmallPool
	}
	return stats.LargePool
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

// Stats returns a copy of the allocator's statistics.
func (a *Allocator) Stats() stats.DeviceStats {
	if !a.made() {
		return stats.DeviceStats{}
	}
	a.lockAll()
	defer a.unlockAll()
	return a.statsLocked()
}

// ResetPeakStats makes every peak equal to its current value
// (torch.cuda.reset_peak_memory_stats), the peaks of phases included.
func (a *Allocator) ResetPeakStats() {
	if !a.made() {
		return
	}
	a.lockAll()
	defer a.unlockAll()
	a.peaksResetLocked()
}

// ResetAccumulatedStats zeroes the cumulative sums and counters
// (torch.cuda.reset_accumulated_memory_stats), those of phases included.
func (a *Allocator) ResetAccumulatedStats() {
	if !a.made() {
		return
	}
	a.lockAll()
	defer a.unlockAll()
	a.accumulatedResetLocked()
}
