package replay

import (
	"testing"

	"github.com/gpumem/gpumem/allocator"
	"github.com/gpumem/gpumem/device/sim"
	"github.com/gpumem/gpumem/trace"
)

// BenchmarkReplay runs Run (what `gpumem replay` does) on random_mixed
// and reports the replay's own ns per op, parsing excluded.
func BenchmarkReplay(b *testing.B) {
	var ns float64
	for b.Loop() {
		r, err := trace.Open("testdata/pytorch/random_mixed.trace.gz")
		if err != nil {
			b.Fatal(err)
		}
		dev, _ := sim.New(sim.Config{})
		a, _ := allocator.New(dev, allocator.Config{})
		res, err := Run(r, a, dev, Options{})
		if err != nil {
			b.Fatal(err)
		}
		r.Close()
		ns += res.NsPerOp
	}
	b.ReportMetric(ns/float64(b.N), "replay-ns/op")
}
