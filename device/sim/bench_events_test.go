package sim_test

import (
	"testing"

	"github.com/gpumem/gpumem/device/internal/devicetest"
	"github.com/gpumem/gpumem/internal/simtest"
)

// BenchmarkEventRecordQuery is the allocator's cross-stream free path: an
// event recorded, queried and released, on a device whose calls cost no
// simulated time (device/cuda's BenchmarkGPUEventRecordQuery runs the
// same on a GPU).
func BenchmarkEventRecordQuery(b *testing.B) {
	devicetest.BenchEventRecordQuery(b, simtest.New(b, simtest.NoCosts()))
}
