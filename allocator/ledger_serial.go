// This file holds the ledger's passes of limits in Serial (the peaks'
// Table.Serial: no shard runs alone, every operation takes the world). It
// is part of the ledger (ledger_peaks.go).

package allocator

import (
	"math/bits"
)

// serialExceeded is exceedRows's stat rows in Serial: shard sh passed a
// limit of the rows in the bit set rows, in pool k's column or in all.
// For every quantity of those rows, the pool columns and all, it first
// takes the room of the quantity's riser (peaks.Table.Risers), its limit
// less its value, whatever sh needs, and becomes the riser: the next
// operation of sh that raises the same rows in the other pool then
// passes no limit while that room lasts (an operation raises its pool's
// column and all, and a stream's blocks come from both pools in turn).
// Then every quantity that sh's value still passes runs the peaks' Passed
// (sh is its riser: it reads the row, tighten). Taking every row's room,
// not only the passed rows', cost more than the passes it saved on the
// 10-stream offload trace, as did taking the rows an Alloc raises.
func (a *Allocator) serialExceeded(sh *shard, k int, rows uint32) {
	ids := *a.byID.Load()
	hs := a.peaks.Risers()
	id := int32(sh.id)
	ps := a.parts()
	k &= 1
	for ; rows != 0; rows &= rows - 1 {
		row := bits.TrailingZeros32(rows) % numRows
		base := derivedFrom[row] - 1 // -1: no base row
		c := &sh.st[row]
		r := statRow(row, 0)
		if uint(r+qAll) >= uint(len(hs)) {
			return // never: it lets the compiler drop the bounds checks
		}
		cols := 2
		if row >= oversizeA {
			cols = 1 // the oversize rows have column qSmall alone
		}
		for col := range cols {
			if h := hs[r+col]; h != id && uint(h) < uint(len(ids)) {
				o := ids[h]
				oc := &o.st[row].pool[col]
				hv := oc.Value()
				if base >= 0 {
					hv += o.st[base].pool[col].Value()
				}
				if room := oc.Limit() - hv; room > 0 {
					oc.SetLimit(hv)
					c.pool[col].SetLimit(c.pool[col].Limit() + room)
					o.activeImplied, o.impliedOff = false, false
				}
				hs[r+col] = id
			}
		}
		if h := hs[r+qAll]; h != id && uint(h) < uint(len(ids)) {
			o := ids[h]
			oc := &o.st[row]
			hv := oc.pool[0].Value() + oc.pool[1].Value()
			if base >= 0 {
				hv += o.st[base].pool[0].Value() + o.st[base].pool[1].Value()
			}
			if room := oc.allLim - hv; room > 0 {
				oc.allLim = hv
				c.allLim += room
				o.activeImplied, o.impliedOff = false, false
			}
			hs[r+qAll] = id
		}
		col := k
		if row >= oversizeA {
			col = qSmall
		}
		v, all := c.pool[col].Value(), c.pool[0].Value()+c.pool[1].Value()
		if base >= 0 {
			b := &sh.st[base]
			v += b.pool[col].Value()
			all += b.pool[0].Value() + b.pool[1].Value()
		}
		if lim := c.pool[col].Limit(); v > lim {
			a.peaks.Passed(ps, sh.id, r+col, v, lim)
		}
		if lim := c.allLim; all > lim {
			a.peaks.Passed(ps, sh.id, r+qAll, all, lim)
		}
	}
}
