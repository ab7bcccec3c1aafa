// This file holds the pictures of a replay: a memory timeline and a map of
// the segments at the peak, as one standalone SVG.

package viz

import (
	"fmt"
	"html"
	"io"
	"math"
	"strconv"
	"strings"

	"github.com/gpumem/gpumem/allocator"
	"github.com/gpumem/gpumem/stats"
	"github.com/gpumem/gpumem/trace"
	"github.com/gpumem/gpumem/trace/replay"
)

// Sample is the memory of a replay after some op.
type Sample struct {
	Op                             int64
	Requested, Allocated, Reserved int64
}

// Picture is what WriteSVG draws.
type Picture struct {
	Title    string
	Subtitle string
	Samples  []Sample                // in op order
	Peak     []allocator.SegmentInfo // the segments when reserved memory peaked
	PeakOp   int64
}

// Replay replays r through a, as replay.Run does on a's device, and
// samples a's memory after every batch of ops (64 unless opt.Batch says
// otherwise) for a Picture; it keeps the segment map at the highest
// reserved point it sees. The Result is Run's.
func Replay(r trace.OpReader, a *allocator.Allocator, opt replay.Options) (*Picture, *replay.Result, error) {
	pic := &Picture{Title: opt.Name}
	var best int64 = -1
	userProgress := opt.Progress
	if opt.Batch <= 0 {
		opt.Batch = 64
	}
	opt.Progress = func(ops int64) {
		st := a.Stats()
		s := Sample{Op: ops, Requested: st.RequestedBytes[stats.All].Current,
			Allocated: st.AllocatedBytes[stats.All].Current, Reserved: st.ReservedBytes[stats.All].Current}
		pic.Samples = append(pic.Samples, s)
		if s.Reserved > best {
			best = s.Reserved
			pic.Peak = a.Snapshot()
			pic.PeakOp = ops
		}
		if userProgress != nil {
			userProgress(ops)
		}
	}
	res, err := replay.Run(r, a, a.Device(), opt)
	if err != nil {
		return nil, nil, err
	}
	return pic, res, nil
}

const (
	svgWidth   = 1000
	plotLeft   = 80
	plotRight  = 20
	plotTop    = 70
	plotHeight = 260
	mapRows    = 10
	mapRowH    = 18
)

// WriteSVG draws the picture: the timeline of requested, allocated and
// reserved bytes, and below it the segment map at the peak (each segment a
// run of blocks: allocated, pending free, free), laid out in rows.
func (p *Picture) WriteSVG(w io.Writer) error {
	var b strings.Builder
	mapTop := plotTop + plotHeight + 70
	height := mapTop + mapRows*(mapRowH+4) + 40
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="12">`+"\n", svgWidth, height)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(&b, `<text x="%d" y="22" font-size="16">%s</text>`+"\n", plotLeft, html.EscapeString(p.Title))
	fmt.Fprintf(&b, `<text x="%d" y="40">%s</text>`+"\n", plotLeft, html.EscapeString(p.Subtitle))
	p.timeline(&b)
	p.segmentMap(&b, mapTop)
	b.WriteString("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

func (p *Picture) timeline(b *strings.Builder) {
	plotW := float64(svgWidth - plotLeft - plotRight)
	var maxY, maxX int64 = 1, 1
	for _, s := range p.Samples {
		maxY = max(maxY, s.Reserved, s.Allocated, s.Requested)
		maxX = max(maxX, s.Op)
	}
	yTicks := byteTicks(maxY)
	top := yTicks[len(yTicks)-1].v // the axis ends at a round value
	x := func(op int64) float64 { return plotLeft + plotW*float64(op)/float64(maxX) }
	y := func(v int64) float64 { return plotTop + plotHeight - plotHeight*float64(v)/float64(top) }
	// Axes, gridlines at round sizes (1, 2 or 5 times a power of ten of a
	// binary unit), and op ticks.
	fmt.Fprintf(b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="black"/>`+"\n", plotLeft, plotTop+plotHeight, svgWidth-plotRight, plotTop+plotHeight)
	fmt.Fprintf(b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="black"/>`+"\n", plotLeft, plotTop, plotLeft, plotTop+plotHeight)
	for _, t := range yTicks {
		fmt.Fprintf(b, `<text x="%d" y="%.1f" text-anchor="end">%s</text>`+"\n", plotLeft-6, y(t.v)+4, html.EscapeString(t.label))
		if t.v > 0 {
			fmt.Fprintf(b, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#ddd"/>`+"\n", plotLeft, y(t.v), svgWidth-plotRight, y(t.v))
		}
	}
	for _, t := range niceTicks(maxX, 1, "", false) {
		fmt.Fprintf(b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="black"/><text x="%.1f" y="%d" text-anchor="middle">%s</text>`+"\n",
			x(t.v), plotTop+plotHeight, x(t.v), plotTop+plotHeight+4, x(t.v), plotTop+plotHeight+17, t.label)
	}
	fmt.Fprintf(b, `<text x="%d" y="%d" text-anchor="end">ops</text>`+"\n", svgWidth-plotRight, plotTop+plotHeight+32)
	// Requested bytes are never more than allocated ones and often about
	// the same: requested is drawn first, as a wide pale band, and
	// allocated on top of it as a thin line, so that both show.
	series := []struct {
		name, color, style string
		v                  func(Sample) int64
	}{
		{"reserved", "#d62728", `stroke-width="1.5"`, func(s Sample) int64 { return s.Reserved }},
		{"requested", "#2ca02c", `stroke-width="6" stroke-opacity="0.35" stroke-linejoin="round"`, func(s Sample) int64 { return s.Requested }},
		{"allocated", "#1f77b4", `stroke-width="1.5"`, func(s Sample) int64 { return s.Allocated }},
	}
	for i, se := range series {
		var pts strings.Builder
		for _, s := range downsample(p.Samples, 2*int(plotW), se.v) {
			fmt.Fprintf(&pts, "%.1f,%.1f ", x(s.Op), y(se.v(s)))
		}
		peak, peakOp := peakOf(p.Samples, se.v)
		title := html.EscapeString(fmt.Sprintf("%s bytes: highest sample %s (%d bytes) after op %d", se.name, stats.FormatSize(uint64(peak)), peak, peakOp))
		fmt.Fprintf(b, `<polyline fill="none" stroke="%s" %s points="%s"><title>%s</title></polyline>`+"\n",
			se.color, se.style, strings.TrimSpace(pts.String()), title)
		if len(p.Samples) > 0 {
			fmt.Fprintf(b, `<circle cx="%.1f" cy="%.1f" r="3.5" fill="%s"><title>%s</title></circle>`+"\n", x(peakOp), y(peak), se.color, title)
		}
		// The legend shows each line as it is drawn.
		lx := plotLeft + 10 + i*120
		fmt.Fprintf(b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" %s/><text x="%d" y="%d">%s</text>`+"\n",
			lx, plotTop-14, lx+18, plotTop-14, se.color, se.style, lx+24, plotTop-10, se.name)
	}
}

// peakOf returns the highest value of v over the samples, and the op of
// the first sample that has it.
func peakOf(s []Sample, v func(Sample) int64) (peak, op int64) {
	for _, x := range s {
		if v(x) > peak {
			peak, op = v(x), x.Op
		}
	}
	return peak, op
}

// tick is a labelled value on an axis.
type tick struct {
	v     int64
	label string
}

// byteTicks returns round ticks from 0 to at least maxY bytes in the
// binary unit that suits maxY (B, KiB, MiB, GiB, TiB).
func byteTicks(maxY int64) []tick {
	unit, name := int64(1), "B"
	for _, u := range []struct {
		n    int64
		name string
	}{{1 << 10, "KiB"}, {1 << 20, "MiB"}, {1 << 30, "GiB"}, {1 << 40, "TiB"}} {
		if maxY >= u.n {
			unit, name = u.n, u.name
		}
	}
	return niceTicks(maxY, unit, name, true)
}

// niceTicks returns ticks at multiples of a round step (1, 2 or 5 times a
// power of ten, times unit), about five of them, from 0 up to the first
// multiple at or past maxV when cover is set, else up to maxV. Labels are
// the values in units, followed by name.
func niceTicks(maxV, unit int64, name string, cover bool) []tick {
	inUnits := float64(maxV) / float64(unit)
	exp := int(math.Floor(math.Log10(inUnits / 5)))
	step := math.Pow10(exp)
	for _, m := range []float64{1, 2, 5, 10} {
		if m*math.Pow10(exp) >= inUnits/5 {
			step = m * math.Pow10(exp)
			break
		}
	}
	if unit == 1 {
		// Whole ops and bytes: no fractional steps.
		step = math.Max(step, 1)
	}
	scale := 1.0 // labels are rounded to the step's decimals
	for step*scale < 1 {
		scale *= 10
	}
	var ticks []tick
	for i := 0; ; i++ {
		v := float64(i) * step
		bytes := int64(math.Round(v * float64(unit)))
		if bytes > maxV && (!cover || (len(ticks) > 0 && ticks[len(ticks)-1].v >= maxV)) {
			break
		}
		label := strconv.FormatFloat(math.Round(v*scale)/scale, 'f', -1, 64)
		if name != "" {
			label += " " + name
		}
		ticks = append(ticks, tick{bytes, label})
	}
	return ticks
}

// downsample keeps at most n samples, each the one with the largest value
// in its stretch, so that peaks survive.
func downsample(s []Sample, n int, v func(Sample) int64) []Sample {
	if len(s) <= n {
		return s
	}
	out := make([]Sample, 0, n)
	step := float64(len(s)) / float64(n)
	for i := range n {
		lo, hi := int(float64(i)*step), int(float64(i+1)*step)
		best := s[lo]
		for _, c := range s[lo:min(hi, len(s))] {
			if v(c) > v(best) {
				best = c
			}
		}
		out = append(out, best)
	}
	return out
}

func (p *Picture) segmentMap(b *strings.Builder, top int) {
	var total uint64
	for _, s := range p.Peak {
		total += s.Size
	}
	fmt.Fprintf(b, `<text x="%d" y="%d">segments at the peak of reserved memory (after op %d): %d segments, %s; blocks: `+
		`<tspan fill="#1f77b4">allocated</tspan>, <tspan fill="#ff7f0e">pending free</tspan>, <tspan fill="#999">free</tspan> (hover for details)</text>`+"\n",
		plotLeft, top-10, p.PeakOp, len(p.Peak), html.EscapeString(stats.FormatSize(total)))
	if total == 0 {
		return
	}
	rowW := float64(svgWidth - plotLeft - plotRight)
	perPx := math.Max(float64(total)/(rowW*mapRows), 1)
	pos := 0.0 // pixels laid out so far, over all rows
	for _, s := range p.Peak {
		pool := "large"
		if s.Pool == stats.SmallPool {
			pool = "small"
		}
		segment := fmt.Sprintf("segment %v: %s, %s pool, stream %d, %s allocated", s.Ptr, stats.FormatSize(s.Size), pool, s.Stream, stats.FormatSize(s.Allocated))
		if s.Expandable {
			segment += ", expandable"
		}
		for _, blk := range s.Blocks {
			wpx := float64(blk.Size) / perPx
			color := "#999"
			switch blk.State {
			case allocator.BlockAllocated:
				color = "#1f77b4"
			case allocator.BlockPendingFree:
				color = "#ff7f0e"
			}
			title := fmt.Sprintf("block %v: %s (%d bytes), %s", blk.Ptr, stats.FormatSize(blk.Size), blk.Size, blk.State)
			if blk.State != allocator.BlockFree {
				title += fmt.Sprintf(", %s requested", stats.FormatSize(blk.Requested))
			}
			title = html.EscapeString(title + "\n" + segment)
			for wpx > 0 {
				row := int(pos / rowW)
				if row >= mapRows {
					return
				}
				inRow := math.Min(wpx, float64(row+1)*rowW-pos)
				fmt.Fprintf(b, `<rect x="%.2f" y="%d" width="%.2f" height="%d" fill="%s"><title>%s</title></rect>`+"\n",
					plotLeft+pos-float64(row)*rowW, top+row*(mapRowH+4), inRow, mapRowH, color, title)
				pos += inRow
				wpx -= inRow
			}
		}
		// A white line marks the end of each segment.
		row := int(pos / rowW)
		if row < mapRows {
			fmt.Fprintf(b, `<rect x="%.2f" y="%d" width="1" height="%d" fill="white"/>`+"\n", plotLeft+pos-float64(row)*rowW, top+row*(mapRowH+4), mapRowH)
		}
	}
}
