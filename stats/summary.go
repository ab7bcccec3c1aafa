// This file holds the memory summary: PyTorch's memory_summary table,
// rebuilt from a DeviceStats.

package stats

import (
	"fmt"
	"strconv"
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
	// Phases, if not empty, adds a section after PyTorch's table with the
	// memory of each phase: bytes allocated now and at the phase's peak,
	// allocations made and allocations alive.
	Phases []PhaseStats
	// Leaks, if not empty, adds a section listing the groups of
	// allocations whose number alive grew at each of the last step
	// boundaries.
	Leaks []Leak
}

// summaryWidth is the width of the table between its outer borders.
const summaryWidth = 75

// The horizontal rules of the table, borders and newline included.
var (
	doubleRule = "|" + strings.Repeat("=", summaryWidth) + "|\n"
	singleRule = "|" + strings.Repeat("-", summaryWidth) + "|\n"
)

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
	const lines = 48
	buf := make([]byte, 0, lines*(summaryWidth+3))
	rule := func(buf []byte, c byte) []byte {
		if c == '=' {
			return append(buf, doubleRule...)
		}
		return append(buf, singleRule...)
	}

	buf = rule(buf, '=')
	buf = append(buf, '|')
	buf = append(buf, summaryTitle(opt.Device, opt.Name)...)
	buf = append(buf, "|\n"...)
	buf = rule(buf, '-')
	buf = append(buf, "|            CUDA OOMs: "...)
	buf = appendPadded(buf, d.NumOOMs, -12)
	buf = append(buf, " |        cudaMalloc retries: "...)
	buf = appendPadded(buf, d.NumAllocRetries, -8)
	buf = append(buf, "  |\n"...)
	buf = rule(buf, '=')
	buf = append(buf, "|        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  |\n"...)

	pools := []struct {
		pool  Pool
		label string
	}{{All, ""}, {LargePool, "      from large pool"}, {SmallPool, "      from small pool"}}
	if opt.Abbreviated {
		pools = pools[:1]
	}
	for m := range NumMetrics {
		buf = rule(buf, '-')
		a := d.Of(m)
		for _, pl := range pools {
			label := pl.label
			if pl.pool == All {
				label = metrics[m].label
			}
			buf = appendSummaryLine(buf, label, &a[pl.pool], &a[All], metrics[m].bytes)
		}
	}
	buf = rule(buf, '-')
	buf = appendSummaryLine(buf, "Oversize allocations", &d.OversizeAllocations, &d.OversizeAllocations, false)
	buf = rule(buf, '-')
	buf = appendSummaryLine(buf, "Oversize GPU segments", &d.OversizeSegments, &d.OversizeSegments, false)
	buf = rule(buf, '=')
	if len(opt.Phases) > 0 {
		buf = appendCentered(buf, "Memory by phase")
		buf = rule(buf, '-')
		buf = append(buf, "| Phase                 | Cur Usage  | Peak Usage | Tot Allocs | Cur Allocs |\n"...)
		buf = rule(buf, '-')
		for _, ph := range opt.Phases {
			buf = appendRowLabel(buf, ph.Name)
			buf = appendSummarySize(buf, ph.AllocatedBytes.Current, ph.AllocatedBytes.Current)
			buf = append(buf, " | "...)
			buf = appendSummarySize(buf, ph.AllocatedBytes.Peak, ph.AllocatedBytes.Peak)
			buf = append(buf, " | "...)
			buf = appendSummaryCount(buf, ph.Allocations.Allocated, ph.Allocations.Allocated)
			buf = append(buf, " | "...)
			buf = appendSummaryCount(buf, ph.Allocations.Current, ph.Allocations.Current)
			buf = append(buf, " |\n"...)
		}
		buf = rule(buf, '=')
	}
	if len(opt.Leaks) > 0 {
		buf = appendCentered(buf, "Growing at every step: possible leaks, at the last step boundary")
		buf = rule(buf, '-')
		buf = append(buf, "| Phase or call site    | Block size | Alive      | Held       | Steps grew |\n"...)
		buf = rule(buf, '-')
		for _, l := range opt.Leaks {
			label, site := l.Phase, shortSite(l.Site)
			if label == "" {
				label = "(no phase)"
			}
			if site != "" {
				label = site
				if i := strings.Index(label, " ("); i > 0 {
					label = label[:i] // the function; the line below has the rest
				}
			}
			held := int64(min(l.Bytes(), 1<<62))
			buf = appendRowLabel(buf, label)
			buf = appendSummarySize(buf, int64(min(l.Size, 1<<62)), int64(min(l.Size, 1<<62)))
			buf = append(buf, " | "...)
			buf = appendSummaryCount(buf, l.Count(), l.Count())
			buf = append(buf, " | "...)
			buf = appendSummarySize(buf, held, held)
			buf = append(buf, " | "...)
			buf = appendSummaryCount(buf, int64(l.Grew), int64(l.Grew))
			buf = append(buf, " |\n"...)
			if site != "" {
				buf = appendTextLine(buf, "   at "+site)
			}
		}
		buf = rule(buf, '=')
	}
	return string(buf)
}

// printable replaces the characters of s that a terminal would not print
// with '?'.
func printable(s string) string {
	return strings.Map(func(r rune) rune {
		if !unicode.IsPrint(r) {
			return '?'
		}
		return r
	}, s)
}

// shortSite drops the package path from a call site
// ("github.com/x/y.f (f.go:12)" becomes "y.f (f.go:12)").
func shortSite(site string) string {
	fn, rest, _ := strings.Cut(site, " ")
	if i := strings.LastIndexByte(fn, '/'); i >= 0 {
		fn = fn[i+1:]
	}
	if rest != "" {
		return fn + " " + rest
	}
	return fn
}

// appendTextLine appends a table line holding text on the left, cut to
// fit; control characters print as '?'.
func appendTextLine(buf []byte, text string) []byte {
	text = printable(text)
	if utf8.RuneCountInString(text) > summaryWidth {
		text = string([]rune(text)[:summaryWidth-3]) + "..."
	}
	buf = append(buf, '|')
	buf = append(buf, text...)
	for i := utf8.RuneCountInString(text); i < summaryWidth; i++ {
		buf = append(buf, ' ')
	}
	return append(buf, "|\n"...)
}

// appendCentered appends a table line holding text centred.
func appendCentered(buf []byte, text string) []byte {
	left := (summaryWidth - len(text)) / 2
	buf = append(buf, '|')
	buf = append(buf, strings.Repeat(" ", left)...)
	buf = append(buf, text...)
	buf = append(buf, strings.Repeat(" ", summaryWidth-len(text)-left)...)
	return append(buf, "|\n"...)
}

// appendRowLabel appends the start of a row: its label in the first
// column, cut to fit (control characters print as '?'), and the column
// separator.
func appendRowLabel(buf []byte, label string) []byte {
	const width = 21
	label = printable(label)
	if utf8.RuneCountInString(label) > width {
		label = string([]rune(label)[:width-3]) + "..."
	}
	buf = append(buf, "| "...)
	buf = append(buf, label...)
	for i := utf8.RuneCountInString(label); i < width; i++ {
		buf = append(buf, ' ')
	}
	return append(buf, " | "...)
}

// appendSummaryLine appends one table line: label, then the four fields of
// s, each in the unit that the matching field of pref selects.
func appendSummaryLine(buf []byte, label string, s, pref *Stat, bytes bool) []byte {
	format := appendSummaryCount
	if bytes {
		format = appendSummarySize
	}
	buf = append(buf, "| "...)
	buf = append(buf, label...)
	for i := len(label); i < 21; i++ {
		buf = append(buf, ' ')
	}
	buf = append(buf, " | "...)
	buf = format(buf, s.Current, pref.Current)
	buf = append(buf, " | "...)
	buf = format(buf, s.Peak, pref.Peak)
	buf = append(buf, " | "...)
	buf = format(buf, s.Allocated, pref.Allocated)
	buf = append(buf, " | "...)
	buf = format(buf, s.Freed, pref.Freed)
	return append(buf, " |\n"...)
}

// appendPadded appends v in decimal, padded with spaces to |width| columns:
// on the left for a positive width, on the right for a negative one. A
// wider number is not cut.
func appendPadded(buf []byte, v int64, width int) []byte {
	var tmp [20]byte
	digits := strconv.AppendInt(tmp[:0], v, 10)
	pad := width
	if pad < 0 {
		pad = -pad
	}
	pad -= len(digits)
	if width > 0 {
		for ; pad > 0; pad-- {
			buf = append(buf, ' ')
		}
	}
	buf = append(buf, digits...)
	for ; pad > 0; pad-- {
		buf = append(buf, ' ')
	}
	return buf
}

// appendSummarySize appends v in the byte unit chosen by pref:
// right-aligned in six columns, then a space and a three-column unit.
//
// The unit climbs while pref is at least 768 of the next unit. As in
// PyTorch, the first test compares the integer, the later ones a float64
// that has been divided by 1024 each time, and v is floor-divided.
func appendSummarySize(buf []byte, v, pref int64) []byte {
	units := [...]string{"B  ", "KiB", "MiB", "GiB", "TiB", "PiB"}
	v, u := climbUnit(v, pref, 1024, 768*1024, len(units))
	buf = appendPadded(buf, v, 6)
	buf = append(buf, ' ')
	return append(buf, units[u]...)
}

// climbUnit picks the unit of a summary cell: it divides v (flooring) by
// step while pref is at least threshold of the next unit, up to n units.
// As in PyTorch, the first test compares the integer pref, the later ones
// a float64 divided by step each time. It returns v in that unit and the
// unit's index.
func climbUnit(v, pref, step, threshold int64, n int) (int64, int) {
	u := 0
	if pref >= threshold {
		p := float64(pref)
		for u+1 < n {
			if u > 0 && p < float64(threshold) {
				break
			}
			u++
			v = floorDiv(v, step)
			p /= float64(step)
		}
	}
	return v, u
}

// appendSummaryCount appends v in the count unit chosen by pref:
// right-aligned in seven columns, then a space, a one-column unit and a
// space. The unit climbs to K and then M while pref is at least 750
// thousand of the next unit, with the same integer-then-float tests as
// appendSummarySize.
func appendSummaryCount(buf []byte, v, pref int64) []byte {
	units := [...]string{" ", "K", "M"}
	v, u := climbUnit(v, pref, 1000, 750*1000, len(units))
	buf = appendPadded(buf, v, 7)
	buf = append(buf, ' ')
	buf = append(buf, units[u]...)
	return append(buf, ' ')
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
		name = printable(name)
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
	// At most 73 runes: the longest ordinal leaves room for the name.
	n := utf8.RuneCountInString(title)
	left := (summaryWidth - n) / 2
	return strings.Repeat(" ", left) + title + strings.Repeat(" ", summaryWidth-n-left)
}
