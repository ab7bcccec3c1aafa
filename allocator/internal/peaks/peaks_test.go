package peaks

import (
	"fmt"
	"strings"
	"testing"

	"pgregory.net/rapid"
)

// grid is a Parts whose counts are kept by part, then row.
type grid [][]Count

func newGrid(parts, rows int) grid {
	g := make(grid, parts)
	for p := range g {
		g[p] = make([]Count, rows)
	}
	return g
}

func (g grid) Len() int                     { return len(g) }
func (g grid) Part(p, r int) (v, lim int64) { return g[p][r].Value(), g[p][r].Limit() }

// Value and Limit are the tests' own reads of one count.
func (g grid) Value(p, r int) int64         { return g[p][r].Value() }
func (g grid) Limit(p, r int) int64         { return g[p][r].Limit() }
func (g grid) SetLimit(p, r int, lim int64) { g[p][r].SetLimit(lim) }
func (g grid) SetLimitPair(p, q, r int, limP, limQ int64) {
	g[p][r].SetLimit(limP)
	g[q][r].SetLimit(limQ)
}

func (g grid) Row(r int, vals, lims []int64) {
	for p := range g {
		vals[p], lims[p] = g[p][r].Value(), g[p][r].Limit()
	}
}

func (g grid) SetLimits(r int, lims []int64) {
	for p := range g {
		g[p][r].SetLimit(lims[p])
	}
}

func (g grid) Tighten(r int) (total int64) {
	for p := range g {
		g[p][r].SetLimit(g[p][r].Value())
		total += g[p][r].Value()
	}
	return total
}

// broken returns what Check reports, one line per break.
func broken(t *Table, ps Parts) string {
	var out []string
	t.Check(ps, func(r, p int, msg string) { out = append(out, fmt.Sprintf("row %d part %d: %s", r, p, msg)) })
	return strings.Join(out, "\n")
}

func newTable(rows int) *Table {
	t := &Table{}
	for range rows {
		t.AddRow(0)
	}
	return t
}

// twoParts returns a table of one row whose peak is peak, and two parts
// of it: part 0 at v0, its limit at its value, and part 1 at v1 with the
// limit lim1.
func twoParts(v0, v1, lim1, peak int64) (*Table, grid) {
	tab := newTable(1)
	g := newGrid(2, 1)
	g[0][0], g[1][0] = NewCount(v0), NewCount(v1)
	g[1][0].SetLimit(lim1)
	tab.peak[0] = peak
	tab.spare[0] = peak - v0 - lim1 // no room is lost: the spare room is what the limits leave
	return tab, g
}

func TestBumpReportsPassingTheLimit(t *testing.T) {
	c := NewCount(5)
	if !c.Bump(1) || c.Value() != 6 {
		t.Fatalf("a bump past the limit 5: value %d", c.Value())
	}
	c.SetLimit(10)
	if c.Bump(4) || c.Value() != 10 {
		t.Fatalf("a bump to the limit 10 passed it: value %d", c.Value())
	}
	c.Drop(3)
	c.Carry(-2)
	c.Carry(1)
	if c.Value() != 6 || c.Limit() != 10 {
		t.Fatalf("value %d, limit %d; want 6 and 10", c.Value(), c.Limit())
	}
	if n := c.Carried(3); n != 3 || c.Value() != 9 || c.Limit() != 10 {
		t.Fatalf("Carried(3) returned %d: value %d, limit %d; want 3, 9 and 10", n, c.Value(), c.Limit())
	}
}

// TestExceedShrinksTheOthers: part 0 passes its limit by more than the
// other's limit leaves room for: the peak rises to the total and the
// other's limit shrinks to its value.
func TestExceedShrinksTheOthers(t *testing.T) {
	tab, g := twoParts(5, 1, 5, 10)
	if !g[0][0].Bump(6) {
		t.Fatal("11 did not pass the limit 5")
	}
	tab.Exceed(g, 0, 0)
	if tab.Peak(0) != 12 || g.Limit(0, 0) != 11 || g.Limit(1, 0) != 1 {
		t.Fatalf("peak %d, limits %d and %d; want 12, 11 and 1", tab.Peak(0), g.Limit(0, 0), g.Limit(1, 0))
	}
	if s := broken(tab, g); s != "" {
		t.Fatal(s)
	}
	// A part within its limit changes nothing.
	tab.Exceed(g, 1, 0)
	if tab.Peak(0) != 12 || g.Limit(1, 0) != 1 {
		t.Fatal("Exceed of a part within its limit changed the peak or its limit")
	}
}

// TestExceedSharesTheRoom: below the peak, when the others' limits leave
// too little room, the room below the peak is shared evenly: each other
// part gets its value plus its share, the part that passed the rest, so
// that the next part to rise need not pass its limit at once.
func TestExceedSharesTheRoom(t *testing.T) {
	tab := newTable(1)
	g := newGrid(3, 1)
	g[0][0], g[1][0], g[2][0] = NewCount(10), NewCount(5), NewCount(5)
	g[1][0].SetLimit(10)
	g[2][0].SetLimit(10)
	tab.peak[0] = 30
	g[0][0].Bump(2) // 12 passes 10; 12 + 10 + 10 > 30
	tab.Exceed(g, 0, 0)
	// Total 22, room 8: a share of 2 each, and the 2 the division
	// leaves to the others, one each: 8, 8 and 30 - 16.
	if tab.Peak(0) != 30 || g.Limit(0, 0) != 14 || g.Limit(1, 0) != 8 || g.Limit(2, 0) != 8 {
		t.Fatalf("peak %d, limits %d, %d and %d; want 30, 14, 8 and 8", tab.Peak(0), g.Limit(0, 0), g.Limit(1, 0), g.Limit(2, 0))
	}
	if s := broken(tab, g); s != "" {
		t.Fatal(s)
	}
	if g[1][0].Bump(3) {
		t.Fatal("a rise of another part within its share passed its limit")
	}
	// Room 1 among 3 parts: the division gives none, the rest one to
	// the first other part.
	tab.peak[0] = 27
	g[0][0], g[1][0], g[2][0] = NewCount(12), NewCount(8), NewCount(5)
	g[0][0].SetLimit(14)
	g[2][0].Bump(1) // 6 passes 5, and 14 + 8 + 6 > 27
	tab.Exceed(g, 2, 0)
	if tab.Peak(0) != 27 || g.Limit(0, 0) != 13 || g.Limit(1, 0) != 8 || g.Limit(2, 0) != 6 {
		t.Fatalf("peak %d, limits %d, %d and %d; want 27, 13, 8 and 6", tab.Peak(0), g.Limit(0, 0), g.Limit(1, 0), g.Limit(2, 0))
	}
	if s := broken(tab, g); s != "" {
		t.Fatal(s)
	}
}

// TestExceedKeepsTheOthersWithRoom: the others' limits leave room: they
// stay, and the part gets the rest of the peak.
func TestExceedKeepsTheOthersWithRoom(t *testing.T) {
	tab, g := twoParts(0, 0, 3, 20)
	g[0][0].Bump(4)
	tab.Exceed(g, 0, 0)
	if tab.Peak(0) != 20 || g.Limit(0, 0) != 17 || g.Limit(1, 0) != 3 {
		t.Fatalf("peak %d, limits %d and %d; want 20, 17 and 3", tab.Peak(0), g.Limit(0, 0), g.Limit(1, 0))
	}
}

// rowReads is a grid that counts the Table's reads of whole rows.
type rowReads struct {
	grid
	rows int
}

func (g *rowReads) Row(r int, vals, lims []int64) {
	g.rows++
	g.grid.Row(r, vals, lims)
}

func (g *rowReads) Tighten(r int) int64 {
	g.rows++
	return g.grid.Tighten(r)
}

// TestSerialExceedTakesFromTheSpareRoom: in Serial, a reading of the row
// sets every limit to its value and gives the room below the peak to the
// part that passed its limit, the row's riser; a later pass by another
// part that the riser's room (its limit less its value) covers takes all
// of it, reading no row, and makes that part the riser; a pass that the
// spare room (as a cut of several operations leaves it) holds takes what
// it needs and half the rest from it; a pass that neither covers reads
// the row again.
func TestSerialExceedTakesFromTheSpareRoom(t *testing.T) {
	tab := newTable(1)
	tab.Serial = true
	g := &rowReads{grid: newGrid(3, 1)}
	g.grid[0][0], g.grid[1][0], g.grid[2][0] = NewCount(10), NewCount(6), NewCount(4)
	g.grid[1][0].SetLimit(10)
	tab.peak[0] = 30     // limits 10, 10 and 4: the spare room is 6, unknown to the table (0)
	g.grid[2][0].Bump(3) // 7 passes 4
	tab.Exceed(g, 2, 0)
	// Total 23, room 7: limits 10, 6 and 7 + 7; spare room 0; part 2, the riser, holds the room.
	want := func(rows int, peak, l0, l1, l2, spare int64) {
		t.Helper()
		if g.rows != rows || tab.Peak(0) != peak || g.Limit(0, 0) != l0 || g.Limit(1, 0) != l1 || g.Limit(2, 0) != l2 || tab.spare[0] != spare {
			t.Fatalf("rows read %d, peak %d, limits %d %d %d, spare %d; want %d, %d, %d %d %d, %d",
				g.rows, tab.Peak(0), g.Limit(0, 0), g.Limit(1, 0), g.Limit(2, 0), tab.spare[0], rows, peak, l0, l1, l2, spare)
		}
		if s := broken(tab, &g.grid); s != "" {
			t.Fatal(s)
		}
	}
	want(1, 30, 10, 6, 14, 0)
	g.grid[1][0].Bump(2) // 8 passes 6 by 2: part 2's room 7 covers it
	tab.Exceed(g, 1, 0)
	want(1, 30, 10, 13, 7, 0)
	g.grid[0][0].Drop(4) // 6; its limit gives the 4 to the spare room
	g.grid[0][0].SetLimit(6)
	tab.spare[0] = 4
	g.grid[2][0].Bump(2) // 9 passes 7 by 2: the spare room 4 holds it, and gives half the rest
	tab.Exceed(g, 2, 0)
	want(1, 30, 6, 13, 10, 1)
	g.grid[0][0].Bump(5) // 11 passes 6 by 5: the riser, part 1, has 13 - 8
	tab.Exceed(g, 0, 0)
	want(1, 30, 11, 8, 10, 1)
	g.grid[2][0].Bump(5) // 14 passes 10 by 4: the riser has no room, the spare room 1: the row is read
	tab.Exceed(g, 2, 0)
	// Total 11 + 8 + 14 = 33: a new peak, no room.
	want(2, 33, 11, 8, 14, 0)
	// Not Serial: the spare room goes whole to the part that needs it.
	tab.Serial = false
	tab.ResetPeaks(g)
	g.grid[0][0].Drop(4) // total 29 under the peak 33; its limit gives the 4 to the spare room
	g.grid[0][0].SetLimit(7)
	tab.spare[0] = 4
	g.grid[1][0].Bump(1)
	tab.Exceed(g, 1, 0)
	want(2, 33, 7, 12, 14, 0)
}

// TestCutCountsInTheGivenOrder: two waiting operations change one row in
// opposite ways; the peak is that of their order in the cut, not of their
// sum.
func TestCutCountsInTheGivenOrder(t *testing.T) {
	for _, c := range []struct {
		first int
		want  int64
	}{{0, 14}, {1, 10}} {
		tab := newTable(1)
		g := newGrid(2, 1)
		g[1][0] = NewCount(4)
		tab.peak[0] = 4
		g[0][0].Bump(10) // part 0: +10, past its limit 0
		g[1][0].Drop(4)  // part 1: -4
		ops := []Op{{Part: 0, Changes: []Change{{0, 10}}}, {Part: 1, Changes: []Change{{0, -4}}}}
		if c.first == 1 {
			ops[0], ops[1] = ops[1], ops[0]
		}
		tab.Cut(g, ops)
		if tab.Peak(0) != c.want {
			t.Errorf("part %d first: peak %d, want %d", c.first, tab.Peak(0), c.want)
		}
		if s := broken(tab, g); s != "" {
			t.Error(s)
		}
	}
}

func TestResetPeaks(t *testing.T) {
	tab := newTable(2)
	g := newGrid(2, 2)
	g[0][0].Bump(7)
	g[1][1].Bump(3)
	tab.Exceed(g, 0, 0)
	tab.Exceed(g, 1, 1)
	g[0][0].Drop(5)
	tab.ResetPeaks(g)
	if tab.Peak(0) != 2 || tab.Peak(1) != 3 || g.Limit(0, 0) != 2 || g.Limit(1, 0) != 0 {
		t.Fatalf("peaks %d %d, limits %d %d; want 2 3 2 0", tab.Peak(0), tab.Peak(1), g.Limit(0, 0), g.Limit(1, 0))
	}
}

// TestCheckReportsEachBreak breaks each invariant and requires Check to
// name it.
func TestCheckReportsEachBreak(t *testing.T) {
	tab := newTable(1)
	g := newGrid(2, 1)
	g[0][0].Bump(3)
	tab.Exceed(g, 0, 0)
	if s := broken(tab, g); s != "" {
		t.Fatal(s)
	}
	g[1][0].Carry(1)
	if s := broken(tab, g); !strings.Contains(s, "part 1: 1 is above its limit 0") || !strings.Contains(s, "peak 3 is below the total 4") {
		t.Fatalf("a value above its limit: %q", s)
	}
	g[1][0].Carry(-1)
	g[1][0].SetLimit(1)
	if s := broken(tab, g); !strings.Contains(s, "part -1: peak 3 is below the total 3 or the sum of the limits 4 and the spare room 0") {
		t.Fatalf("limits above the peak: %q", s)
	}
	g[1][0].SetLimit(0)
	tab.spare[0] = 1
	if s := broken(tab, g); !strings.Contains(s, "part -1: peak 3 is below the total 3 or the sum of the limits 3 and the spare room 1") {
		t.Fatalf("spare room above what the limits leave: %q", s)
	}
	tab.peak[0], tab.spare[0] = 5, -1
	if s := broken(tab, g); !strings.Contains(s, "the spare room -1") {
		t.Fatalf("negative spare room: %q", s)
	}
}

// TestSoleIsExceedOfOnePart: with one part, Sole and setting the limit to
// the value do what Exceed does.
func TestSoleIsExceedOfOnePart(t *testing.T) {
	a, b := newTable(1), newTable(1)
	ga, gb := newGrid(1, 1), newGrid(1, 1)
	for _, n := range []int64{3, -2, 5, 1, -6, 9} {
		for _, g := range []grid{ga, gb} {
			if n > 0 {
				g[0][0].Bump(n)
			} else {
				g[0][0].Drop(-n)
			}
		}
		a.Exceed(ga, 0, 0)
		if v := gb.Value(0, 0); v > gb.Limit(0, 0) {
			gb[0][0].SetLimit(v)
			b.Sole(0, v)
		}
		if a.Peak(0) != b.Peak(0) || ga.Limit(0, 0) != gb.Limit(0, 0) || a.Peak(0) != ga.Limit(0, 0) {
			t.Fatalf("after %d: Exceed gives peak %d limit %d, Sole %d and %d", n, a.Peak(0), ga.Limit(0, 0), b.Peak(0), gb.Limit(0, 0))
		}
	}
}

// TestPeaksAreThoseOfASerialOrder runs random interleavings of
// operations on parts that run alone (Bump, Drop; one that passes a limit
// waits for a cut, or, with one part, runs Sole), operations with every
// lock held (Exceed), cuts and peak resets. At every moment all locks are
// held, the peaks must equal those of the serial order the package
// promises: an operation within its limits counts when it ran, one in
// the world when it ran, a waiting one at its cut, in the cut's order.
// The invariants must hold then too.
func TestPeaksAreThoseOfASerialOrder(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		nParts := rapid.IntRange(1, 10).Draw(t, "parts")
		nRows := rapid.IntRange(1, 3).Draw(t, "rows")
		tab := newTable(nRows)
		g := newGrid(nParts, nRows)
		waiting := make([]*Op, nParts)
		// The serial order's totals and peaks.
		totals, peaks := make([]int64, nRows), make([]int64, nRows)
		count := func(cs []Change) {
			for _, c := range cs {
				totals[c.Row] += c.Delta
				peaks[c.Row] = max(peaks[c.Row], totals[c.Row])
			}
		}
		draw := func(label string) []Change {
			var cs []Change
			for r := range nRows {
				if d := rapid.Int64Range(-4, 6).Draw(t, label); d != 0 {
					cs = append(cs, Change{r, d})
				}
			}
			return cs
		}
		apply := func(p int, cs []Change) (passed bool) {
			for _, c := range cs {
				if c.Delta > 0 {
					passed = g[p][c.Row].Bump(c.Delta) || passed
				} else {
					g[p][c.Row].Drop(-c.Delta)
				}
			}
			return passed
		}
		// world takes every lock: the waiting operations are settled
		// first, in the order of the parts, and the state is checked.
		world := func() {
			var ops []Op
			for p, op := range waiting {
				if op != nil {
					ops = append(ops, *op)
					count(op.Changes)
					waiting[p] = nil
				}
			}
			if len(ops) > 0 {
				tab.Cut(g, ops)
			}
			for r := range nRows {
				var sum int64
				for p := range nParts {
					sum += g[p][r].Value()
				}
				if sum != totals[r] || tab.Peak(r) != peaks[r] {
					t.Fatalf("row %d: total %d, peak %d; the serial order's are %d and %d", r, sum, tab.Peak(r), totals[r], peaks[r])
				}
			}
			if s := broken(tab, g); s != "" {
				t.Fatal(s)
			}
		}
		steps := rapid.IntRange(1, 60).Draw(t, "steps")
		for range steps {
			// The caller may say at any time whether the parts run alone:
			// the peaks must not depend on it.
			tab.Serial = rapid.Bool().Draw(t, "serial")
			switch rapid.IntRange(0, 9).Draw(t, "kind") {
			case 0, 1, 2, 3, 4, 5: // an operation under its part's lock alone
				p := rapid.IntRange(0, nParts-1).Draw(t, "part")
				if waiting[p] != nil {
					world() // a part whose operation waits runs no other: the next takes the world
				}
				cs := draw("delta")
				if !apply(p, cs) {
					count(cs)
					continue
				}
				if nParts == 1 { // the one part raises its limits and the peaks itself
					for _, c := range cs {
						if v := g.Value(0, c.Row); v > g.Limit(0, c.Row) {
							g[0][c.Row].SetLimit(v)
							tab.Sole(c.Row, v)
						}
					}
					count(cs)
					continue
				}
				waiting[p] = &Op{Part: p, Changes: cs}
			case 6, 7: // an operation in the world
				world()
				p := rapid.IntRange(0, nParts-1).Draw(t, "part")
				cs := draw("delta")
				apply(p, cs)
				count(cs)
				for _, c := range cs {
					tab.Exceed(g, p, c.Row)
				}
				world()
			case 8: // a reset of the peaks
				world()
				tab.ResetPeaks(g)
				copy(peaks, totals)
				world()
			case 9:
				world()
			}
		}
		world()
	})
}
