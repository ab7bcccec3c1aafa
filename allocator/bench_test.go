package allocator

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/gpumem/gpumem/allocator/internal/freeindex"
	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/device/sim"
	"github.com/gpumem/gpumem/internal/simtest"
)

func newBench(b *testing.B, cfg Config) (*Allocator, *sim.Device) {
	b.Helper()
	a, dev := newOn(b, cfg)
	return a, dev
}

// BenchmarkAllocFreeCached is the cached path: alloc 1 MiB then free it on
// one stream, in steady state. It must not allocate on the Go heap or call
// the device.
func BenchmarkAllocFreeCached(b *testing.B) {
	a, dev := newBench(b, Config{})
	benchCached(b, a, dev, device.DefaultStream)
}

// BenchmarkAllocFreeCachedPhases is the cached path while blocks are
// counted by phase (a second phase is named): each block's phase counts
// change with the others, and nothing more may allocate.
func BenchmarkAllocFreeCachedPhases(b *testing.B) {
	a, dev := newBench(b, Config{})
	a.SetPhase("forward")
	benchCached(b, a, dev, device.DefaultStream)
}

// benchCached times the cached pair on s: 1 MiB allocated then freed,
// after a first pair that leaves the block cached. It fails if the timed
// pairs call the device.
func benchCached(b *testing.B, a *Allocator, dev *sim.Device, s device.Stream) {
	p, _ := a.Alloc(mib, s)
	_ = a.Free(p)
	before := dev.Counters().Mallocs
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		p, err := a.Alloc(mib, s)
		if err != nil {
			b.Fatal(err)
		}
		if err := a.Free(p); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	if dev.Counters().Mallocs != before {
		b.Fatal("the cached path called the device")
	}
}

// BenchmarkAllocFreeMixed allocates and frees random sizes across both
// pools with about 1000 live blocks, so that splits and merges happen.
func BenchmarkAllocFreeMixed(b *testing.B) {
	a, dev := newBench(b, Config{})
	rng := rand.New(rand.NewPCG(1, 2))
	sizes := make([]uint64, 4096)
	for i := range sizes {
		switch rng.IntN(4) {
		case 0:
			sizes[i] = uint64(rng.IntN(4096)) + 1
		case 1:
			sizes[i] = uint64(rng.IntN(mib)) + 1
		case 2:
			sizes[i] = uint64(rng.IntN(10*mib)) + mib
		default:
			sizes[i] = uint64(rng.IntN(64*mib)) + 10*mib
		}
	}
	live := make([]device.Ptr, 1000)
	for i := range live {
		live[i], _ = a.Alloc(sizes[i%len(sizes)], 0)
	}
	mallocs := dev.Counters().Mallocs
	b.ReportAllocs()
	b.ResetTimer()
	i := 0
	for b.Loop() {
		j := i % len(live)
		if err := a.Free(live[j]); err != nil {
			b.Fatal(err)
		}
		p, err := a.Alloc(sizes[i%len(sizes)], 0)
		if err != nil {
			b.Fatal(err)
		}
		live[j] = p
		i++
	}
	b.StopTimer()
	b.ReportMetric(float64(dev.Counters().Mallocs-mallocs)/float64(b.N), "device-mallocs/op")
}

// BenchmarkTwoStreamsInterleaved alternates Alloc/Free pairs between two
// streams in one goroutine.
func BenchmarkTwoStreamsInterleaved(b *testing.B) {
	a, dev := newBench(b, Config{})
	s1, _ := dev.NewStream()
	s2, _ := dev.NewStream()
	for _, s := range []device.Stream{s1, s2} {
		p, _ := a.Alloc(mib, s)
		_ = a.Free(p)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		p1, _ := a.Alloc(mib, s1)
		p2, _ := a.Alloc(mib, s2)
		_ = a.Free(p1)
		_ = a.Free(p2)
	}
}

// BenchmarkParallelStreams runs one goroutine per stream against one
// allocator; compare its ns/op with BenchmarkAllocFreeCached for the
// scaling of one mutex per device.
func BenchmarkParallelStreams(b *testing.B) {
	a, dev := newBench(b, Config{})
	var mu sync.Mutex
	b.ReportAllocs()
	b.SetParallelism(1)
	b.RunParallel(func(pb *testing.PB) {
		mu.Lock()
		s, _ := dev.NewStream()
		mu.Unlock()
		for pb.Next() {
			p, err := a.Alloc(mib, s)
			if err != nil {
				b.Error(err)
				return
			}
			_ = a.Free(p)
		}
	})
}

// BenchmarkStreamsScaling runs g goroutines against one allocator, each
// allocating and freeing 1 MiB on a stream of its own (the first on the
// default stream), for g = 1, 2 and 4, and reports the pairs per
// microsecond of wall time over all goroutines, and the CPU time per pair
// (which rises when goroutines contend; the wall time also depends on the
// cores the machine gives them). b.N pairs are shared among the goroutines.
func BenchmarkStreamsScaling(b *testing.B) {
	for _, g := range []int{1, 2, 4} {
		b.Run(fmt.Sprintf("goroutines=%d", g), func(b *testing.B) {
			a, dev := newBench(b, Config{})
			streams := simtest.Streams(b, dev, g-1)
			for _, s := range streams { // warm: each stream has its segment
				p, _ := a.Alloc(mib, s)
				_ = a.Free(p)
			}
			per := max(b.N/g, 1)
			var wg sync.WaitGroup
			b.ResetTimer()
			cpu, start := cpuTime(), time.Now()
			for _, s := range streams {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for range per {
						p, err := a.Alloc(mib, s)
						if err != nil {
							b.Error(err)
							return
						}
						if err := a.Free(p); err != nil {
							b.Error(err)
							return
						}
					}
				}()
			}
			wg.Wait()
			wall, cpu := time.Since(start), cpuTime()-cpu
			b.StopTimer()
			pairs := float64(per * g)
			b.ReportMetric(pairs/float64(wall.Microseconds()+1), "pairs/µs")
			if cpu > 0 {
				b.ReportMetric(float64(cpu.Nanoseconds())/pairs, "cpu-ns/pair")
			}
		})
	}
}

// allocInBackground runs alloc/free pairs in another goroutine until the
// returned stop function is called.
func allocInBackground(a *Allocator) (stop func()) {
	return inBackground(func() {
		p, _ := a.Alloc(mib, 0)
		_ = a.Free(p)
	})
}

// BenchmarkStatsRead measures Stats() while another goroutine allocates.
func BenchmarkStatsRead(b *testing.B) {
	a, _ := newBench(b, Config{})
	stop := allocInBackground(a)
	defer stop()
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		st := a.Stats()
		if st.Allocated() < 0 {
			b.Fatal("negative")
		}
	}
}

// BenchmarkSnapshotRead measures Snapshot() of about 200 segments while
// another goroutine allocates.
func BenchmarkSnapshotRead(b *testing.B) {
	a, _ := newBench(b, Config{})
	for i := range 200 {
		_, _ = a.Alloc(uint64(i+1)*mib/2, 0)
	}
	stop := allocInBackground(a)
	defer stop()
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		_ = a.Snapshot()
	}
}

// BenchmarkParallelDevices runs one goroutine per device, each with its
// own allocator (no shared lock); compare with BenchmarkParallelStreams
// and BenchmarkAllocFreeCached.
func BenchmarkParallelDevices(b *testing.B) {
	var next atomic.Int32
	m, err := NewManager(simtest.Opener(), Config{})
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.SetParallelism(1)
	b.RunParallel(func(pb *testing.PB) {
		o := int(next.Add(1)) - 1
		a, err := m.Allocator(o)
		if err != nil {
			b.Error(err)
			return
		}
		for pb.Next() {
			p, err := a.Alloc(mib, 0)
			if err != nil {
				b.Error(err)
				return
			}
			_ = a.Free(p)
		}
	})
}

// BenchmarkMemoryPerBlock reports the Go heap bytes the allocator spends
// per block it tracks, with 100,000 blocks, half of them cached (free, in
// the index) and half allocated.
func BenchmarkMemoryPerBlock(b *testing.B) {
	const n = 100_000
	var perBlock float64
	for b.Loop() {
		dev := simtest.New(b)
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		a, _ := New(dev, Config{})
		ps := make([]device.Ptr, n)
		for i := range ps {
			ps[i], _ = a.Alloc(512, 0)
		}
		for i := 0; i < n; i += 2 {
			_ = a.Free(ps[i])
		}
		ps = nil
		runtime.GC()
		runtime.ReadMemStats(&after)
		perBlock = float64(after.HeapAlloc-before.HeapAlloc) / n
		runtime.KeepAlive(a)
	}
	b.ReportMetric(perBlock, "heap-bytes/block")
	b.ReportMetric(float64(unsafe.Sizeof(freeindex.Block{})), "block-struct-bytes")
}
