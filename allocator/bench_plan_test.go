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

// TestPackStepIsValid packs BERT's step by each fit: the packing is
// valid (checkPacking) and meets the step's peak; and checkPacking
// catches two requests in use at once that share a byte, one past the
// footprint, and one in use for no operation.
func TestPackStepIsValid(t *testing.T) {
	reqs, _ := bertStepReqs(t)
	for _, first := range []bool{true, false} {
		fp, bySize := packReqs(reqs, first)
		if !bySize {
			t.Errorf("first fit %v: BERT's step packed in time order", first)
		}
		if err := checkPacking(reqs, fp); err != nil {
			t.Fatalf("first fit %v: %v", first, err)
		}
		if fp != 1_313_811_968 {
			t.Errorf("first fit %v: footprint %d, want the step's peak", first, fp)
		}
	}
	bad := []planReq{
		{size: 1024, arena: true, start: 0, end: 4, off: 0},
		{size: 512, arena: true, start: 3, end: 5, off: 512},
	}
	if checkPacking(bad, 1024) == nil {
		t.Error("two requests in use at once that share bytes pass")
	}
	bad[1].start = 4 // in use after the first: it may share its bytes
	if err := checkPacking(bad, 1024); err != nil {
		t.Error(err)
	}
	if checkPacking(bad, 512) == nil {
		t.Error("a request past the footprint passes")
	}
	bad[1].end = 4 // in use for no operation
	if checkPacking(bad, 1024) == nil {
		t.Error("a request in use for no operation passes")
	}
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
				fp, _ = packReqs(reqs, fit.first)
			}
			b.ReportMetric(float64(fp), "footprint")
		})
	}
	b.Run("below", func(b *testing.B) {
		byOff := arenaByOffset(reqs)
		for b.Loop() {
			planBelow(reqs, ops, byOff)
		}
	})
}
