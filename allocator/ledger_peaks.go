// This file holds the ledger's half that changes the counts, their
// limits and the peaks (allocator/internal/peaks): the changes the
// ledger's methods (ledger.go) make, the settling of cuts, the resets and
// the rows of the phases. It is part of the ledger: TestOnlyTheLedgerWrites
// lets the ledger's files, and no other, call the peaks' writers.

package allocator

import (
	"math/bits"

	"github.com/gpumem/gpumem/allocator/internal/peaks"
	"github.com/gpumem/gpumem/stats"
)

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

// largeRises returns a sum that grows with every rise of the large
// pool's counts that a held front's hand-out again tests (shard.credit):
// the sums of increases of its allocations, which every hand-out counts
// (allocated and requested bytes, active and a phase's counts rise only
// with one), and of its inactive_split_bytes, which rise with every rise
// of inactive_split.
func (sh *shard) largeRises() int64 {
	return sh.st[stats.Allocation].pool[qLarge].increases + sh.st[stats.InactiveSplitBytes].pool[qLarge].increases
}

// grow adds n > 0 to pool k without testing a limit, for a change that
// the caller knows keeps the value and the total within their limits
// (retakeLocked's credit).
func (s *shardCounts) grow(k int, n int64) {
	c := &s.pool[k&1]
	c.increases += c.Carried(n)
}

// grow counts a block of n bytes handed out, as add, without testing a
// limit (shardCounts.grow).
func (c *phaseCount) grow(n int64) {
	c.bytes.increases += c.bytes.Carried(n)
	c.blocks.increases += c.blocks.Carried(1)
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
		sh.cutRows, sh.cutK = rows, k
		a.cutWaiting.Store(true)
		return
	}
	ps := a.parts()
	// With no shard able to run alone as the world leaves (stream events
	// pending, say), every operation takes the world: a reading of a row
	// gives all the room to the shard that rises (peaks.Table.Serial), as
	// any other shard's rise runs Exceed anyway.
	a.peaks.Serial = !a.fastLocked()
	if rows&phaseBit != 0 {
		for j := range 2 {
			a.peaks.Exceed(ps, sh.id, phaseRow(d.phase, j))
		}
		rows &^= phaseBit
	}
	// An operation changes its pool's column of a row and all (the
	// oversize rows: column qSmall and all), as opDelta.of says; the other
	// pool's value stays, and so within its limit (no limit falls below its
	// value), so only the two changed quantities may have passed a limit,
	// as in Cut, which runs Exceed for the changes alone. The shard's
	// value and limit of each are read here, as shardParts.Part would,
	// and the peaks run (Passed) only for a quantity that passed its limit.
	// In Serial, serialExceeded (ledger_serial.go) takes the rows' room
	// from their risers first.
	if a.peaks.Serial {
		if rows != 0 {
			a.serialExceeded(sh, k, rows)
		}
		sh.refreshImplied()
		return
	}
	k &= 1
	for ; rows != 0; rows &= rows - 1 {
		row := bits.TrailingZeros32(rows) % numRows
		col := k
		if row >= oversizeA {
			col = qSmall
		}
		s := &sh.st[row]
		v, all := s.pool[col].Value(), s.pool[0].Value()+s.pool[1].Value()
		if d := derivedFrom[row]; d != 0 {
			base := &sh.st[uint(d-1)%uint(numRows)]
			v += base.pool[col].Value()
			all += base.pool[0].Value() + base.pool[1].Value()
		}
		r := statRow(row, 0)
		if lim := s.pool[col].Limit(); v > lim && !a.riserLends(sh, row, col, r+col, v, lim) {
			a.peaks.Passed(ps, sh.id, r+col, v, lim)
		}
		if lim := s.allLim; all > lim && !a.riserLends(sh, row, qAll, r+qAll, all, lim) {
			a.peaks.Passed(ps, sh.id, r+qAll, all, lim)
		}
	}
	sh.refreshImplied()
}

// riserLends is the peaks' Passed where, outside Serial, the riser of the
// peaks' row r (quantity row in column col) is another shard whose room
// covers what shard sh's value v needs beyond its limit lim
// (peaks.Table.Lender): sh takes the need and what Table.Lend gives from
// the riser's room. It reads and sets the two shards' counts itself, not
// through shardParts, and reports whether it did; if not, the caller runs
// Passed.
func (a *Allocator) riserLends(sh *shard, row, col, r int, v, lim int64) bool {
	need := v - lim
	h := a.peaks.Lender(r, need)
	ids := *a.byID.Load()
	if h == sh.id || uint(h) >= uint(len(ids)) {
		return false
	}
	o := ids[h]
	c, base := &o.st[row], derivedFrom[row]-1 // -1: no base row
	var hv, hl int64
	if col == qAll {
		hv, hl = c.pool[0].Value()+c.pool[1].Value(), c.allLim
		if base >= 0 {
			hv += o.st[base].pool[0].Value() + o.st[base].pool[1].Value()
		}
	} else {
		hv, hl = c.pool[col&1].Value(), c.pool[col&1].Limit()
		if base >= 0 {
			hv += o.st[base].pool[col&1].Value()
		}
	}
	room := hl - hv
	if room < need {
		return false
	}
	give := a.peaks.Lend(sh.id, r, need, room)
	if col == qAll {
		c.allLim, sh.st[row].allLim = hl-need-give, v+give
	} else {
		c.pool[col&1].SetLimit(hl - need - give)
		sh.st[row].pool[col&1].SetLimit(v + give)
	}
	o.activeImplied, o.impliedOff = false, false
	return true
}

// cutsLocked settles the peaks that shards left waiting (shards.go says
// when and why): their operations, kept as the shards' cutOp, are counted
// by the peaks' Cut in the order of the shards. lockAll calls it only
// when a shard said one waits (Allocator.cutWaiting), testing that
// itself, so that the world costs no call where none waits.
//
// One operation waiting (the common case: the shard that left it takes
// the world at once) is settled by exceedRows in the world, as if it had
// run there: the peaks' Cut of one operation is Exceed for every row it
// increased, and exceedRows runs it for the rows the operation passed a
// limit of (shard.cutRows), the only ones where Exceed does anything.
func (a *Allocator) cutsLocked() {
	a.cutWaiting.Store(false)
	var one *shard
	for _, sh := range a.shards {
		if sh.cut {
			if one != nil {
				a.cutManyLocked()
				return
			}
			one = sh
		}
	}
	if one != nil {
		one.cut = false
		a.exceedRows(one, one.cutK, one.cutRows, &one.cutOp)
	}
}

// cutManyLocked is cutsLocked with several operations waiting: the peaks'
// Cut counts them one after another.
func (a *Allocator) cutManyLocked() {
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
	a.peaks.Serial = !a.fastLocked() // as in exceedRows
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

func (s *shardParts) Part(p, r int) (value, limit int64) {
	sh := (*s.byID.Load())[p]
	if r < numStatRows {
		// shard.value and shard.limit, written out: the peaks call Part
		// for every Exceed and for every operation of a Cut.
		row, k := r/numQ, r%numQ
		if row < 0 {
			return 0, 0 // never: it lets the compiler drop bounds checks
		}
		c, base := &sh.st[row], derivedFrom[row]-1 // -1: no base row
		if k == qAll {
			value, limit = c.pool[0].Value()+c.pool[1].Value(), c.allLim
			if base >= 0 {
				value += sh.st[base].pool[0].Value() + sh.st[base].pool[1].Value()
			}
			return value, limit
		}
		k &= 1
		value, limit = c.pool[k].Value(), c.pool[k].Limit()
		if base >= 0 {
			value += sh.st[base].pool[k].Value()
		}
		return value, limit
	}
	if c := sh.peekPhase(uint16((r - numStatRows) / 2)); c != nil {
		n := c.of((r - numStatRows) % 2)
		return n.Value(), n.Limit()
	}
	return 0, 0
}

// Row reads row r of every shard, as Part does one shard at a time.
func (s *shardParts) Row(r int, vals, lims []int64) {
	shards := *s.byID.Load()
	vals, lims = vals[:len(shards)], lims[:len(shards)]
	if r >= numStatRows {
		for p := range shards {
			vals[p], lims[p] = s.Part(p, r)
		}
		return
	}
	// shard.value and shard.limit, with the row's shape found once and a
	// loop for each shape.
	row, k := r/numQ, r%numQ
	base := derivedFrom[row] - 1 // -1: no base row
	if uint(row) >= uint(numRows) || base >= numRows {
		return // never: it lets the compiler drop the loops' bounds checks
	}
	switch {
	case k == qAll && base >= 0:
		for p, sh := range shards {
			s, b := &sh.st[row], &sh.st[base]
			vals[p] = s.pool[0].Value() + s.pool[1].Value() + b.pool[0].Value() + b.pool[1].Value()
			lims[p] = s.allLim
		}
	case k == qAll:
		for p, sh := range shards {
			s := &sh.st[row]
			vals[p], lims[p] = s.pool[0].Value()+s.pool[1].Value(), s.allLim
		}
	case base >= 0:
		k &= 1
		for p, sh := range shards {
			c := &sh.st[row].pool[k]
			vals[p], lims[p] = c.Value()+sh.st[base].pool[k].Value(), c.Limit()
		}
	default:
		k &= 1
		for p, sh := range shards {
			c := &sh.st[row].pool[k]
			vals[p], lims[p] = c.Value(), c.Limit()
		}
	}
}

// SetLimits sets row r's limit of every shard, as SetLimit does one at a
// time.
func (s *shardParts) SetLimits(r int, lims []int64) {
	shards := *s.byID.Load()
	lims = lims[:len(shards)]
	if r >= numStatRows {
		for p := range shards {
			s.SetLimit(p, r, lims[p])
		}
		return
	}
	row, k := r/numQ, r%numQ
	if uint(row) >= uint(numRows) {
		return // never: it lets the compiler drop the loop's bounds checks
	}
	if k == qAll {
		for p, sh := range shards {
			sh.st[row].allLim = lims[p]
			sh.activeImplied, sh.impliedOff = false, false
		}
		return
	}
	k &= 1
	for p, sh := range shards {
		sh.st[row].pool[k].SetLimit(lims[p])
		sh.activeImplied, sh.impliedOff = false, false
	}
}

// Tighten sets row r's limit of every shard to its value and returns the
// row's total, as Row, SetLimits and a sum would, in one pass.
func (s *shardParts) Tighten(r int) (total int64) {
	shards := *s.byID.Load()
	if r >= numStatRows {
		for p := range shards {
			v, _ := s.Part(p, r)
			s.SetLimit(p, r, v)
			total += v
		}
		return total
	}
	row, k := r/numQ, r%numQ
	base := derivedFrom[row] - 1 // -1: no base row
	if uint(row) >= uint(numRows) || base >= numRows {
		return 0 // never: it lets the compiler drop the loops' bounds checks
	}
	switch {
	case k == qAll:
		for _, sh := range shards {
			c := &sh.st[row]
			v := c.pool[0].Value() + c.pool[1].Value()
			if base >= 0 {
				v += sh.st[base].pool[0].Value() + sh.st[base].pool[1].Value()
			}
			c.allLim = v
			sh.activeImplied, sh.impliedOff = false, false
			total += v
		}
	default:
		k &= 1
		for _, sh := range shards {
			c := &sh.st[row].pool[k]
			v := c.Value()
			if base >= 0 {
				v += sh.st[base].pool[k].Value()
			}
			c.SetLimit(v)
			sh.activeImplied, sh.impliedOff = false, false
			total += v
		}
	}
	return total
}

// SetLimitPair sets shard p's limit of row r to limP and shard q's to
// limQ, as SetLimit does one at a time, with the shards and the row's
// place found once.
func (s *shardParts) SetLimitPair(p, q, r int, limP, limQ int64) {
	if r >= numStatRows {
		s.SetLimit(p, r, limP)
		s.SetLimit(q, r, limQ)
		return
	}
	shards := *s.byID.Load()
	sp, sq := shards[p], shards[q]
	row, k := r/numQ, r%numQ
	if uint(row) >= uint(numRows) {
		return // never: it lets the compiler drop the bounds checks
	}
	if k == qAll {
		sp.st[row].allLim, sq.st[row].allLim = limP, limQ
	} else {
		k &= 1
		sp.st[row].pool[k].SetLimit(limP)
		sq.st[row].pool[k].SetLimit(limQ)
	}
	sp.activeImplied, sq.activeImplied = false, false
	sp.impliedOff, sq.impliedOff = false, false
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
		sh.activeImplied, sh.impliedOff = false, false
		return
	}
	id := uint16((r - numStatRows) / 2)
	if lim == 0 && sh.peekPhase(id) == nil {
		return // no counts of the phase: all zero already
	}
	sh.phaseCount(id).of((r - numStatRows) % 2).SetLimit(lim)
}
