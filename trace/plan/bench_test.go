package plan

import (
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/gpumem/gpumem/allocator"
	"github.com/gpumem/gpumem/trace/internal/tracetest"
)

// BenchmarkFitRandomMixed fits the full random_mixed trace (202,032 ops)
// and reports the replays a fit takes and the time of each.
func BenchmarkFitRandomMixed(b *testing.B) {
	ops := tracetest.ReadFile(b, "../replay/testdata/pytorch/random_mixed.trace.gz")
	for _, conf := range []string{"", "expandable_segments:True"} {
		cfg, err := allocator.ParseConf(conf)
		if err != nil {
			b.Fatal(err)
		}
		b.Run(label(conf), func(b *testing.B) {
			replays := 0
			for b.Loop() {
				r, err := Fit(ops, FitOptions{Config: cfg})
				if err != nil {
					b.Fatal(err)
				}
				replays += len(r.Trials)
			}
			b.ReportMetric(float64(replays)/float64(b.N), "replays/op")
			b.ReportMetric(float64(b.Elapsed().Milliseconds())/float64(replays), "ms/replay")
		})
	}
}

// BenchmarkTuneJobs runs the default sweep over random_mixed's first 2,000
// ops with 1, 2, 4, ... configurations at once, up to GOMAXPROCS.
func BenchmarkTuneJobs(b *testing.B) {
	ops := tracetest.ReadFile(b, smallTrace)
	var serial time.Duration
	for jobs := 1; jobs <= runtime.GOMAXPROCS(0); jobs *= 2 {
		b.Run(fmt.Sprintf("jobs=%d", jobs), func(b *testing.B) {
			for b.Loop() {
				if _, err := Tune(ops, TuneOptions{Jobs: jobs}); err != nil {
					b.Fatal(err)
				}
			}
			per := b.Elapsed() / time.Duration(b.N)
			if jobs == 1 {
				serial = per
			}
			if serial > 0 {
				b.ReportMetric(float64(serial)/float64(per), "speedup")
			}
		})
	}
}
