package promstats_test

import (
	"fmt"
	"os"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/common/expfmt"

	"github.com/gpumem/gpumem/allocator"
	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/device/sim"
	"github.com/gpumem/gpumem/stats/promstats"
)

// A service registers a collector for its allocator; each scrape reads the
// allocator's stats. (A real service serves the registry with
// promhttp.HandlerFor on /metrics.)
func ExampleNewCollector() {
	dev, _ := sim.New(sim.Config{})
	a, _ := allocator.New(dev, allocator.Config{})

	reg := prometheus.NewRegistry()
	reg.MustRegister(promstats.NewCollector(a))

	_, _ = a.Alloc(3<<20, device.DefaultStream)   // a 20 MiB large-pool segment
	_, _ = a.Alloc(100<<10, device.DefaultStream) // a 2 MiB small-pool segment

	text, err := testutil.GatherAndFormat(reg, expfmt.TypeTextPlain, "gpumem_allocated_bytes", "gpumem_reserved_bytes", "gpumem_ooms_total")
	if err != nil {
		fmt.Println(err)
	}
	_, _ = os.Stdout.Write(text)
	// Output:
	// # HELP gpumem_allocated_bytes Bytes in blocks handed to callers and not yet freed (allocated_bytes.POOL.current, PyTorch's memory_allocated).
	// # TYPE gpumem_allocated_bytes gauge
	// gpumem_allocated_bytes{device="0",pool="all"} 3.248128e+06
	// gpumem_allocated_bytes{device="0",pool="large_pool"} 3.145728e+06
	// gpumem_allocated_bytes{device="0",pool="small_pool"} 102400
	// # HELP gpumem_ooms_total Out-of-memory errors returned to callers (num_ooms).
	// # TYPE gpumem_ooms_total counter
	// gpumem_ooms_total{device="0"} 0
	// # HELP gpumem_reserved_bytes Bytes the allocator holds from the device, allocated or cached (reserved_bytes.POOL.current, PyTorch's memory_reserved).
	// # TYPE gpumem_reserved_bytes gauge
	// gpumem_reserved_bytes{device="0",pool="all"} 2.3068672e+07
	// gpumem_reserved_bytes{device="0",pool="large_pool"} 2.097152e+07
	// gpumem_reserved_bytes{device="0",pool="small_pool"} 2.097152e+06
}

// A Manager's collector reports every device it has used.
func ExampleNewManagerCollector() {
	m, _ := allocator.NewManager(func(o int) (device.Device, error) {
		return sim.New(sim.Config{Ordinal: o})
	}, allocator.Config{})

	reg := prometheus.NewRegistry()
	reg.MustRegister(promstats.NewManagerCollector(m))

	_, _ = m.Alloc(0, 1<<20, device.DefaultStream)
	_, _ = m.Alloc(1, 1<<20, device.DefaultStream)

	text, _ := testutil.GatherAndFormat(reg, expfmt.TypeTextPlain, "gpumem_device_allocs_total")
	_, _ = os.Stdout.Write(text)
	// Output:
	// # HELP gpumem_device_allocs_total Successful device allocations, page mappings of expandable segments included (num_device_alloc).
	// # TYPE gpumem_device_allocs_total counter
	// gpumem_device_allocs_total{device="0"} 1
	// gpumem_device_allocs_total{device="1"} 1
}
