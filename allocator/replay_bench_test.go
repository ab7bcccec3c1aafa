package allocator_test

import (
	"testing"

	"github.com/gpumem/gpumem/allocator"
	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/internal/simtest"
	"github.com/gpumem/gpumem/trace"
)

// loadOps reads a trace of the trace package's test data into memory, so
// that the replay benchmarks time the allocator, not the parser.
func loadOps(b *testing.B, path string) []trace.Op {
	b.Helper()
	ops, err := trace.ReadFile(path)
	if err != nil {
		b.Fatalf("trace not available: %v", err)
	}
	return ops
}

// replayOps applies ops (allocations and frees on stream 0, IDs below
// len(ids)) to a; it is the core of replay.Run without its checks.
func replayOps(b *testing.B, a *allocator.Allocator, ops []trace.Op, ids []device.Ptr) {
	for i := range ops {
		op := &ops[i]
		switch op.Kind {
		case trace.Alloc:
			p, err := a.Alloc(op.Size, device.DefaultStream)
			if err != nil {
				b.Fatal(err)
			}
			ids[op.ID] = p
		case trace.Free:
			if err := a.Free(ids[op.ID]); err != nil {
				b.Fatal(err)
			}
		}
	}
}

func benchmarkReplay(b *testing.B, path string) {
	ops := loadOps(b, path)
	var maxID uint64
	for _, op := range ops {
		maxID = max(maxID, op.ID)
	}
	ids := make([]device.Ptr, maxID+1)
	var last *allocator.Allocator
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		b.StopTimer()
		dev := simtest.New(b)
		a, err := allocator.New(dev, allocator.Config{})
		if err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		replayOps(b, a, ops, ids)
		last = a
	}
	b.StopTimer()
	st := last.Stats()
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(ops)), "ns/trace-op")
	b.ReportMetric(float64(st.ReservedBytes[0].Peak)/float64(st.RequestedBytes[0].Peak), "reserved/requested")
	b.ReportMetric(float64(st.NumDeviceAlloc), "device-mallocs")
}

// BenchmarkReplayRandomMixed replays random_mixed (202,032 ops over both
// pools, about 2,000 live blocks).
func BenchmarkReplayRandomMixed(b *testing.B) {
	benchmarkReplay(b, "../trace/replay/testdata/pytorch/random_mixed.trace.gz")
}

// BenchmarkReplayTransformerStep replays one real forward/backward step of
// a 12-layer transformer (3,900 ops).
func BenchmarkReplayTransformerStep(b *testing.B) {
	benchmarkReplay(b, "../trace/replay/testdata/pytorch/pub_cs336_MAGMA27_lm_fwdbwd.trace.gz")
}
