package devicetest

import (
	"testing"

	"github.com/gpumem/gpumem/device"
)

// BenchEventRecordQuery measures, on d, the allocator's cross-stream free
// path: an event recorded on a stream of d's own, queried and released.
// The simulated device's and the CUDA device's benchmarks both run it.
func BenchEventRecordQuery(b *testing.B, d device.Device) {
	s, err := d.NewStream()
	if err != nil {
		b.Fatal(err)
	}
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
