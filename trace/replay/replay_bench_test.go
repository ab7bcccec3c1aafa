package replay

import (
	"bytes"
	"compress/gzip"
	"io"
	"os"
	"runtime"
	"testing"

	"github.com/gpumem/gpumem/allocator"
	"github.com/gpumem/gpumem/internal/simtest"
	"github.com/gpumem/gpumem/trace"
)

// runFresh replays r on a new allocator, PyTorch's configuration, over a
// new simulated device. The allocator is built here, not by gpumemtest,
// whose cleanup would keep every iteration's allocator to the end.
func runFresh(b *testing.B, r trace.OpReader) *Result {
	b.Helper()
	dev := simtest.New(b)
	a, err := allocator.New(dev, allocator.Config{})
	if err != nil {
		b.Fatal(err)
	}
	res, err := Run(r, a, dev, Options{})
	if err != nil {
		b.Fatal(err)
	}
	return res
}

// BenchmarkReplay runs Run (what `gpumem replay` does) on random_mixed
// and reports the replay's own ns per op, parsing excluded.
func BenchmarkReplay(b *testing.B) {
	var ns float64
	for b.Loop() {
		r, err := trace.Open("testdata/pytorch/random_mixed.trace.gz")
		if err != nil {
			b.Fatal(err)
		}
		res := runFresh(b, r)
		r.Close()
		ns += res.NsPerOp
	}
	b.ReportMetric(ns/float64(b.N), "replay-ns/op")
}

// BenchmarkReplayPlain runs Run on random_mixed, not compressed, read from
// memory: parsing, validation and the allocator together, as `gpumem
// replay` of a plain file. It reports the time and the Go heap
// allocations per op (the reader allocates nothing per op; what remains is
// the allocator's growth and the replay's set-up).
func BenchmarkReplayPlain(b *testing.B) {
	f, err := os.Open("testdata/pytorch/random_mixed.trace.gz")
	if err != nil {
		b.Fatal(err)
	}
	zr, err := gzip.NewReader(f)
	if err != nil {
		b.Fatal(err)
	}
	data, err := io.ReadAll(zr)
	f.Close()
	if err != nil {
		b.Fatal(err)
	}
	var ops int64
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for b.Loop() {
		r, err := trace.NewReader(bytes.NewReader(data))
		if err != nil {
			b.Fatal(err)
		}
		ops += runFresh(b, r).Ops
	}
	runtime.ReadMemStats(&after)
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(ops), "ns/trace-op")
	b.ReportMetric(float64(after.Mallocs-before.Mallocs)/float64(ops), "allocs/trace-op")
}
