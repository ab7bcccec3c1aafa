// Package peaks keeps exact peaks of quantities that several parts count
// at once, each part under a lock of its own.
//
// # Model
//
// A Table has rows, numbered from 0. A row is one quantity: the sum of
// the values that its parts hold. (In the allocator a part is a shard,
// one stream's share of the state, guarded by its own lock; a row is one
// stat in one pool column, or the bytes or blocks of one phase.) The
// row's peak is the highest value that sum reached, the operations taken
// one after another in the serial order described below.
//
// Each part keeps, per row, a Count: its value and a limit, how high the
// value may rise without the part looking at the others. The limits of a
// row, and the row's spare room (room below the peak that the Table keeps
// for no part yet), add up to at most its peak. So while no part passes its limit,
// every interleaving of the parts' changes keeps the row's total at or
// below its peak: the peak cannot change, and no part needs to know what
// the others hold.
//
// # Invariants
//
// For every row r and every part p, value(p, r) <= limit(p, r), and the
// limits of r over all parts and the spare room of r (at least zero) add
// up to at most peak(r); so the total of r is at most peak(r). With one
// part, its limit is the peak. Table.Check reports every break of these.
//
// # Operations
//
//   - Count.Bump: a part adds n > 0 to its value and learns whether the
//     value passed its limit: then a new peak is possible, and the part
//     must run Exceed or leave its operation waiting for a Cut.
//   - Count.Drop and Count.Carry (Carried): a part lowers its value, or
//     moves value between two of its counts whose rows' totals the move
//     leaves unchanged. Neither can pass a limit.
//   - Table.Exceed: part p passed its limit of row r. When the row's
//     spare room holds what p needs, p takes it from there, and the row
//     is not read: the total cannot pass the peak. Likewise when the
//     part that took the room last (the row's riser) holds room that
//     covers it: p takes it from there, and takes its place if it rises
//     (in Serial, at once). Else the row's total
//     over every part raises the peak if it passes it, and the room below
//     the peak (the peak less the total) is shared out again: evenly,
//     every other part's limit becoming its value plus its share and p
//     keeping the rest; or, when p passed its limit of r at the last
//     reading of r too (it rises, as a stream allocating a run of
//     blocks), most of it to p, the others sharing a quarter; or, while
//     no part runs alone (Table.Serial), every limit becoming its part's
//     value and p taking all the room. The part that took the room is
//     the row's riser in and out of Serial: room a part took in Serial
//     is lent from outside it, and the other way round.
//   - Table.Risers: the riser of every row, for a caller that reads and
//     sets the parts' counts itself: in Serial it may move a riser's room
//     to a part that passes its limit, whatever that part needs, and make
//     that part the riser. Table.Lender and Lend: Exceed's loan from the
//     riser outside Serial, for such a caller.
//   - Table.Sole: Exceed with one part, whose limit is the peak: the peak
//     becomes its value.
//   - Table.Cut: operations that passed a limit while their parts ran
//     alone (Op) are counted one after another, in the order given, from
//     the state before any of them; each raises the peaks of the rows it
//     increased if the totals after it pass them. Then every row an
//     operation changed is Exceeded.
//   - Table.ResetPeaks: every peak becomes its row's total, every limit
//     its part's value, and the spare room none.
//
// # Concurrency
//
// Neither type locks: the caller's locks guard them. A part's Counts are
// guarded by the part's lock; Bump, Drop, Carry and Carried run under
// it. The Table, and the limits of every part, change only with every
// part's lock held (Exceed, Passed, Cut, ResetPeaks, AddRow, Check and
// the Parts they call, and a caller that takes a riser's room itself
// through Risers), with one exception: while there is one part, its lock alone
// guards the Table, and Sole runs under it.
//
// # The serial order
//
// The peaks are those of this order: an operation whose changes stayed
// within its part's limits counts at the moment it held its part's lock;
// one that ran with every lock held counts then; one that passed a limit
// under its part's lock alone counts at the Cut that settles it, among
// the operations waiting for that Cut in the order the Cut is given them.
// That is a true order of the operations only if a part that left an
// operation waiting runs no other before the Cut (the caller's rule), so
// that nothing can see the waiting operation's work before it counts.
// Between two moments when every lock is held, the changes that stay
// within the limits keep every total at or below the peak, whatever their
// interleaving, so the peaks are exactly those of the order.
package peaks

import "fmt"

// Count is one part's count of one row: its value and its limit. The zero
// Count is a zero value with a zero limit.
type Count struct {
	cur, lim int64
}

// NewCount returns a Count of value v whose limit is v (a new row's count,
// whose peak is at least the sum of its parts' values).
func NewCount(v int64) Count { return Count{cur: v, lim: v} }

// Bump adds n > 0 to the value and reports whether it passed the limit.
func (c *Count) Bump(n int64) bool {
	c.cur += n
	return c.cur > c.lim
}

// Drop subtracts n > 0 from the value.
func (c *Count) Drop(n int64) { c.cur -= n }

// Carry adds n, of either sign, to the value without checking the limit:
// for a change that an opposite change of another count of the same part
// cancels in the total of every row the peaks track.
func (c *Count) Carry(n int64) { c.cur += n }

// Carried is Carry returning n, for a caller that adds the change to sums
// of its own in the same statement.
func (c *Count) Carried(n int64) int64 {
	c.cur += n
	return n
}

// Value returns the value.
func (c *Count) Value() int64 { return c.cur }

// Limit returns the limit.
func (c *Count) Limit() int64 { return c.lim }

// SetLimit sets the limit; it runs as Exceed, Sole or ResetPeaks says.
func (c *Count) SetLimit(lim int64) { c.lim = lim }

// Parts is how a Table sees the parts of its rows, with every part's lock
// held: parts 0 to Len()-1, each with a value and a limit per row. Where
// a part keeps its counts, and how a row's value is computed from them,
// is the caller's.
//
// Row and SetLimits are Part and SetLimit for every part of a row at
// once: the Table reads and sets whole rows through them, so that a
// row of many parts costs one call.
type Parts interface {
	Len() int
	// Part returns part p's value and limit of row r.
	Part(p, r int) (value, limit int64)
	SetLimit(p, r int, lim int64)
	// SetLimitPair is SetLimit(p, r, limP) and SetLimit(q, r, limQ) in
	// one call, p != q: the room that passes from one part to another.
	SetLimitPair(p, q, r int, limP, limQ int64)
	// Row sets vals[p] and lims[p] to part p's value and limit of row r,
	// for every part; vals and lims have Len() elements.
	Row(r int, vals, lims []int64)
	// SetLimits sets part p's limit of row r to lims[p], for every part;
	// lims has Len() elements.
	SetLimits(r int, lims []int64)
	// Tighten sets every part's limit of row r to its value and returns
	// the row's total: Row, SetLimits with the values, and their sum, in
	// one pass.
	Tighten(r int) (total int64)
}

// Table holds the peaks of its rows. The zero Table has no rows.
type Table struct {
	// Serial says that no part runs alone now: every change of a value
	// runs with every lock held, so that a part's limit spares it no
	// world, and a reading of a row gives all the room to the part that
	// rises (the others' rises ask Exceed anyway, which takes it from
	// that part when it covers them: riser). The caller sets it
	// before Exceed or Cut; it changes how the room is shared, never the
	// peaks.
	Serial bool

	peak []int64
	// spare is, per row, room below the peak that no part's limit holds:
	// the limits of a row and its spare room add up to at most its peak.
	// Exceed hands it out without reading the row; a Cut of several
	// operations fills it with what the peaks rose by, and a reading of
	// the row empties it.
	spare []int64

	// riser is, per row, the part that passed its limit at the last
	// reading of the row, or that took the riser's place since (-1: none
	// yet): the part that rises, which holds most of the room (in Serial,
	// all of it but what the others freed since). Outside Serial, Exceed
	// gives it most of the room when it passes its limit of the row
	// again, and lends from its room to the other parts that pass theirs;
	// in Serial, a part that passes its limit takes all the riser's room
	// when it covers the need, and the riser's place. lent is, per row,
	// the part the riser lent to last outside Serial (-1: none since the
	// last reading or change of riser): a part that borrows twice in a
	// row rises, and takes the riser's place. One riser for both modes: a
	// row whose rises switch between them (stream events pending, then
	// none) finds the room where the other mode left it, without a
	// reading.
	riser, lent []int32

	vals, lims []int64 // a row of the parts (row), reused
}

// row returns the values and limits of row r of the n parts of ps, in
// the Table's buffers, valid until the next call.
func (t *Table) row(ps Parts, r, n int) (vals, lims []int64) {
	if cap(t.vals) < n {
		t.vals, t.lims = make([]int64, n), make([]int64, n)
	}
	vals, lims = t.vals[:n], t.lims[:n]
	ps.Row(r, vals, lims)
	return vals, lims
}

// Change is what one operation changed in one row.
type Change struct {
	Row   int
	Delta int64
}

// Op is an operation that part Part left waiting for a cut, and what it
// changed; each row appears once in Changes.
type Op struct {
	Part    int
	Changes []Change
}

// Rows returns the number of rows.
func (t *Table) Rows() int { return len(t.peak) }

// Peak returns the peak of row r.
func (t *Table) Peak(r int) int64 { return t.peak[r] }

// AddRow adds a row whose peak is peak and returns its number. The
// parts' limits of the new row must add up to at most peak.
func (t *Table) AddRow(peak int64) int {
	t.peak = append(t.peak, peak)
	t.spare = append(t.spare, 0)
	t.riser = append(t.riser, -1)
	t.lent = append(t.lent, -1)
	return len(t.peak) - 1
}

// Sole runs, while the Table has one part, when that part's value v of
// row r passed its limit, which is the peak: v is the new peak. The
// caller sets the part's limit to v.
func (t *Table) Sole(r int, v int64) { t.peak[r], t.spare[r] = v, 0 }

// Exceed runs, with every part's lock held, when part p's value of row r
// may have passed its limit. If it did, by need, and the row's spare
// room (Table) holds need, p takes need and some of the rest from it (in
// Serial, half of the rest; else all of it): the others' limits and the
// peak stay. Otherwise the row's total raises the peak if it passes it,
// and the room below the peak (the peak less the total) is shared out
// again: in Serial, every limit becomes its part's value and p takes all
// the room (tighten), unless the row's riser, the part that took the room
// last, still holds room enough for p's need: then p takes it all from the
// riser, and its place, reading no row. Outside Serial, when the row's riser (Table) is
// another part whose room covers p's need, p takes the need and an eighth
// of the rest from it (riserLends), reading no row, or three quarters of
// the rest and the riser's place if the riser lent to p last too; else,
// when p is the riser, or borrowed from it last, each other part gets its
// value plus an even share of a quarter of the room (riserShare), p
// keeping the rest; else the room is shared evenly, p keeping the share
// and what the division leaves.
func (t *Table) Exceed(ps Parts, p, r int) {
	v, lim := ps.Part(p, r)
	if v <= lim {
		return
	}
	t.Passed(ps, p, r, v, lim)
}

// Passed is Exceed for a caller that has read part p's value v and limit
// lim of row r itself (what ps.Part returns), and found v > lim: it does
// what Exceed does then, with one call of ps fewer. (A caller that reads
// its own part without the interface skips Exceed's call where the part
// is within its limit.)
func (t *Table) Passed(ps Parts, p, r int, v, lim int64) {
	if need, spare := v-lim, t.spare[r]; need <= spare {
		// The others are within their limits, whose sum with lim and the
		// spare room is at most the peak: the total is within the peak.
		give := spare - need // the rest
		if t.Serial {
			give /= 2
		}
		t.spare[r] = spare - need - give
		ps.SetLimit(p, r, v+give)
		return
	}
	// p passed its limit by more than the spare room: read the row, raise
	// the peak to the total if the total passes it, and share out the room
	// below the peak again.
	n := ps.Len()
	if t.Serial && n > 1 {
		// The room is mostly in the riser's limit (the others' are at
		// their values since the reading, but for what they freed): if
		// the riser's room covers p's need, p takes all of it and the
		// riser's place, and the row is not read. The limits' sum stays.
		if h := int(t.riser[r]); h != p && uint(h) < uint(n) {
			hv, hl := ps.Part(h, r)
			if room := hl - hv; room >= v-lim {
				ps.SetLimitPair(h, p, r, hv, lim+room)
				t.riser[r], t.lent[r] = int32(p), -1
				return
			}
		}
		// No part runs alone: a part that rises next asks Exceed anyway,
		// and room kept in the others' limits would be out of reach
		// until the next reading. Every limit becomes its value, and p
		// takes all the room.
		t.tighten(ps, p, r, v)
		return
	}
	// The row's riser holds most of the room since the last reading: if
	// its room covers p's need, p takes that from it, and the row is not
	// read; the limits' sum stays. (The riser may be running alone: with
	// every lock held, its limit may change.) With the need p takes an
	// eighth of the rest (riserLends); or, if the riser lent to p last
	// too, p rises: it takes three quarters of the rest and the riser's
	// place.
	if h := int(t.riser[r]); h != p && uint(h) < uint(n) {
		hv, hl := ps.Part(h, r)
		if need, room := v-lim, hl-hv; room >= need {
			give := t.Lend(p, r, need, room)
			ps.SetLimitPair(h, p, r, hl-need-give, v+give)
			return
		}
	}
	vals, lims := t.row(ps, r, n)
	lims = lims[:len(vals)]
	var total int64
	for _, pv := range vals {
		total += pv
	}
	peak := max(t.peak[r], total)
	t.peak[r] = peak
	room := peak - total
	if t.riser[r] == int32(p) || t.lent[r] == int32(p) {
		t.riser[r], t.lent[r] = int32(p), -1
		// p passed its limit of r at the last reading of r too (or
		// borrowed from the riser at the last pass): it is rising (a
		// stream allocating a run of blocks alone), and takes
		// most of the room. Each other part gets its value plus an even
		// share of a quarter of the room (riserShare), or one where that
		// is none and the room is at least one each; p keeps the rest,
		// at least three quarters of a room of 4n or more. With the room
		// shared evenly, a part rising alone among ten kept a tenth of it
		// and passed its limit every few blocks, each pass a cut in the
		// world.
		share := room / (riserShare * int64(n))
		if share == 0 && room >= int64(n) {
			share = 1 // as in the even share: one each spares a count of blocks a cut
		}
		for o, pv := range vals {
			lims[o] = pv + share
		}
		lims[p] = vals[p] + room - int64(n-1)*share
	} else {
		// Share the room evenly among the parts, the first others one
		// more each while the division leaves some (p keeps the rest), so
		// that the next part to rise has room too: with the others'
		// limits at their values, every rise of another part would pass
		// its limit and need the world. (The counts of blocks have little
		// room: one each is what spares them a cut.) p's limit is its
		// value plus the share, as the others' are, and the rest (less
		// than n) is one each for the first rest others.
		t.riser[r], t.lent[r] = int32(p), -1 // the part that rises last
		share, rest := room/int64(n), int(room%int64(n))
		for o, pv := range vals {
			lims[o] = pv + share
		}
		for o := range lims[:min(rest, p)] {
			lims[o]++
		}
		if rest > p {
			for o := range lims[p+1 : rest+1] {
				lims[p+1+o]++
			}
		}
	}
	t.spare[r] = 0
	ps.SetLimits(r, lims)
}

// Lender returns, outside Serial, the riser that Passed would ask for a
// loan where a part passes its limit of row r by need more than the spare
// room (else -1). Where it is another part p's and its room (its limit
// less its value) covers need, a caller can do what Passed does: p takes
// need and what Lend returns from it, the riser's limit falling as much.
func (t *Table) Lender(r int, need int64) int {
	if t.Serial || need <= t.spare[r] {
		return -1
	}
	return int(t.riser[r])
}

// Lend records the loan of need, out of room, from row r's riser to part
// p (Lender), and returns what p takes beyond need: an eighth of the rest
// (riserLends), or, if the riser lent to p last too, three quarters of it
// and the riser's place.
func (t *Table) Lend(p, r int, need, room int64) (give int64) {
	if t.lent[r] == int32(p) {
		t.riser[r], t.lent[r] = int32(p), -1
		return (room - need) * 3 / 4
	}
	t.lent[r] = int32(p)
	return (room - need) / riserLends
}

// Risers returns the riser of every row (Table), by row: the part that
// took the row's room last (-1: none yet). In Serial, a caller that reads
// and sets the parts' counts itself may, with every part's lock held,
// move the room of a row's riser (its limit less its value) to another
// part p whatever p needs, and make p the riser by setting p's number
// there: the limits' sum stays, and Passed would have done the same had
// the room covered p's need. (The riser's last loan outside Serial, lent,
// may then name a part that borrowed from another riser: it takes the
// riser's place at its next loan, a step early, which shares the room
// differently, never the peaks.)
func (t *Table) Risers() []int32 { return t.riser }

// riserShare: at a reading of a row outside Serial by the part that
// passed its limit of the row at the row's last reading too (the row's
// riser), the other parts share one riserShare-th of the room below the
// peak evenly, and the riser keeps the rest (Exceed). Measured on the
// 10-stream offload trace with the room given so to every part that
// passes a limit: 2 and 8 cost more than 4. That rule, for riser or not,
// cost a workload whose streams rise in turn (BenchmarkReplayStreams)
// more than twice the instructions: each of the others then passed its
// limit at its next rise.
const riserShare = 4

// riserLends: a pass outside Serial by a part other than the row's riser,
// that the riser's room covers, takes what it needs and one riserLends-th
// of the rest of the riser's room (Exceed), reading no row. Measured
// (offload trace / BenchmarkReplayStreams, instructions per op), with
// every pass lending so: 0, nothing but the need, 2,049 / 2,094; 8,
// 2,046 / 2,044; 4, 2,048 / 2,050; 2, 2,047 / 2,097; 4/3 (three
// quarters), 2,028 / 2,149; against 2,090 / 2,117 with a reading of the
// row instead. But then a part rising below the peak borrowed a little
// at each pass and never became the riser (9 cuts in a run of 30 blocks,
// TestRisingShardRunsAloneBelowThePeak); a second borrowing in a row
// taking the riser's place by a reading cost 2,010 / 2,122, by a loan of
// three quarters of the rest (as now) 2,049 / 2,040.
const riserLends = 8

// tighten is Exceed's reading of row r in Serial: every limit becomes its
// part's value, the total raises the peak if it passes it, and p, whose
// value is v, takes all the room below the peak, and becomes the row's
// riser. (No part runs alone: any other part that rises asks Exceed,
// which takes the room from the riser where it covers the need, else
// reads the row again; p, which rose, is the likeliest to rise again.)
func (t *Table) tighten(ps Parts, p, r int, v int64) {
	total := ps.Tighten(r)
	t.riser[r], t.lent[r] = int32(p), -1
	peak := max(t.peak[r], total)
	t.peak[r] = peak
	t.spare[r] = 0
	if room := peak - total; room > 0 {
		ps.SetLimit(p, r, v+room)
	}
}

// Cut settles ops, with every part's lock held: the operations that
// passed a limit while their parts ran alone, whose changes are already
// in the parts' values. It counts them one after another in the order of
// ops, from the state before any of them: after each, the total of every
// row it increased raises the row's peak if it passes it (only a row
// that some operation's part is above its limit of can). Then it runs
// Exceed for every row each operation increased: a part is within its
// limits before its operation (each part has one operation waiting), so
// within its limit of a row the operation lowered. (With one operation, the
// count in order is Exceed's own: the operation's part is above its
// limit of a row only if it increased the row, and Exceed raises the peak
// to the row's total then.)
func (t *Table) Cut(ps Parts, ops []Op) {
	if len(ops) > 1 {
		t.countInOrder(ps, ops)
	}
	for _, op := range ops {
		for _, c := range op.Changes {
			if c.Delta > 0 {
				t.Exceed(ps, op.Part, c.Row)
			}
		}
	}
}

// countInOrder is Cut's count of ops one after another: it raises the
// peak of every row an operation increased to the total after it, where
// that passes the peak.
func (t *Table) countInOrder(ps Parts, ops []Op) {
	n := ps.Len()
	for i := range ops {
		for j, c := range ops[i].Changes {
			r := c.Row
			if mentions(ops[:i], ops[i].Changes[:j], r) {
				continue // counted with the operation that names it first
			}
			if !over(ps, ops, r) {
				// Every part is within its limit of r after its operation,
				// as before it, so every total along the order is within
				// the sum of the limits, at most the peak.
				continue
			}
			var total int64
			vals, _ := t.row(ps, r, n)
			for _, v := range vals {
				total += v
			}
			for k := range ops {
				total -= ops[k].delta(r) // the state before the operations
			}
			peak := t.peak[r]
			for k := range ops {
				d := ops[k].delta(r)
				total += d
				if d > 0 {
					peak = max(peak, total)
				}
			}
			t.spare[r] += peak - t.peak[r] // what the peak rose by is room no limit holds
			t.peak[r] = peak
		}
	}
}

// over reports whether the part of one of ops is above its limit of row
// r (the parts of no operation are within their limits).
func over(ps Parts, ops []Op, r int) bool {
	for k := range ops {
		if v, lim := ps.Part(ops[k].Part, r); v > lim {
			return true
		}
	}
	return false
}

// delta returns op's change of row r.
func (op *Op) delta(r int) int64 {
	for _, c := range op.Changes {
		if c.Row == r {
			return c.Delta
		}
	}
	return 0
}

// mentions reports whether row r is among the changes of ops or cs.
func mentions(ops []Op, cs []Change, r int) bool {
	for _, c := range cs {
		if c.Row == r {
			return true
		}
	}
	for i := range ops {
		for _, c := range ops[i].Changes {
			if c.Row == r {
				return true
			}
		}
	}
	return false
}

// ResetPeaks makes every row's peak its total and every part's limit its
// value (the start after a reset of the peaks), with every part's lock
// held.
func (t *Table) ResetPeaks(ps Parts) {
	n := ps.Len()
	for r := range t.peak {
		var total int64
		for p := range n {
			v, _ := ps.Part(p, r)
			ps.SetLimit(p, r, v)
			total += v
		}
		t.peak[r], t.spare[r] = total, 0
	}
}

// Check calls bad for every break of the invariants, with every part's
// lock held: a part's value above its limit (part p), a peak below its
// row's total or the sum of its limits (part -1).
func (t *Table) Check(ps Parts, bad func(r, p int, msg string)) {
	n := ps.Len()
	for r := range t.peak {
		var total, lims int64
		for p := range n {
			v, lim := ps.Part(p, r)
			if v > lim {
				bad(r, p, fmt.Sprintf("%d is above its limit %d", v, lim))
			}
			total += v
			lims += lim
		}
		if peak, spare := t.peak[r], t.spare[r]; total > peak || lims+spare > peak || spare < 0 {
			bad(r, -1, fmt.Sprintf("peak %d is below the total %d or the sum of the limits %d and the spare room %d", peak, total, lims, spare))
		}
	}
}
