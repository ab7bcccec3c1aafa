package allocator

import (
	"testing"
	"time"

	"github.com/gpumem/gpumem/device"
)

// BenchmarkAllocFreeCachedNamedPool times the cached pair (alloc 1 MiB
// then free it, steady state) in a named pool beside the same pair in the
// default pool, in one run on one allocator: stream 0 allocates in the
// default pool, stream 1 is routed to the pool. Each iteration makes one
// pair of each; the metrics default-ns/pair and pool-ns/pair are their
// times, pool/default their ratio. Neither pair may allocate on the Go
// heap or call the device.
func BenchmarkAllocFreeCachedNamedPool(b *testing.B) {
	a, dev := newBench(b, Config{})
	side, err := dev.NewStream()
	if err != nil {
		b.Fatal(err)
	}
	p, err := a.NewPool("kv", PoolOptions{})
	if err != nil {
		b.Fatal(err)
	}
	if err := a.UsePool(p, side); err != nil {
		b.Fatal(err)
	}
	pair := func(s device.Stream) {
		q, err := a.Alloc(mib, s)
		if err != nil {
			b.Fatal(err)
		}
		if err := a.Free(q); err != nil {
			b.Fatal(err)
		}
	}
	pair(device.DefaultStream)
	pair(side)
	for _, s := range []device.Stream{device.DefaultStream, side} {
		if n := testing.AllocsPerRun(100, func() { pair(s) }); n != 0 {
			b.Fatalf("the cached pair on stream %d allocates %v times on the Go heap", s, n)
		}
	}
	before := dev.Counters().Mallocs
	var def, pool time.Duration
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		t0 := time.Now()
		pair(device.DefaultStream)
		t1 := time.Now()
		pair(side)
		def += t1.Sub(t0)
		pool += time.Since(t1)
	}
	b.StopTimer()
	if dev.Counters().Mallocs != before {
		b.Fatal("the cached path called the device")
	}
	n := float64(b.N)
	b.ReportMetric(float64(def.Nanoseconds())/n, "default-ns/pair")
	b.ReportMetric(float64(pool.Nanoseconds())/n, "pool-ns/pair")
	b.ReportMetric(float64(pool)/float64(def), "pool/default")
}

// BenchmarkAllocFreeCachedNamedPoolAlone is the cached pair in a named
// pool with nothing else allocating: the world's cost without the cuts
// that alternating with the default pool's fast path leaves (see
// BENCHMARKS.md).
func BenchmarkAllocFreeCachedNamedPoolAlone(b *testing.B) {
	a, dev := newBench(b, Config{})
	p, err := a.NewPool("kv", PoolOptions{})
	if err != nil {
		b.Fatal(err)
	}
	if err := a.UsePool(p, device.DefaultStream); err != nil {
		b.Fatal(err)
	}
	benchCached(b, a, dev, device.DefaultStream)
}
