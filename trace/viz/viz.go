// This file holds the pictures of a replay: a memory timeline and a map of
// the segments at the peak, as one standalone SVG.

package viz

import (
	"fmt"
	"html"
	"io"
	"math"
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
	x := func(op int64) float64 { return plotLeft + plotW*float64(op)/float64(maxX) }
	y := func(v int64) float64 { return plotTop + plotHeight - plotHeight*float64(v)/float64(maxY) }
	// Axes and a few ticks.
	fmt.Fprintf(b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="black"/>`+"\n", plotLeft, plotTop+plotHeight, svgWidth-plotRight, plotTop+plotHeight)
	fmt.Fprintf(b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="black"/>`+"\n", plotLeft, plotTop, plotLeft, plotTop+plotHeight)
	for i := 0; i <= 4; i++ {
		v := maxY * int64(i) / 4
		fmt.Fprintf(b, `<text x="%d" y="%.1f" text-anchor="end">%s</text>`+"\n", plotLeft-6, y(v)+4, html.EscapeString(stats.FormatSize(uint64(v))))
		fmt.Fprintf(b, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#ddd"/>`+"\n", plotLeft, y(v), svgWidth-plotRight, y(v))
	}
	fmt.Fprintf(b, `<text x="%d" y="%d" text-anchor="end">%d ops</text>`+"\n", svgWidth-plotRight, plotTop+plotHeight+18, maxX)
	series := []struct {
		name, color, dash string
		v                 func(Sample) int64
	}{
		{"reserved", "#d62728", "", func(s Sample) int64 { return s.Reserved }},
		{"allocated", "#1f77b4", "", func(s Sample) int64 { return s.Allocated }},
		{"requested", "#2ca02c", "4 3", func(s Sample) int64 { return s.Requested }},
	}
	for i, se := range series {
		var pts strings.Builder
		for _, s := range downsample(p.Samples, 2*int(plotW), se.v) {
			fmt.Fprintf(&pts, "%.1f,%.1f ", x(s.Op), y(se.v(s)))
		}
		fmt.Fprintf(b, `<polyline fill="none" stroke="%s" stroke-width="1.5" stroke-dasharray="%s" points="%s"/>`+"\n", se.color, se.dash, strings.TrimSpace(pts.String()))
		fmt.Fprintf(b, `<rect x="%d" y="%d" width="12" height="12" fill="%s"/><text x="%d" y="%d">%s</text>`+"\n",
			plotLeft+10+i*110, plotTop-20, se.color, plotLeft+26+i*110, plotTop-10, se.name)
	}
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
		`<tspan fill="#1f77b4">allocated</tspan>, <tspan fill="#ff7f0e">pending free</tspan>, <tspan fill="#999">free</tspan></text>`+"\n",
		plotLeft, top-10, p.PeakOp, len(p.Peak), html.EscapeString(stats.FormatSize(total)))
	if total == 0 {
		return
	}
	rowW := float64(svgWidth - plotLeft - plotRight)
	perPx := math.Max(float64(total)/(rowW*mapRows), 1)
	pos := 0.0 // pixels laid out so far, over all rows
	for _, s := range p.Peak {
		for _, blk := range s.Blocks {
			wpx := float64(blk.Size) / perPx
			color := "#999"
			switch blk.State {
			case allocator.BlockAllocated:
				color = "#1f77b4"
			case allocator.BlockPendingFree:
				color = "#ff7f0e"
			}
			for wpx > 0 {
				row := int(pos / rowW)
				if row >= mapRows {
					return
				}
				inRow := math.Min(wpx, float64(row+1)*rowW-pos)
				fmt.Fprintf(b, `<rect x="%.2f" y="%d" width="%.2f" height="%d" fill="%s"/>`+"\n",
					plotLeft+pos-float64(row)*rowW, top+row*(mapRowH+4), inRow, mapRowH, color)
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
