// This file holds the offline best that compare, fit and tune print beside
// every configuration: what an allocator that knew every lifetime in
// advance would need.

package main

import (
	"fmt"

	"github.com/gpumem/gpumem/stats"
	"github.com/gpumem/gpumem/trace"
	"github.com/gpumem/gpumem/trace/plan/offline"
)

// offlineBest packs the trace offline and checks the packing.
func offlineBest(ops []trace.Op) (*offline.Plan, error) {
	p, err := offline.Pack(ops)
	if err == nil {
		err = p.Check()
	}
	if err != nil {
		return nil, fmt.Errorf("offline packing: %w", err)
	}
	return p, nil
}

// offlineLine says what the offline best is, in one line of at most 100
// columns.
func offlineLine(p *offline.Plan) string {
	if p.Footprint == p.Bound {
		return fmt.Sprintf("offline best: %s, packed knowing every lifetime; it meets the bound (peak live bytes)",
			stats.FormatSize(p.Footprint))
	}
	return fmt.Sprintf("offline best: %s, packed knowing every lifetime; the bound: %s (peak live bytes)",
		stats.FormatSize(p.Footprint), stats.FormatSize(p.Bound))
}

// timesBest formats bytes as a multiple of the offline best: "1.043 x".
func timesBest(bytes int64, p *offline.Plan) string {
	if p.Footprint == 0 {
		return "-"
	}
	return fmt.Sprintf("%.3f x", float64(bytes)/float64(p.Footprint))
}
