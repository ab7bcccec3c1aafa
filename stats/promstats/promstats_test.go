// This file tests the collector through a Prometheus registry: the
// metrics of one allocator and of a Manager's devices, read back with
// Gather, and the errors that replace panics.

package promstats_test

import (
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpumem/gpumem/allocator"
	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/device/sim"
	"github.com/gpumem/gpumem/gpumemtest"
	"github.com/gpumem/gpumem/internal/simtest"
	"github.com/gpumem/gpumem/stats/promstats"
)

const mib = 1 << 20

var (
	_ promstats.Allocator = (*allocator.Allocator)(nil)
	_ promstats.Manager   = (*allocator.Manager)(nil)
)

// metricNames are every metric the collector exposes.
var metricNames = []string{
	"gpumem_allocated_bytes",
	"gpumem_allocated_peak_bytes",
	"gpumem_reserved_bytes",
	"gpumem_reserved_peak_bytes",
	"gpumem_active_bytes",
	"gpumem_inactive_split_bytes",
	"gpumem_allocated_blocks",
	"gpumem_segments",
	"gpumem_allocations_total",
	"gpumem_ooms_total",
	"gpumem_alloc_retries_total",
	"gpumem_device_allocs_total",
	"gpumem_device_frees_total",
}

func newAllocator(t *testing.T, cfg sim.Config) *allocator.Allocator {
	t.Helper()
	return gpumemtest.New(t, gpumemtest.WithDevice(cfg), gpumemtest.AllowLeaks())
}

// A retry, an out-of-memory error and blocks in both pools, read back
// through a registry.
func TestCollector(t *testing.T) {
	a := newAllocator(t, sim.Config{Capacity: 64 * mib})
	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(promstats.NewCollector(a)))

	n, err := testutil.GatherAndCount(reg)
	require.NoError(t, err)
	assert.Equal(t, 9*3+4, n, "every metric, at zero, before any allocation")

	p, err := a.Alloc(40*mib, device.DefaultStream)
	require.NoError(t, err)
	require.NoError(t, a.Free(p))                     // cached
	big, err := a.Alloc(50*mib, device.DefaultStream) // frees the cache, retries and succeeds
	require.NoError(t, err)
	_, err = a.Alloc(30*mib, device.DefaultStream)
	require.ErrorIs(t, err, device.ErrOutOfMemory)
	small, err := a.Alloc(1000, device.DefaultStream)
	require.NoError(t, err)

	st := a.Stats()
	require.EqualValues(t, 2, st.NumAllocRetries, "the 50 MiB request and the failed 30 MiB one")
	require.EqualValues(t, 1, st.NumOOMs)
	want := `
# HELP gpumem_alloc_retries_total Device allocations retried after the allocator released its whole cache (num_alloc_retries).
# TYPE gpumem_alloc_retries_total counter
gpumem_alloc_retries_total{device="0"} 2
# HELP gpumem_allocated_bytes Bytes in blocks handed to callers and not yet freed (allocated_bytes.POOL.current, PyTorch's memory_allocated).
# TYPE gpumem_allocated_bytes gauge
gpumem_allocated_bytes{device="0",pool="all"} 5.2429824e+07
gpumem_allocated_bytes{device="0",pool="large_pool"} 5.24288e+07
gpumem_allocated_bytes{device="0",pool="small_pool"} 1024
# HELP gpumem_allocated_peak_bytes Highest gpumem_allocated_bytes since the last peak reset (allocated_bytes.POOL.peak, PyTorch's max_memory_allocated).
# TYPE gpumem_allocated_peak_bytes gauge
gpumem_allocated_peak_bytes{device="0",pool="all"} 5.2429824e+07
gpumem_allocated_peak_bytes{device="0",pool="large_pool"} 5.24288e+07
gpumem_allocated_peak_bytes{device="0",pool="small_pool"} 1024
# HELP gpumem_ooms_total Out-of-memory errors returned to callers (num_ooms).
# TYPE gpumem_ooms_total counter
gpumem_ooms_total{device="0"} 1
# HELP gpumem_reserved_bytes Bytes the allocator holds from the device, allocated or cached (reserved_bytes.POOL.current, PyTorch's memory_reserved).
# TYPE gpumem_reserved_bytes gauge
gpumem_reserved_bytes{device="0",pool="all"} 5.4525952e+07
gpumem_reserved_bytes{device="0",pool="large_pool"} 5.24288e+07
gpumem_reserved_bytes{device="0",pool="small_pool"} 2.097152e+06
# HELP gpumem_reserved_peak_bytes Highest gpumem_reserved_bytes since the last peak reset (reserved_bytes.POOL.peak, PyTorch's max_memory_reserved).
# TYPE gpumem_reserved_peak_bytes gauge
gpumem_reserved_peak_bytes{device="0",pool="all"} 5.4525952e+07
gpumem_reserved_peak_bytes{device="0",pool="large_pool"} 5.24288e+07
gpumem_reserved_peak_bytes{device="0",pool="small_pool"} 2.097152e+06
# HELP gpumem_segments Device allocations the allocator holds; expandable segments are not counted (segment.POOL.current).
# TYPE gpumem_segments gauge
gpumem_segments{device="0",pool="all"} 2
gpumem_segments{device="0",pool="large_pool"} 1
gpumem_segments{device="0",pool="small_pool"} 1
`
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(want),
		"gpumem_alloc_retries_total", "gpumem_ooms_total",
		"gpumem_allocated_bytes", "gpumem_allocated_peak_bytes",
		"gpumem_reserved_bytes", "gpumem_reserved_peak_bytes", "gpumem_segments"))

	// Every metric and pool is its stats key.
	keys := map[string]string{
		"gpumem_allocated_bytes":      "allocated_bytes.%s.current",
		"gpumem_allocated_peak_bytes": "allocated_bytes.%s.peak",
		"gpumem_reserved_bytes":       "reserved_bytes.%s.current",
		"gpumem_reserved_peak_bytes":  "reserved_bytes.%s.peak",
		"gpumem_active_bytes":         "active_bytes.%s.current",
		"gpumem_inactive_split_bytes": "inactive_split_bytes.%s.current",
		"gpumem_allocated_blocks":     "allocation.%s.current",
		"gpumem_segments":             "segment.%s.current",
		"gpumem_allocations_total":    "allocation.%s.allocated",
		"gpumem_ooms_total":           "num_ooms",
		"gpumem_alloc_retries_total":  "num_alloc_retries",
		"gpumem_device_allocs_total":  "num_device_alloc",
		"gpumem_device_frees_total":   "num_device_free",
	}
	require.Len(t, keys, len(metricNames))
	mfs, err := reg.Gather()
	require.NoError(t, err)
	require.Len(t, mfs, len(metricNames))
	for _, mf := range mfs {
		format, ok := keys[mf.GetName()]
		require.True(t, ok, mf.GetName())
		for _, m := range mf.GetMetric() {
			key := format
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			assert.Equal(t, "0", labels["device"])
			if pool, ok := labels["pool"]; ok {
				key = fmt.Sprintf(format, pool)
			}
			want, ok := st.Get(key)
			require.True(t, ok, key)
			got := m.GetGauge().GetValue()
			if mf.GetType() == dto.MetricType_COUNTER {
				got = m.GetCounter().GetValue()
			}
			assert.Equal(t, float64(want), got, "%s %v (%s)", mf.GetName(), labels, key)
		}
	}

	// The next scrape reads the stats again.
	require.NoError(t, a.Free(big))
	require.NoError(t, a.Free(small))
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP gpumem_allocated_bytes Bytes in blocks handed to callers and not yet freed (allocated_bytes.POOL.current, PyTorch's memory_allocated).
# TYPE gpumem_allocated_bytes gauge
gpumem_allocated_bytes{device="0",pool="all"} 0
gpumem_allocated_bytes{device="0",pool="large_pool"} 0
gpumem_allocated_bytes{device="0",pool="small_pool"} 0
`), "gpumem_allocated_bytes"))
}

func TestManagerCollector(t *testing.T) {
	m, err := allocator.NewManager(simtest.Opener(), allocator.Config{})
	require.NoError(t, err)
	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(promstats.NewManagerCollector(m)))

	n, err := testutil.GatherAndCount(reg)
	require.NoError(t, err)
	assert.Zero(t, n, "no device used yet")

	_, err = m.Alloc(0, 3*mib, device.DefaultStream)
	require.NoError(t, err)
	_, err = m.Alloc(2, 30*mib, device.DefaultStream)
	require.NoError(t, err)
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP gpumem_reserved_bytes Bytes the allocator holds from the device, allocated or cached (reserved_bytes.POOL.current, PyTorch's memory_reserved).
# TYPE gpumem_reserved_bytes gauge
gpumem_reserved_bytes{device="0",pool="all"} 2.097152e+07
gpumem_reserved_bytes{device="0",pool="large_pool"} 2.097152e+07
gpumem_reserved_bytes{device="0",pool="small_pool"} 0
gpumem_reserved_bytes{device="2",pool="all"} 3.145728e+07
gpumem_reserved_bytes{device="2",pool="large_pool"} 3.145728e+07
gpumem_reserved_bytes{device="2",pool="small_pool"} 0
# HELP gpumem_device_allocs_total Successful device allocations, page mappings of expandable segments included (num_device_alloc).
# TYPE gpumem_device_allocs_total counter
gpumem_device_allocs_total{device="0"} 1
gpumem_device_allocs_total{device="2"} 1
`), "gpumem_reserved_bytes", "gpumem_device_allocs_total"))
	n, err = testutil.GatherAndCount(reg)
	require.NoError(t, err)
	assert.Equal(t, 2*(9*3+4), n)
}

// Two collectors of the same device register side by side only with
// labels of their own.
func TestConstLabels(t *testing.T) {
	a := newAllocator(t, sim.Config{})
	b := newAllocator(t, sim.Config{})
	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(promstats.NewCollector(a, promstats.WithConstLabels(prometheus.Labels{"allocator": "train"}))))
	assert.Error(t, reg.Register(promstats.NewCollector(b)), "the same descriptions twice")
	require.NoError(t, reg.Register(promstats.NewCollector(b, promstats.WithConstLabels(prometheus.Labels{"allocator": "eval"}))))
	_, err := a.Alloc(mib, device.DefaultStream)
	require.NoError(t, err)
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP gpumem_allocated_blocks Blocks handed to callers and not yet freed (allocation.POOL.current).
# TYPE gpumem_allocated_blocks gauge
gpumem_allocated_blocks{allocator="eval",device="0",pool="all"} 0
gpumem_allocated_blocks{allocator="eval",device="0",pool="large_pool"} 0
gpumem_allocated_blocks{allocator="eval",device="0",pool="small_pool"} 0
gpumem_allocated_blocks{allocator="train",device="0",pool="all"} 1
gpumem_allocated_blocks{allocator="train",device="0",pool="large_pool"} 0
gpumem_allocated_blocks{allocator="train",device="0",pool="small_pool"} 1
`), "gpumem_allocated_blocks"))
}

// Caller mistakes give errors from the registry, or nothing, never a
// panic.
func TestBadInput(t *testing.T) {
	a := newAllocator(t, sim.Config{})

	reg := prometheus.NewRegistry()
	err := reg.Register(promstats.NewCollector(a, promstats.WithConstLabels(prometheus.Labels{"bad\xff": "x"})))
	assert.Error(t, err, "an invalid label name")
	err = reg.Register(promstats.NewCollector(a, promstats.WithConstLabels(prometheus.Labels{"pool": "x"})))
	assert.Error(t, err, "a label the collector uses itself")

	// Collected without registering: invalid metrics, which Gather reports.
	c := promstats.NewCollector(a, promstats.WithConstLabels(prometheus.Labels{"pool": "x"}))
	ch := make(chan prometheus.Metric, 100)
	c.Collect(ch)
	close(ch)
	for m := range ch {
		assert.Error(t, m.Write(&dto.Metric{}))
		break
	}

	var nilAlloc *allocator.Allocator
	var nilManager *allocator.Manager
	for _, c := range []prometheus.Collector{
		promstats.NewCollector(nil),
		promstats.NewCollector(nilAlloc),
		promstats.NewManagerCollector(nil),
		promstats.NewManagerCollector(nilManager),
		promstats.NewCollector(a, nil),
	} {
		reg := prometheus.NewPedanticRegistry()
		require.NoError(t, reg.Register(c))
		_, err := reg.Gather()
		assert.NoError(t, err)
	}
}

// Scrapes while the allocator runs.
func TestConcurrentScrapes(t *testing.T) {
	a := newAllocator(t, sim.Config{})
	reg := prometheus.NewRegistry()
	reg.MustRegister(promstats.NewCollector(a))
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := range 200 {
			p, err := a.Alloc(uint64(1+i%5)*mib, device.DefaultStream) // 1 MiB is a small block
			assert.NoError(t, err)
			assert.NoError(t, a.Free(p))
		}
	})
	for range 20 {
		_, err := reg.Gather()
		require.NoError(t, err)
	}
	wg.Wait()
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP gpumem_allocations_total Blocks handed to callers (allocation.POOL.allocated).
# TYPE gpumem_allocations_total counter
gpumem_allocations_total{device="0",pool="all"} 200
gpumem_allocations_total{device="0",pool="large_pool"} 160
gpumem_allocations_total{device="0",pool="small_pool"} 40
`), "gpumem_allocations_total"))
}
