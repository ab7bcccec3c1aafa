// This file holds the memory summary: PyTorch's memory_summary table,
// rebuilt from a DeviceStats.

package stats

import (
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// SummaryOptions selects what Summary prints.
type SummaryOptions struct {
	// Device is the device ordinal shown in the title.
	Device int
	// Name is the device name shown in the title, if not empty. A name too
	// long for the title line is cut and ends in "...".
	Name string
	// Abbreviated drops the "from large pool" and "from small pool" lines,
	// as PyTorch's memory_summary(abbreviated=True) does.
	Abbreviated bool
}

// summaryWidth is the width of the table between its outer borders.
const summaryWidth = 75

// A summaryRow is one block of the table: a stat and how to print it.
type summaryRow struct {
	stat  func(d *DeviceStats) *StatArray
	label string
	bytes bool // sizes in B/KiB/...; otherwise counts with K/M
}

var summaryRows = [...]summaryRow{
	{func(d *DeviceStats) *StatArray { return &d.AllocatedBytes }, "Allocated memory", true},
	{func(d *DeviceStats) *StatArray { return &d.ActiveBytes }, "Active memory", true},
	{func(d *DeviceStats) *StatArray { return &d.RequestedBytes }, "Requested memory", true},
	{func(d *DeviceStats) *StatArray { return &d.ReservedBytes }, "GPU reserved memory", true},
	{func(d *DeviceStats) *StatArray { return &d.InactiveSplitBytes }, "Non-releasable memory", true},
	{func(d *DeviceStats) *StatArray { return &d.Allocation }, "Allocations", false},
	{func(d *DeviceStats) *StatArray { return &d.Active }, "Active allocs", false},
	{func(d *DeviceStats) *StatArray { return &d.Segment }, "GPU reserved segments", false},
	{func(d *DeviceStats) *StatArray { return &d.InactiveSplit }, "Non-releasable allocs", false},
}

// Summary returns PyTorch 2.6's memory_summary table for d: the same rows,
// columns, borders and unit rules, so that it reads exactly like the
// PyTorch printout, down to the character. Only the title line differs: it
// names gpumem and the device ordinal and name instead of "PyTorch CUDA
// memory summary, device ID N".
//
// Each column of a block (current, peak, allocated, freed) picks its unit
// from the "all" row: sizes go up from B to KiB, MiB, GiB, TiB and PiB while
// the value is at least 768 of the next unit, counts go up to K and M while
// it is at least 750 thousand of the next; values are floored, never
// rounded. A pool row uses the unit of its "all" row, so a column reads as
// one scale. A nil d prints as all zeros.
func Summary(d *DeviceStats, opt SummaryOptions) string {
	if d == nil {
		d = new(DeviceStats)
	}
	rule := func(b *strings.Builder, c byte) {
		b.WriteByte('|')
		for range summaryWidth {
			b.WriteByte(c)
		}
		b.WriteString("|\n")
	}
	var b strings.Builder
	b.Grow(48 * (summaryWidth + 3))

	rule(&b, '=')
	b.WriteString("|" + summaryTitle(opt.Device, opt.Name) + "|\n")
	rule(&b, '-')
	fmt.Fprintf(&b, "|  %9s CUDA OOMs: %-12d | %6s cudaMalloc retries: %-8d  |\n",
		"", d.NumOOMs, "", d.NumAllocRetries)
	rule(&b, '=')
	b.WriteString("|        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  |\n")

	pools := []struct {
		pool  Pool
		label string
	}{{All, ""}, {LargePool, "      from large pool"}, {SmallPool, "      from small pool"}}
	if opt.Abbreviated {
		pools = pools[:1]
	}
	for _, row := range summaryRows {
		rule(&b, '-')
		a := row.stat(d)
		all := &a[All]
		for _, pl := range pools {
			label := pl.label
			if pl.pool == All {
				label = row.label
			}
			writeSummaryLine(&b, label, &a[pl.pool], all, row.bytes)
		}
	}

	for _, over := range []struct {
		s     *Stat
		label string
	}{{&d.OversizeAllocations, "Oversize allocations"}, {&d.OversizeSegments, "Oversize GPU segments"}} {
		rule(&b, '-')
		writeSummaryLine(&b, over.label, over.s, over.s, false)
	}
	rule(&b, '=')
	return b.String()
}

// writeSummaryLine writes one table line: label, then the four fields of s,
// each in the unit that the matching field of pref selects.
func writeSummaryLine(b *strings.Builder, label string, s, pref *Stat, bytes bool) {
	format := summaryCount
	if bytes {
		format = summarySize
	}
	fmt.Fprintf(b, "| %-21s | %s | %s | %s | %s |\n", label,
		format(s.Current, pref.Current),
		format(s.Peak, pref.Peak),
		format(s.Allocated, pref.Allocated),
		format(s.Freed, pref.Freed))
}

// summarySize formats v in the byte unit chosen by pref: right-aligned in
// six columns, then a space and a three-column unit.
//
// The unit climbs while pref is at least 768 of the next unit. As in
// PyTorch, the first test compares the integer, the later ones a float64
// that has been divided by 1024 each time, and v is floor-divided.
func summarySize(v, pref int64) string {
	units := [...]string{"B  ", "KiB", "MiB", "GiB", "TiB", "PiB"}
	u := 0
	if pref >= 768*1024 {
		p := float64(pref)
		for u+1 < len(units) {
			if u > 0 && p < 768*1024 {
				break
			}
			u++
			v = floorDiv(v, 1024)
			p /= 1024
		}
	}
	return fmt.Sprintf("%6d %s", v, units[u])
}

// summaryCount formats v in the count unit chosen by pref: right-aligned in
// seven columns, then a space, a one-column unit and a space. The unit
// climbs to K and then M while pref is at least 750 thousand of the next
// unit, with the same integer-then-float tests as summarySize.
func summaryCount(v, pref int64) string {
	units := [...]string{" ", "K", "M"}
	u := 0
	if pref >= 750*1000 {
		p := float64(pref)
		for u+1 < len(units) {
			if u > 0 && p < 750*1000 {
				break
			}
			u++
			v = floorDiv(v, 1000)
			p /= 1000
		}
	}
	return fmt.Sprintf("%7d %s ", v, units[u])
}

// floorDiv divides rounding toward negative infinity, as Python's //.
func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && (a < 0) != (b < 0) {
		q--
	}
	return q
}

// summaryTitle returns the title line's text between the borders: the
// gpumem title centred in summaryWidth columns. A long name is cut to fit;
// control characters in it print as '?'.
func summaryTitle(device int, name string) string {
	title := fmt.Sprintf("gpumem memory summary, device %d", device)
	if name != "" {
		name = strings.Map(func(r rune) rune {
			if !unicode.IsPrint(r) {
				return '?'
			}
			return r
		}, name)
		// Keep one blank column at each border, as PyTorch's title does.
		room := summaryWidth - 2 - utf8.RuneCountInString(title) - len(" ()")
		if n := utf8.RuneCountInString(name); n > room {
			const ellipsis = "..."
			if room < len(ellipsis)+1 {
				name = ""
			} else {
				name = string([]rune(name)[:room-len(ellipsis)]) + ellipsis
			}
		}
		if name != "" {
			title += " (" + name + ")"
		}
	}
	n := utf8.RuneCountInString(title)
	if n > summaryWidth {
		// Only an absurd device ordinal gets here; PyTorch widens its line
		// in that case too.
		return title
	}
	left := (summaryWidth - n) / 2
	return strings.Repeat(" ", left) + title + strings.Repeat(" ", summaryWidth-n-left)
}
