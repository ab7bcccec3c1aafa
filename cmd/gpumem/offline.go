// This file holds the offline best that compare, fit and tune print beside
// every configuration: what an allocator that knew every lifetime in
// advance would need.

package main

import (
	"context"
	"fmt"

	"github.com/gpumem/gpumem/stats"
	"github.com/gpumem/gpumem/trace"
	"github.com/gpumem/gpumem/trace/plan/offline"
)

// offlineResult is a trace's offline best, or why there is none: a trace
// the packing refuses (sizes that sum past 2^64 - 1 bytes, which a replay
// counts as out of memory) still compares, fits and tunes.
type offlineResult struct {
	plan *offline.Plan
	err  error
}

// offlineBest packs the trace offline and checks the packing.
func offlineBest(ctx context.Context, ops []trace.Op) *offlineResult {
	p, err := offline.PackContext(ctx, ops)
	if err == nil && ctx.Err() == nil {
		err = p.Check()
	}
	if err != nil {
		return &offlineResult{err: err}
	}
	return &offlineResult{plan: p}
}

// line says what the offline best is, in one line of at most 100 columns
// (or why there is none, in one line).
func (o *offlineResult) line() string {
	switch p := o.plan; {
	case p == nil:
		return "offline best: none: " + oneLine(o.err.Error())
	case p.Footprint == p.Bound:
		return fmt.Sprintf("offline best: %s, packed knowing every lifetime; it meets the bound (peak live bytes)",
			stats.FormatSize(p.Footprint))
	}
	return fmt.Sprintf("offline best: %s, packed knowing every lifetime; the bound: %s (peak live bytes)",
		stats.FormatSize(o.plan.Footprint), stats.FormatSize(o.plan.Bound))
}

// times formats bytes as a multiple of the offline best: "1.043 x", or
// "-" if there is none.
func (o *offlineResult) times(bytes int64) string {
	if o.plan == nil || o.plan.Footprint == 0 {
		return "-"
	}
	return fmt.Sprintf("%.3f x", float64(bytes)/float64(o.plan.Footprint))
}

// bytes returns the bound and the planned footprint for JSON: nil, left
// out, if there is no offline best.
func (o *offlineResult) bytes() (bound, planned *uint64) {
	if o.plan == nil {
		return nil, nil
	}
	return &o.plan.Bound, &o.plan.Footprint
}
