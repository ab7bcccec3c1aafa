package pack

import (
	"context"
	"testing"

	"github.com/gpumem/gpumem/trace"
)

// stepItems returns the blocks that the second step of the BERT training
// trace allocates and frees within the step, as the allocator's planned
// policy packs them, and the step's number of operations.
func stepItems(tb testing.TB) ([]Item, int) {
	ops, err := trace.ReadFile("../../trace/testdata/bert_b2.trace.gz")
	if err != nil {
		tb.Fatal(err)
	}
	items, n := stepOf(ops, 1)
	if len(items) == 0 {
		tb.Fatal("no step")
	}
	return items, n
}

// BenchmarkGreedyStep packs BERT's step by size, under each fit, as the
// allocator's planned policy does at a step boundary (by first fit a
// step the program marks, by best fit one the policy finds), and in time
// order beside them.
func BenchmarkGreedyStep(b *testing.B) {
	items, ops := stepItems(b)
	idx := orderOf(items, Orders[0])
	offsets := make([]uint64, len(items))
	for _, fit := range []struct {
		name string
		fit  Fit
	}{{"best", BestFit}, {"first", FirstFit}} {
		b.Run(fit.name, func(b *testing.B) {
			var fp uint64
			for b.Loop() {
				fp = Greedy(context.Background(), items, ops, idx, offsets, fit.fit, nil)
			}
			b.ReportMetric(float64(len(items)), "items")
			b.ReportMetric(float64(fp), "footprint")
		})
	}
	b.Run("time order", func(b *testing.B) {
		var fp uint64
		for b.Loop() {
			fp = TimeOrder(items, offsets, nil)
		}
		b.ReportMetric(float64(len(items)), "items")
		b.ReportMetric(float64(fp), "footprint")
	})
}
