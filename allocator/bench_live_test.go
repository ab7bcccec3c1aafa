package allocator

import (
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/device/sim"
	"github.com/gpumem/gpumem/internal/simtest"
)

// logUniformSizes returns n sizes drawn log-uniformly between lo and hi
// bytes (each power of two between them equally likely) from rng.
func logUniformSizes(rng *rand.Rand, n int, lo, hi float64) []uint64 {
	sizes := make([]uint64, n)
	span := math.Log2(hi / lo)
	for i := range sizes {
		sizes[i] = uint64(lo * math.Exp2(rng.Float64()*span))
	}
	return sizes
}

var liveHugePages = flag.Bool("live.hugepages", false, "BenchmarkLiveBlocks: advise the heap to use transparent huge pages first (Linux)")

// BenchmarkLiveBlocks is the cost of one free and one allocation as the
// number of live blocks grows: with live blocks allocated (sizes
// log-uniform between 512 B and 4 MiB, one stream), each op frees a
// random live block and allocates one of a log-uniform size in its
// place. The sizes and the choices come from a fixed seed, so every run
// makes the same requests. It reports ns/op (a free and an alloc); the
// ratio of live=1M to live=1k is what the caches and TLB cost as the
// allocator's structures outgrow them. With -live.hugepages the process's
// heap is first advised to use transparent huge pages (Linux), which
// takes the TLB's part out where the system gives huge pages only to
// memory that asks.
func BenchmarkLiveBlocks(b *testing.B) {
	for _, c := range []struct {
		name string
		n    int
	}{{"1k", 1_000}, {"10k", 10_000}, {"100k", 100_000}, {"1M", 1_000_000}} {
		b.Run("live="+c.name, func(b *testing.B) {
			if *liveHugePages { // before the blocks are made
				if _, err := adviseHugePages(1 << 30); err != nil {
					b.Fatal(err)
				}
			}
			a, _ := newOn(b, Config{}, simtest.Capacity(sim.MaxCapacity))
			rng := rand.New(rand.NewPCG(27, uint64(c.n)))
			sizes := logUniformSizes(rng, 1<<16, 512, 4<<20)
			live := make([]device.Ptr, c.n)
			for i := range live {
				p, err := a.Alloc(sizes[i&(len(sizes)-1)], 0)
				if err != nil {
					b.Fatal(err)
				}
				live[i] = p
			}
			b.ReportAllocs()
			b.ResetTimer()
			i := 0
			for b.Loop() {
				j := rng.IntN(len(live))
				if err := a.Free(live[j]); err != nil {
					b.Fatal(err)
				}
				p, err := a.Alloc(sizes[i&(len(sizes)-1)], 0)
				if err != nil {
					b.Fatal(err)
				}
				live[j] = p
				i++
			}
			b.StopTimer()
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N), "ns/op")
		})
	}
}

// streamsOps is the number of ops of the multi-stream trace that
// BenchmarkReplayStreams replays (scripts/callgrind.sh divides by it).
const streamsOps = 20_000

// streamsTrace returns the multi-stream trace of BenchmarkReplayStreams:
// the shape of an offloading inference job on 10 streams, where every
// stream allocates and frees and most requests are hundreds of MiB to
// 1 GiB (layers' weights and activations moved in and out), so that
// segments are large and made and released as the job runs. Each op is
// an alloc (size > 0) or a free (size 0) of slot id on stream s; at most
// 4 blocks of a stream are live at once (at most 40 GiB of the device's
// 80 GiB). The seed is fixed.
func streamsTrace() []streamsOp {
	const streams, perStream = 10, 4
	rng := rand.New(rand.NewPCG(27, 10))
	sizes := logUniformSizes(rng, streamsOps, 1<<20, 1<<30)
	live := make([][]int, streams)
	ops := make([]streamsOp, 0, streamsOps)
	next := 0
	for len(ops) < streamsOps {
		s := rng.IntN(streams)
		if n := len(live[s]); n == perStream || n > 0 && rng.IntN(2) == 0 {
			k := rng.IntN(n)
			ops = append(ops, streamsOp{stream: s, id: live[s][k]})
			live[s][k] = live[s][n-1]
			live[s] = live[s][:n-1]
			continue
		}
		ops = append(ops, streamsOp{stream: s, id: next, size: sizes[len(ops)]})
		live[s] = append(live[s], next)
		next++
	}
	return ops
}

type streamsOp struct {
	stream, id int
	size       uint64 // 0: free
}

// BenchmarkReplayStreams replays streamsTrace (10 streams, GiB segments)
// on a fresh allocator each iteration, the first segments' device mallocs
// included, and reports ns per trace op and the device mallocs of one
// replay (the segments made as it runs).
func BenchmarkReplayStreams(b *testing.B) {
	ops := streamsTrace()
	ids := make([]device.Ptr, len(ops))
	var streams []device.Stream
	var mallocs int64
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		b.StopTimer()
		a, dev := newOn(b, Config{}, simtest.Capacity(80<<30))
		streams = append(streams[:0], device.DefaultStream)
		for len(streams) < 10 {
			s, err := dev.NewStream()
			if err != nil {
				b.Fatal(err)
			}
			streams = append(streams, s)
		}
		b.StartTimer()
		for _, op := range ops {
			if op.size == 0 {
				if err := a.Free(ids[op.id]); err != nil {
					b.Fatal(err)
				}
				continue
			}
			p, err := a.Alloc(op.size, streams[op.stream])
			if err != nil {
				b.Fatal(fmt.Errorf("op alloc %d on stream %d: %w", op.size, op.stream, err))
			}
			ids[op.id] = p
		}
		mallocs = dev.Counters().Mallocs
	}
	b.StopTimer()
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(ops)), "ns/trace-op")
	b.ReportMetric(float64(mallocs), "device-mallocs")
}
