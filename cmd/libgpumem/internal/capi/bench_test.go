package capi

import (
	"testing"

	"github.com/gpumem/gpumem/allocator"
	"github.com/gpumem/gpumem/device/sim"
)

// BenchmarkMallocFree is the cached 1 MiB malloc+free pair through the Lib
// (stream lookup, live table, allocator), the Go half of what a C call of
// gpumem_malloc and gpumem_free costs. The pair through the allocator
// alone is the allocator package's BenchmarkAllocFreeCached; the pair
// through C is measured by scripts/callgrind.sh libgpumem.
func BenchmarkMallocFree(b *testing.B) {
	for _, bc := range []struct {
		name   string
		stream uintptr
	}{{"default-stream", 0}, {"adopted-stream", 0x5000}} {
		b.Run(bc.name, func(b *testing.B) {
			l := New(func(int) (Device, error) { return sim.New(sim.Config{}) }, allocator.Config{}, nil)
			p, err := l.Malloc(mib, 0, bc.stream)
			if err != nil {
				b.Fatal(err)
			}
			if err := l.Free(p, mib, 0, bc.stream); err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				p, err := l.Malloc(mib, 0, bc.stream)
				if err != nil {
					b.Fatal(err)
				}
				if err := l.Free(p, mib, 0, bc.stream); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
