package allocator

import (
	"testing"

	"github.com/gpumem/gpumem/trace"
)

// bertStepReqs returns the planned policy's requests for the second step
// of the BERT training trace, as a step boundary records them (rounded
// sizes; lifetimes among the step's operations; arena: freed within the
// step), and the step's number of operations.
func bertStepReqs(tb testing.TB) ([]planReq, int) {
	ops, err := trace.ReadFile("../trace/testdata/bert_b2.trace.gz")
	if err != nil {
		tb.Fatal(err)
	}
	marks := 0
	pos := map[uint64]int{}
	var reqs []planReq
	t := 0
	for _, op := range ops {
		if op.Kind == trace.Mark {
			marks++
			continue
		}
		if marks != 2 {
			continue
		}
		switch op.Kind {
		case trace.Alloc:
			pos[op.ID] = len(reqs)
			reqs = append(reqs, planReq{size: (op.Size + 511) / 512 * 512, start: int32(t), end: -1, below: -1})
		case trace.Free:
			if k, ok := pos[op.ID]; ok {
				reqs[k].end, reqs[k].arena = int32(t), true
			}
		}
		t++
	}
	if len(reqs) == 0 {
		tb.Fatal("no step")
	}
	return reqs, t
}

// BenchmarkPackStep packs BERT's step as a step boundary does
// (packReqs: the sort by size, the greedy packing, the blocks below), by
// first fit and by best fit, and finds its blocks below alone.
func BenchmarkPackStep(b *testing.B) {
	reqs, ops := bertStepReqs(b)
	for _, fit := range []struct {
		name  string
		first bool
	}{{"first_fit", true}, {"best_fit", false}} {
		b.Run(fit.name, func(b *testing.B) {
			var fp uint64
			for b.Loop() {
				fp = packReqs(reqs, ops, fit.first)
			}
			b.ReportMetric(float64(fp), "footprint")
		})
	}
	b.Run("below", func(b *testing.B) {
		for b.Loop() {
			planBelow(reqs, ops)
		}
	})
}
