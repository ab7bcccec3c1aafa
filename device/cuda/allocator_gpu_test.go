//go:build cuda

// allocator_gpu_test.go: the caching allocator on a real GPU: the same
// scenarios give the same statistics as on the simulated device, and a
// benchmark compares the cached path with raw cuMemAlloc+cuMemFree.

package cuda

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/gpumem/gpumem/allocator"
	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/device/sim"
)

// allocScenario drives an allocator over any device.
type allocScenario struct {
	name string
	cfg  allocator.Config
	run  func(tb testing.TB, a *allocator.Allocator, dev device.Device)
}

// comparedKeys are the statistics that depend only on the requests, not on
// the device's addresses, so they must be equal on both devices.
var comparedKeys = []string{
	"allocated_bytes.all.current", "allocated_bytes.all.peak",
	"allocated_bytes.small_pool.peak", "allocated_bytes.large_pool.peak",
	"reserved_bytes.all.current", "reserved_bytes.all.peak",
	"reserved_bytes.small_pool.peak", "reserved_bytes.large_pool.peak",
	"active_bytes.all.peak", "segment.all.peak", "segment.all.current",
	"allocation.all.allocated", "num_device_alloc", "num_device_free",
}

var allocScenarios = []allocScenario{
	{"small-and-large", allocator.Config{}, smallAndLarge},
	{"reuse-and-split", allocator.Config{}, func(tb testing.TB, a *allocator.Allocator, _ device.Device) {
		for round := 0; round < 3; round++ {
			var ps []device.Ptr
			for i := uint64(1); i <= 16; i++ {
				p, err := a.Alloc(i*(700<<10), device.DefaultStream)
				require.NoError(tb, err)
				ps = append(ps, p)
			}
			for i := 0; i < len(ps); i += 2 {
				require.NoError(tb, a.Free(ps[i]))
			}
			for i := 1; i < len(ps); i += 2 {
				require.NoError(tb, a.Free(ps[i]))
			}
		}
	}},
	{"streams-and-empty-cache", allocator.Config{}, func(tb testing.TB, a *allocator.Allocator, dev device.Device) {
		s, err := dev.NewStream()
		require.NoError(tb, err)
		p, err := a.Alloc(8<<20, device.DefaultStream)
		require.NoError(tb, err)
		require.NoError(tb, a.RecordStream(p, s))
		require.NoError(tb, a.Free(p))
		require.NoError(tb, dev.SynchronizeStream(s))
		q, err := a.Alloc(8<<20, s)
		require.NoError(tb, err)
		require.NoError(tb, a.Free(q))
		require.NoError(tb, a.EmptyCache())
	}},
}

// lowFragmentation is the low_fragmentation policy's configuration.
var lowFragmentation = allocator.Config{Policy: allocator.PolicyLowFragmentation}

func init() {
	allocScenarios = append(allocScenarios,
		allocScenario{"low-fragmentation", lowFragmentation, smallAndLarge},
		allocScenario{"low-fragmentation-lending", lowFragmentation, lendAcrossStreams})
}

// lendAcrossStreams frees blocks on one stream and asks for them on
// another (the low_fragmentation policy lends them, with stream waits),
// then empties the cache.
func lendAcrossStreams(tb testing.TB, a *allocator.Allocator, dev device.Device) {
	s1, err := dev.NewStream()
	require.NoError(tb, err)
	s2, err := dev.NewStream()
	require.NoError(tb, err)
	for round := 0; round < 3; round++ {
		var ps []device.Ptr
		for _, size := range []uint64{8 << 20, 3 << 20, 300 << 10} {
			p, err := a.Alloc(size, s1)
			require.NoError(tb, err)
			ps = append(ps, p)
		}
		for _, p := range ps {
			require.NoError(tb, a.Free(p))
		}
		for _, size := range []uint64{8 << 20, 3 << 20, 300 << 10} {
			p, err := a.Alloc(size, s2)
			require.NoError(tb, err)
			require.NoError(tb, a.Free(p))
		}
	}
	require.NoError(tb, dev.Synchronize())
	require.NoError(tb, a.CheckInvariants())
	require.NoError(tb, a.EmptyCache())
}

// smallAndLarge allocates requests of both pools, some of them splitting
// segments, and frees them all.
func smallAndLarge(tb testing.TB, a *allocator.Allocator, _ device.Device) {
	var ps []device.Ptr
	for _, size := range []uint64{1, 512, 4000, 1 << 20, (1 << 20) + 1, 3 << 20, 12 << 20, 50 << 20} {
		p, err := a.Alloc(size, device.DefaultStream)
		require.NoError(tb, err)
		ps = append(ps, p)
	}
	for _, p := range ps {
		require.NoError(tb, a.Free(p))
	}
}

// scenarioStats runs sc on a new allocator over dev and returns the
// compared statistics.
func scenarioStats(tb testing.TB, dev device.Device, sc allocScenario) map[string]int64 {
	a, err := allocator.New(dev, sc.cfg)
	require.NoError(tb, err)
	sc.run(tb, a, dev)
	st := a.Stats()
	out := make(map[string]int64, len(comparedKeys))
	for _, k := range comparedKeys {
		v, ok := st.Get(k)
		require.True(tb, ok, "unknown stats key %s", k)
		out[k] = v
	}
	require.NoError(tb, a.EmptyCache())
	return out
}

func TestGPUAllocatorScenarios(t *testing.T) { compareScenarios(t, openGPU(t)) }

// TestStubAllocatorScenarios runs the same comparison on the stub driver,
// which checks the allocator's use of this backend without a GPU.
func TestStubAllocatorScenarios(t *testing.T) { compareScenarios(t, openStub(t)) }

// compareScenarios runs every scenario on d and on a simulated device of
// the same capacity and requires equal statistics.
func compareScenarios(t *testing.T, d *Device) {
	for _, sc := range allocScenarios {
		t.Run(sc.name, func(t *testing.T) {
			simDev, err := sim.New(sim.Config{Capacity: d.TotalMemory()})
			require.NoError(t, err)
			want := scenarioStats(t, simDev, sc)
			got := scenarioStats(t, d, sc)
			require.Equal(t, want, got, "statistics on the GPU differ from the simulated device's")
			t.Logf("%s: %v", sc.name, got)
		})
	}
}

// BenchmarkGPUAllocatorCached measures the allocator's cached path on a
// real device: after the first round, every Alloc/Free of 1 MiB is served
// from the cache without calling the driver. Compare with
// BenchmarkGPUDeviceMallocFree.
func BenchmarkGPUAllocatorCached(b *testing.B) {
	d := openGPU(b)
	a, err := allocator.New(d, allocator.Config{})
	if err != nil {
		b.Fatal(err)
	}
	defer a.EmptyCache()
	round := func() {
		p, err := a.Alloc(1<<20, device.DefaultStream)
		if err != nil {
			b.Fatal(err)
		}
		if err := a.Free(p); err != nil {
			b.Fatal(err)
		}
	}
	round() // the first round fills the cache
	before, _ := a.Stats().Get("num_device_alloc")
	b.ReportAllocs()
	for b.Loop() {
		round()
	}
	after, _ := a.Stats().Get("num_device_alloc")
	b.ReportMetric(float64(after-before), "device-allocs")
}
