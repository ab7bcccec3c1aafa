// Benchmarks of the device's hot calls.

package sim

import (
	"fmt"
	"testing"

	"github.com/gpumem/gpumem/device"
)

// BenchmarkMallocFree is one Malloc and one Free on an empty device.
func BenchmarkMallocFree(b *testing.B) {
	d := newDev(b, Config{})
	b.ReportAllocs()
	for b.Loop() {
		p, err := d.Malloc(3 * MiB)
		if err != nil {
			b.Fatal(err)
		}
		if err := d.Free(p); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkMallocFreeManyLive keeps many allocations of mixed sizes live
// (so the address space is full of holes) and replaces a pseudo-randomly
// chosen one per iteration, as a pass-through replay does.
func BenchmarkMallocFreeManyLive(b *testing.B) {
	for _, live := range []int{100, 1000, 10000} {
		b.Run(fmt.Sprintf("live=%d", live), func(b *testing.B) {
			d := newDev(b, Config{Capacity: 8 << 40})
			x := uint64(1)
			size := func() uint64 {
				x ^= x << 13
				x ^= x >> 7
				x ^= x << 17
				return 1 + x%(64*MiB)
			}
			ps := make([]device.Ptr, live)
			for i := range ps {
				p, err := d.Malloc(size())
				if err != nil {
					b.Fatal(err)
				}
				ps[i] = p
			}
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				i := int(x % uint64(live))
				if err := d.Free(ps[i]); err != nil {
					b.Fatal(err)
				}
				p, err := d.Malloc(size())
				if err != nil {
					b.Fatal(err)
				}
				ps[i] = p
			}
			d.mu.Lock()
			holes := d.mem.count
			d.mu.Unlock()
			b.ReportMetric(float64(holes), "free-ranges")
		})
	}
}

// BenchmarkEventRecordQuery is the allocator's cross-stream free path: an
// event recorded, queried and released.
func BenchmarkEventRecordQuery(b *testing.B) {
	d := newDev(b, Config{})
	s, _ := d.NewStream()
	b.ReportAllocs()
	for b.Loop() {
		e, err := d.RecordEvent(s)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := d.EventDone(e); err != nil {
			b.Fatal(err)
		}
		if err := d.ReleaseEvent(e); err != nil {
			b.Fatal(err)
		}
	}
}
