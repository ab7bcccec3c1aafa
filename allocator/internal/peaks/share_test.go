// This file holds the tests of how Exceed shares the room below the peak:
// the riser's rules and the sharing held to a plain loop.

package peaks

import (
	"testing"

	"pgregory.net/rapid"
)

// TestExceedGivesTheRiserTheRoom: ten parts below an old peak, one of
// them rising one at a time, as a stream allocating a run of blocks does.
// At its first pass the room is shared evenly; at its second pass of the
// row it is the row's riser, and takes most of the room below the peak,
// so that it passes its limit twice in the run (with the room shared
// evenly every time it kept a tenth of it, and passed its limit every few
// steps, each pass a cut or a reading of the row). In Serial it takes all
// the room at its first pass. Another part's pass makes it the riser in
// its turn. The peak stays the old one, and the invariants hold
// throughout.
func TestExceedGivesTheRiserTheRoom(t *testing.T) {
	for _, c := range []struct {
		serial bool
		passes int
	}{{false, 2}, {true, 1}} {
		tab := newTable(1)
		tab.Serial = c.serial
		g := &rowReads{grid: newGrid(10, 1)}
		tab.peak[0] = 100
		passes := 0
		for i := range 70 {
			if g.grid[3][0].Bump(1) {
				passes++
				tab.Exceed(g, 3, 0)
			}
			if s := broken(tab, &g.grid); s != "" {
				t.Fatalf("serial %v: %s", c.serial, s)
			}
			if !c.serial && i == 10 {
				// The second pass, at 11: room 89, the others' share 89/40.
				if g.Limit(3, 0) != 11+89-9*2 || g.Limit(0, 0) != 2 {
					t.Fatalf("limits %d and %d at the second pass; want 82 and 2", g.Limit(3, 0), g.Limit(0, 0))
				}
			}
		}
		if passes != c.passes || g.rows != c.passes || tab.Peak(0) != 100 {
			t.Errorf("serial %v: %d passes and %d readings of the row, peak %d; want %d, %d and 100", c.serial, passes, g.rows, tab.Peak(0), c.passes, c.passes)
		}
	}
	// Not Serial: part 5 passes in its turn, by 9. Part 3, the riser,
	// holds 82 - 70 = 12, which covers it: part 5 takes the 9 and an
	// eighth of the 3 left (none) from it, and no row is read. Then part
	// 5 passes again, by 20: part 3's 3 do not cover it, the row is read,
	// and part 5, which borrowed last, becomes the riser; the room,
	// 100 - 70 - 31 = -1, is none, and the peak is the total.
	tab := newTable(1)
	g := &rowReads{grid: newGrid(10, 1)}
	tab.peak[0] = 100
	for range 70 {
		if g.grid[3][0].Bump(1) {
			tab.Exceed(g, 3, 0)
		}
	}
	g.grid[5][0].Bump(11) // past its share of 2
	tab.Exceed(g, 5, 0)
	if g.Limit(5, 0) != 11 || g.Limit(3, 0) != 73 || g.Limit(9, 0) != 2 || g.rows != 2 {
		t.Fatalf("limits %d, %d and %d, %d readings after another part's pass; want 11, 73, 2 and 2", g.Limit(5, 0), g.Limit(3, 0), g.Limit(9, 0), g.rows)
	}
	g.grid[5][0].Bump(20)
	tab.Exceed(g, 5, 0)
	if tab.Peak(0) != 101 || g.Limit(5, 0) != 31 || g.Limit(3, 0) != 70 || g.rows != 3 || tab.riser[0] != 5 {
		t.Fatalf("peak %d, limits %d and %d, %d readings, riser %d; want 101, 31, 70, 3 and 5", tab.Peak(0), g.Limit(5, 0), g.Limit(3, 0), g.rows, tab.riser[0])
	}
	if s := broken(tab, g); s != "" {
		t.Fatal(s)
	}
}

// TestRiserLendsAndIsSucceeded: outside Serial, a pass of another part
// that the riser's room covers takes the need and an eighth of the rest
// from the riser, reading no row; the same part's next such pass takes
// three quarters of the rest and the riser's place; a third part then
// borrows from the new riser.
func TestRiserLendsAndIsSucceeded(t *testing.T) {
	tab := newTable(1)
	g := &rowReads{grid: newGrid(10, 1)}
	tab.peak[0] = 100
	for range 11 { // part 3 to 11: two passes, the second as the riser (limit 82, the others 2)
		if g.grid[3][0].Bump(1) {
			tab.Exceed(g, 3, 0)
		}
	}
	step := func(p int, rise, wantP, wantOld int64, old int, riser int32) {
		t.Helper()
		if !g.grid[p][0].Bump(rise) {
			t.Fatalf("part %d did not pass its limit", p)
		}
		tab.Exceed(g, p, 0)
		if g.Limit(p, 0) != wantP || g.Limit(old, 0) != wantOld || tab.riser[0] != riser || g.rows != 2 || tab.Peak(0) != 100 {
			t.Fatalf("limits %d and %d, riser %d, %d readings, peak %d; want %d, %d, %d, 2 and 100",
				g.Limit(p, 0), g.Limit(old, 0), tab.riser[0], g.rows, tab.Peak(0), wantP, wantOld, riser)
		}
		if s := broken(tab, &g.grid); s != "" {
			t.Fatal(s)
		}
	}
	// Part 5 to 3, past 2 by 1: part 3's room 82 - 11 = 71 covers it;
	// part 5 takes 1 and 70/8.
	step(5, 3, 3+8, 82-1-8, 3, 3)
	// Part 5 to 12, past 11 by 1: part 3's room 73 - 11 = 62; part 5
	// borrowed last, so it takes 1 and 61*3/4 and becomes the riser.
	step(5, 9, 12+45, 73-1-45, 3, 5)
	// Part 7 to 3, past 2 by 1: part 5's room 57 - 12 = 45; part 7 takes
	// 1 and 44/8, and part 5 stays the riser.
	step(7, 3, 3+5, 57-1-5, 5, 5)
}

// shareRef is Exceed's sharing of the room as a loop over the parts: the
// others, in order, get their value plus the share and one more each while
// the division's rest lasts; p gets the peak less theirs.
func shareRef(vals []int64, p int, peak int64) []int64 {
	n := int64(len(vals))
	var total int64
	for _, v := range vals {
		total += v
	}
	room := peak - total
	share, rest := room/n, room%n
	lims := make([]int64, len(vals))
	var others int64
	for o := range vals {
		if o != p {
			w := vals[o] + share
			if rest > 0 {
				w++
				rest--
			}
			lims[o] = w
			others += w
		}
	}
	lims[p] = peak - others
	return lims
}

// riserRef is Exceed's sharing of the room by the row's riser as a loop
// over the parts: the others get their value plus a quarter of the room
// shared evenly (rounded down), or one each where that is none and the
// room is at least one each; p gets the peak less theirs.
func riserRef(vals []int64, p int, peak int64) []int64 {
	var total int64
	for _, v := range vals {
		total += v
	}
	share := (peak - total) / 4 / int64(len(vals))
	if share == 0 && peak-total >= int64(len(vals)) {
		share = 1
	}
	lims := make([]int64, len(vals))
	var others int64
	for o := range vals {
		if o != p {
			lims[o] = vals[o] + share
			others += lims[o]
		}
	}
	lims[p] = peak - others
	return lims
}

// TestExceedSharesAsTheLoop: on random rows, Exceed's limits are those of
// shareRef whenever it shares the room (riserRef when the part that passed
// its limit is the row's riser), it is the row's riser then; where another
// part is the riser and its room covers the pass, it lends from it; and
// the table's invariants hold.
func TestExceedSharesAsTheLoop(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.IntRange(1, 12).Draw(t, "parts")
		g := newGrid(n, 1)
		var sum int64
		for o := range g {
			v := rapid.Int64Range(0, 40).Draw(t, "value")
			g[o][0] = NewCount(v)
			g[o][0].SetLimit(v + rapid.Int64Range(0, 10).Draw(t, "slack"))
			sum += g[o][0].Limit()
		}
		tab := newTable(1)
		tab.spare[0] = rapid.Int64Range(0, 30).Draw(t, "spare")
		tab.peak[0] = sum + tab.spare[0]
		p := rapid.IntRange(0, n-1).Draw(t, "part")
		riser := rapid.IntRange(-1, n-1).Draw(t, "riser") // the part that passed its limit at the last reading
		tab.riser[0] = int32(riser)
		g[p][0].Bump(rapid.Int64Range(1, 60).Draw(t, "rise"))
		vals := make([]int64, n)
		var total, others int64
		for o := range g {
			vals[o] = g.Value(o, 0)
			total += vals[o]
			if o != p {
				others += g.Limit(o, 0)
			}
		}
		v, lim := g.Value(p, 0), g.Limit(p, 0)
		sharing := v > lim && others+v > max(tab.Peak(0), total)
		lims := make([]int64, n)
		for o := range g {
			lims[o] = g.Limit(o, 0)
		}
		tab.Exceed(g, p, 0)
		if s := broken(tab, g); s != "" {
			t.Fatal(s)
		}
		if !sharing {
			return
		}
		if riser >= 0 && riser != p && lims[riser]-vals[riser] >= v-lim {
			// The riser's room covers the pass: it lends the need and an
			// eighth of the rest, and stays the riser; no other limit moves.
			give := (lims[riser] - vals[riser] - (v - lim)) / 8
			lims[riser] -= v - lim + give
			lims[p] = v + give
			for o := range g {
				if g.Limit(o, 0) != lims[o] {
					t.Fatalf("part %d's limit %d, want %d (values %v, limits before %v, part %d, riser %d)", o, g.Limit(o, 0), lims[o], vals, lims, p, riser)
				}
			}
			if tab.riser[0] != int32(riser) {
				t.Fatalf("the row's riser is %d after it lent, want %d", tab.riser[0], riser)
			}
			return
		}
		want := shareRef(vals, p, tab.Peak(0))
		if riser == p {
			want = riserRef(vals, p, tab.Peak(0))
		}
		if tab.riser[0] != int32(p) {
			t.Fatalf("the row's riser is %d after part %d's reading, want %d", tab.riser[0], p, p)
		}
		for o := range g {
			if g.Limit(o, 0) != want[o] {
				t.Fatalf("part %d's limit %d, want %d (values %v, part %d, peak %d)", o, g.Limit(o, 0), want[o], vals, p, tab.Peak(0))
			}
		}
	})
}

// clone returns a copy of t and of g that shares nothing with them.
func clone(t *Table, g grid) (*Table, grid) {
	c := &Table{Serial: t.Serial}
	c.peak = append([]int64(nil), t.peak...)
	c.spare = append([]int64(nil), t.spare...)
	c.riser = append([]int32(nil), t.riser...)
	c.lent = append([]int32(nil), t.lent...)
	h := newGrid(len(g), len(g[0]))
	for p := range g {
		copy(h[p], g[p])
	}
	return c, h
}

// TestPassedIsExceed: Passed, given the value and limit that Exceed reads,
// leaves the table and the limits as Exceed does, over a run of random
// rises in and out of Serial.
func TestPassedIsExceed(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		nParts := rapid.IntRange(2, 6).Draw(t, "parts")
		tab, g := newTable(1), newGrid(nParts, 1)
		for i := range rapid.IntRange(1, 40).Draw(t, "steps") {
			p := rapid.IntRange(0, nParts-1).Draw(t, "part")
			if d := rapid.Int64Range(-3, 8).Draw(t, "delta"); d >= 0 || g[p][0].Value()+d >= 0 {
				g[p][0].Carry(d)
			}
			tab.Serial = rapid.Bool().Draw(t, "serial")
			v, lim := g.Part(p, 0)
			ref, rg := clone(tab, g)
			ref.Exceed(rg, p, 0)
			if v > lim {
				tab.Passed(g, p, 0, v, lim)
			}
			for q := range g {
				if g[q][0].Limit() != rg[q][0].Limit() {
					t.Fatalf("step %d: part %d's limit %d after Passed, %d after Exceed", i, q, g[q][0].Limit(), rg[q][0].Limit())
				}
			}
			if tab.peak[0] != ref.peak[0] || tab.spare[0] != ref.spare[0] || tab.riser[0] != ref.riser[0] ||
				tab.lent[0] != ref.lent[0] {
				t.Fatalf("step %d: table differs after Passed from after Exceed", i)
			}
			if msg := broken(tab, g); msg != "" {
				t.Fatalf("step %d: %s", i, msg)
			}
		}
	})
}

// TestRiserTakenIsPassed: a caller that, in Serial, takes the riser's
// room itself where Risers names a riser whose room covers the need (the
// riser's limit becoming its value, the part's rising by the room, and
// the part named the riser) leaves the limits, the peak, the spare room
// and the riser as Passed does, over a run of random rises and falls,
// with spare room left by a part's lowered limit now and then.
func TestRiserTakenIsPassed(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		nParts := rapid.IntRange(2, 6).Draw(t, "parts")
		tab, g := newTable(1), newGrid(nParts, 1)
		tab.Serial = true
		tab.peak[0] = rapid.Int64Range(0, 20).Draw(t, "peak")
		for i := range rapid.IntRange(1, 60).Draw(t, "steps") {
			p := rapid.IntRange(0, nParts-1).Draw(t, "part")
			if d := rapid.Int64Range(-3, 8).Draw(t, "delta"); d >= 0 || g[p][0].Value()+d >= 0 {
				g[p][0].Carry(d)
			}
			if q := rapid.IntRange(0, nParts-1).Draw(t, "spare"); q != p {
				// q's room below its limit goes to the spare room.
				tab.spare[0] += g[q][0].Limit() - g[q][0].Value()
				g[q][0].SetLimit(g[q][0].Value())
			}
			v, lim := g.Part(p, 0)
			if v <= lim {
				continue
			}
			ref, rg := clone(tab, g)
			ref.Passed(rg, p, 0, v, lim)
			rs := tab.Risers()
			if h := int(rs[0]); v-lim > tab.spare[0] && h != p && h >= 0 && h < nParts {
				if hv, hl := g.Part(h, 0); hl-hv >= v-lim {
					g.SetLimit(h, 0, hv)
					g.SetLimit(p, 0, lim+hl-hv)
					rs[0] = int32(p)
				} else {
					tab.Passed(g, p, 0, v, lim)
				}
			} else {
				tab.Passed(g, p, 0, v, lim)
			}
			for q := range g {
				if g[q][0].Limit() != rg[q][0].Limit() {
					t.Fatalf("step %d: part %d's limit %d taken from the riser, %d after Passed", i, q, g[q][0].Limit(), rg[q][0].Limit())
				}
			}
			if tab.peak[0] != ref.peak[0] || tab.spare[0] != ref.spare[0] || tab.riser[0] != ref.riser[0] {
				t.Fatalf("step %d: the table differs from Passed's", i)
			}
			if msg := broken(tab, g); msg != "" {
				t.Fatalf("step %d: %s", i, msg)
			}
		}
	})
}

// TestRiserAcrossSerial: the part that took a row's room in Serial is the
// row's riser outside Serial too, and the other way round, so that a row
// whose rises switch between the modes (stream events pending, then
// none) finds the room where the other mode left it: a pass that the
// room covers borrows it, reading no row.
func TestRiserAcrossSerial(t *testing.T) {
	tab := newTable(1)
	g := &rowReads{grid: newGrid(4, 1)}
	tab.peak[0] = 100
	// Outside Serial, part 1 rises twice: the second reading makes it the
	// riser, with most of the room.
	for range 2 {
		g.grid[1][0].Bump(g.Limit(1, 0) - g.Value(1, 0) + 1)
		tab.Exceed(g, 1, 0)
	}
	if tab.riser[0] != 1 || g.rows != 2 {
		t.Fatalf("riser %d after %d readings; want 1 after 2", tab.riser[0], g.rows)
	}
	// In Serial, part 2 passes its limit by 5: part 1's room covers it,
	// part 2 takes all of it and the riser's place, reading no row.
	tab.Serial = true
	room := g.Limit(1, 0) - g.Value(1, 0)
	lim2 := g.Limit(2, 0)
	g.grid[2][0].Bump(lim2 - g.Value(2, 0) + 5)
	tab.Exceed(g, 2, 0)
	if g.rows != 2 || tab.riser[0] != 2 || g.Limit(2, 0) != lim2+room || g.Limit(1, 0) != g.Value(1, 0) {
		t.Fatalf("Serial: %d readings, riser %d, limits %d and %d; want 2, 2, %d and %d", g.rows, tab.riser[0], g.Limit(2, 0), g.Limit(1, 0), lim2+room, g.Value(1, 0))
	}
	// Outside Serial again, part 3 passes by 1: part 2, the riser of
	// Serial, lends it the need and an eighth of the rest, reading no row.
	tab.Serial = false
	room = g.Limit(2, 0) - g.Value(2, 0)
	lim3 := g.Limit(3, 0)
	g.grid[3][0].Bump(lim3 - g.Value(3, 0) + 1)
	tab.Exceed(g, 3, 0)
	give := (room - 1) / riserLends
	if g.rows != 2 || g.Limit(3, 0) != g.Value(3, 0)+give || tab.riser[0] != 2 || tab.lent[0] != 3 {
		t.Fatalf("outside Serial: %d readings, part 3's limit %d, riser %d, lent %d; want 2, %d, 2, 3", g.rows, g.Limit(3, 0), tab.riser[0], tab.lent[0], g.Value(3, 0)+give)
	}
	// In Serial again, part 0 passes by 1: part 2's room covers it.
	tab.Serial = true
	g.grid[0][0].Bump(g.Limit(0, 0) - g.Value(0, 0) + 1)
	tab.Exceed(g, 0, 0)
	if g.rows != 2 || tab.riser[0] != 0 {
		t.Fatalf("Serial again: %d readings, riser %d; want 2, 0", g.rows, tab.riser[0])
	}
	if s := broken(tab, &g.grid); s != "" {
		t.Fatal(s)
	}
}

// TestLendIsPassed: a caller that, outside Serial, lends from the riser
// itself where Lender names a riser whose room covers the need (the
// riser's limit falling by the need and what Lend gives, the part's
// rising by as much) leaves the limits, the peak, the spare room, the
// riser and its last loan as Passed does, over a run of random rises and
// falls, with spare room left by a part's lowered limit now and then.
func TestLendIsPassed(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		nParts := rapid.IntRange(2, 6).Draw(t, "parts")
		tab, g := newTable(1), newGrid(nParts, 1)
		tab.peak[0] = rapid.Int64Range(0, 40).Draw(t, "peak")
		lends := 0
		for i := range rapid.IntRange(1, 80).Draw(t, "steps") {
			p := rapid.IntRange(0, nParts-1).Draw(t, "part")
			if d := rapid.Int64Range(-3, 8).Draw(t, "delta"); d >= 0 || g[p][0].Value()+d >= 0 {
				g[p][0].Carry(d)
			}
			if q := rapid.IntRange(0, 3*nParts).Draw(t, "spare"); q < nParts && q != p {
				// q's room below its limit goes to the spare room.
				tab.spare[0] += g[q][0].Limit() - g[q][0].Value()
				g[q][0].SetLimit(g[q][0].Value())
			}
			v, lim := g.Part(p, 0)
			if v <= lim {
				continue
			}
			ref, rg := clone(tab, g)
			ref.Passed(rg, p, 0, v, lim)
			passed := true
			if h := tab.Lender(0, v-lim); h != p && h >= 0 && h < nParts {
				if hv, hl := g.Part(h, 0); hl-hv >= v-lim {
					give := tab.Lend(p, 0, v-lim, hl-hv)
					g.SetLimit(h, 0, hl-(v-lim)-give)
					g.SetLimit(p, 0, v+give)
					passed = false
					lends++
				}
			}
			if passed {
				tab.Passed(g, p, 0, v, lim)
			}
			for q := range g {
				if g[q][0].Limit() != rg[q][0].Limit() {
					t.Fatalf("step %d: part %d's limit %d lent by the riser, %d after Passed", i, q, g[q][0].Limit(), rg[q][0].Limit())
				}
			}
			if tab.peak[0] != ref.peak[0] || tab.spare[0] != ref.spare[0] || tab.riser[0] != ref.riser[0] || tab.lent[0] != ref.lent[0] {
				t.Fatalf("step %d: the table differs from Passed's", i)
			}
			if msg := broken(tab, g); msg != "" {
				t.Fatalf("step %d: %s", i, msg)
			}
		}
	})
}
