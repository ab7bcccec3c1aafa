// Benchmarks of the device's hot calls and of its worst cases: first fit
// over many holes that do not fit, virtual memory with many reservations,
// and contention.

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

// holey returns a device whose memory region has holes one-page holes below
// its highest allocation: the worst case for a first-fit search that scans
// holes, since a two-page request fits none of them.
func holey(b *testing.B, holes int) *Device {
	b.Helper()
	const page = 64 << 10
	d, err := New(Config{Capacity: uint64(4*holes+16) * page, PageSize: page, Costs: NoCosts()})
	if err != nil {
		b.Fatal(err)
	}
	ps := make([]device.Ptr, 2*holes)
	for i := range ps {
		if ps[i], err = d.Malloc(page); err != nil {
			b.Fatal(err)
		}
	}
	for i := 0; i < len(ps); i += 2 {
		if err := d.Free(ps[i]); err != nil {
			b.Fatal(err)
		}
	}
	return d
}

// BenchmarkMallocFreeNoHoleFits is one Malloc and one Free of two pages
// on a device with many one-page holes, none of which fits: first fit must
// find that out without visiting every hole.
func BenchmarkMallocFreeNoHoleFits(b *testing.B) {
	for _, holes := range []int{10, 1000, 100000} {
		b.Run(fmt.Sprintf("holes=%d", holes), func(b *testing.B) {
			d := holey(b, holes)
			want := d.MemoryBase() + device.Ptr(2*holes)*(64<<10)
			mallocFreeAt(b, d, 2<<16, want, "above every hole")
			b.ReportMetric(float64(holes), "holes")
		})
	}
}

// BenchmarkMallocFreeLastHoleFits: many small holes and one large hole
// at the top of the list, which is the only one that fits.
func BenchmarkMallocFreeLastHoleFits(b *testing.B) {
	for _, holes := range []int{10, 1000, 100000} {
		b.Run(fmt.Sprintf("holes=%d", holes), func(b *testing.B) {
			const page = 64 << 10
			d := holey(b, holes)
			big, err := d.Malloc(4 * page)
			if err != nil {
				b.Fatal(err)
			}
			if _, err := d.Malloc(page); err != nil { // keep big from merging with the top
				b.Fatal(err)
			}
			if err := d.Free(big); err != nil {
				b.Fatal(err)
			}
			mallocFreeAt(b, d, 3*page, big, "the large hole")
		})
	}
}

// BenchmarkMapUnmapManyReservations maps and unmaps one page in the middle
// of many live reservations, as expandable segments do when they grow and
// shrink.
func BenchmarkMapUnmapManyReservations(b *testing.B) {
	for _, n := range []int{1, 100, 10000} {
		b.Run(fmt.Sprintf("reservations=%d", n), func(b *testing.B) {
			d, err := New(Config{Costs: NoCosts()})
			if err != nil {
				b.Fatal(err)
			}
			g := d.Granularity()
			var mid device.Ptr
			for i := range n {
				r, err := d.Reserve(16 * g)
				if err != nil {
					b.Fatal(err)
				}
				if err := d.Map(r, 4*g); err != nil { // some pages mapped already
					b.Fatal(err)
				}
				if i == n/2 {
					mid = r
				}
			}
			p := mid + device.Ptr(8*g)
			b.ReportAllocs()
			for b.Loop() {
				if err := d.Map(p, g); err != nil {
					b.Fatal(err)
				}
				if err := d.Unmap(p, g); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkMallocFreeParallel is Malloc and Free from every P at once: the
// cost of the device's one mutex under contention.
func BenchmarkMallocFreeParallel(b *testing.B) {
	d, err := New(Config{Costs: NoCosts()})
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			p, err := d.Malloc(3 << 20)
			if err != nil {
				b.Error(err)
				return
			}
			if err := d.Free(p); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// BenchmarkBusyStreamEvents records events on a busy stream and finishes
// them in batches, as a replay with a lagging stream does.
func BenchmarkBusyStreamEvents(b *testing.B) {
	d, err := New(Config{Costs: NoCosts()})
	if err != nil {
		b.Fatal(err)
	}
	s, err := d.NewStream()
	if err != nil {
		b.Fatal(err)
	}
	if err := d.SetStreamBusy(s, true); err != nil {
		b.Fatal(err)
	}
	var batch [16]device.Event
	b.ReportAllocs()
	for b.Loop() {
		for i := range batch {
			if batch[i], err = d.RecordEvent(s); err != nil {
				b.Fatal(err)
			}
		}
		if err := d.SynchronizeEvent(batch[7]); err != nil {
			b.Fatal(err)
		}
		if err := d.CompleteStream(s); err != nil {
			b.Fatal(err)
		}
		for _, e := range batch {
			if done, err := d.EventDone(e); err != nil || !done {
				b.Fatal("event not done after CompleteStream", err)
			}
			if err := d.ReleaseEvent(e); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.ReportMetric(float64(len(batch)), "events/op")
}

// mallocFreeAt times a Malloc of size bytes and its Free, failing the
// benchmark unless each Malloc lands at want (where, in words).
func mallocFreeAt(b *testing.B, d *Device, size uint64, want device.Ptr, where string) {
	b.Helper()
	b.ReportAllocs()
	for b.Loop() {
		p, err := d.Malloc(size)
		if err != nil {
			b.Fatal(err)
		}
		if p != want {
			b.Fatalf("malloc at %v, want %v (%s)", p, want, where)
		}
		if err := d.Free(p); err != nil {
			b.Fatal(err)
		}
	}
}
