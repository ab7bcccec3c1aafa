// Package promstats exposes gpumem allocators' statistics to Prometheus:
// a prometheus.Collector that reads an allocator's stats, or those of
// every device of a Manager, each time the registry is scraped.
//
//	reg := prometheus.NewRegistry()
//	reg.MustRegister(promstats.NewCollector(a))        // one allocator
//	// or: reg.MustRegister(promstats.NewManagerCollector(m)) // every device of m
//	http.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
//
// It is a package of its own so that gpumem's core does not depend on the
// Prometheus client: only a program that imports promstats links it.
// Importing it registers nothing; the program registers the collector
// where it wants.
//
// # Model
//
// A Collector holds no state of its own: Collect calls Stats() on each
// allocator (a copy taken under the allocator's locks, held briefly) and
// turns the copy into constant metrics, so a scrape sees one consistent
// snapshot per device and costs the allocator what one Stats call costs.
// A Manager's devices appear once they are first used.
//
// Every metric has the label device (the ordinal: "0", "1", ...); the
// memory metrics also have pool: "all", "small_pool" (blocks of at most
// 1 MiB) or "large_pool", as in PyTorch's memory_stats keys. Each metric
// is one stats key family (see the stats package for their exact
// meaning):
//
//	gpumem_allocated_bytes{device,pool}       gauge    allocated_bytes.POOL.current (memory_allocated)
//	gpumem_allocated_peak_bytes{device,pool}  gauge    allocated_bytes.POOL.peak (max_memory_allocated)
//	gpumem_reserved_bytes{device,pool}        gauge    reserved_bytes.POOL.current (memory_reserved)
//	gpumem_reserved_peak_bytes{device,pool}   gauge    reserved_bytes.POOL.peak (max_memory_reserved)
//	gpumem_active_bytes{device,pool}          gauge    active_bytes.POOL.current
//	gpumem_inactive_split_bytes{device,pool}  gauge    inactive_split_bytes.POOL.current (cached, not releasable)
//	gpumem_allocated_blocks{device,pool}      gauge    allocation.POOL.current
//	gpumem_segments{device,pool}              gauge    segment.POOL.current
//	gpumem_allocations_total{device,pool}     counter  allocation.POOL.allocated
//	gpumem_ooms_total{device}                 counter  num_ooms
//	gpumem_alloc_retries_total{device}        counter  num_alloc_retries
//	gpumem_device_allocs_total{device}        counter  num_device_alloc
//	gpumem_device_frees_total{device}         counter  num_device_free
//
// Peaks are gauges: the allocator's ResetPeakStats lowers them to the
// current values. The counters fall to zero on ResetAccumulatedStats,
// which Prometheus's rate and increase read as a counter reset.
//
// Two collectors on one registry must not report the same device with
// the same labels: give each its own labels with WithConstLabels (two
// Managers in one process, say).
package promstats

import (
	"reflect"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/stats"
)

// Allocator is what NewCollector reads: *allocator.Allocator implements
// it. Stats must be safe to call from the scraping goroutine at any time.
type Allocator interface {
	Stats() stats.DeviceStats
	Device() device.Device
}

// Manager is what NewManagerCollector reads: *allocator.Manager
// implements it. Its methods must be safe to call from the scraping
// goroutine at any time.
type Manager interface {
	Devices() []int
	Stats(ordinal int) stats.DeviceStats
}

// Option configures a Collector.
type Option func(*options)

type options struct {
	constLabels prometheus.Labels
}

// WithConstLabels adds labels with fixed values to every metric of the
// collector, to tell apart collectors that report the same device
// ordinals. Label names must be valid Prometheus label names other than
// device and pool; otherwise registering the collector fails.
func WithConstLabels(labels prometheus.Labels) Option {
	return func(o *options) { o.constLabels = labels }
}

// Collector is a prometheus.Collector of gpumem stats. Create it with
// NewCollector or NewManagerCollector.
type Collector struct {
	read    func(each func(ordinal int, st *stats.DeviceStats)) // calls each for every device, at scrape time
	metrics []metric
}

// metric is one metric family: its description and how to read it.
type metric struct {
	desc    *prometheus.Desc
	kind    prometheus.ValueType
	perPool bool
	value   func(d *stats.DeviceStats, p stats.Pool) int64
}

// NewCollector returns a collector of a's stats, labelled with the
// ordinal of a's device. A nil a gives a collector that reports nothing.
func NewCollector(a Allocator, opts ...Option) *Collector {
	c := newCollector(opts)
	if isNil(a) {
		return c
	}
	ordinal := 0
	if dev := a.Device(); !isNil(dev) {
		ordinal = dev.Ordinal()
	}
	c.read = func(each func(int, *stats.DeviceStats)) {
		st := a.Stats()
		each(ordinal, &st)
	}
	return c
}

// NewManagerCollector returns a collector of the stats of every device of
// m, read at each scrape: the devices m.Devices lists (for an
// allocator.Manager, those it can open, or those opened so far when it
// does not know the machine). A nil m gives a collector that reports
// nothing.
func NewManagerCollector(m Manager, opts ...Option) *Collector {
	c := newCollector(opts)
	if isNil(m) {
		return c
	}
	c.read = func(each func(int, *stats.DeviceStats)) {
		for _, o := range m.Devices() {
			st := m.Stats(o)
			each(o, &st)
		}
	}
	return c
}

// isNil reports whether v is nil or a nil pointer in an interface.
func isNil(v any) bool {
	if v == nil {
		return true
	}
	rv := reflect.ValueOf(v)
	switch rv.Kind() {
	case reflect.Pointer, reflect.Map, reflect.Slice, reflect.Func, reflect.Interface, reflect.Chan:
		return rv.IsNil()
	}
	return false
}

func newCollector(opts []Option) *Collector {
	var o options
	for _, opt := range opts {
		if opt != nil {
			opt(&o)
		}
	}
	pooled := func(name, help string, kind prometheus.ValueType, arr func(d *stats.DeviceStats) *stats.StatArray, field func(s *stats.Stat) int64) metric {
		return metric{
			desc:    prometheus.NewDesc(name, help, []string{"device", "pool"}, o.constLabels),
			kind:    kind,
			perPool: true,
			value:   func(d *stats.DeviceStats, p stats.Pool) int64 { return field(&arr(d)[p]) },
		}
	}
	counter := func(name, help string, v func(d *stats.DeviceStats) int64) metric {
		return metric{
			desc:  prometheus.NewDesc(name, help, []string{"device"}, o.constLabels),
			kind:  prometheus.CounterValue,
			value: func(d *stats.DeviceStats, _ stats.Pool) int64 { return v(d) },
		}
	}
	current := func(s *stats.Stat) int64 { return s.Current }
	peak := func(s *stats.Stat) int64 { return s.Peak }
	cumulative := func(s *stats.Stat) int64 { return s.Allocated }
	allocated := func(d *stats.DeviceStats) *stats.StatArray { return &d.AllocatedBytes }
	reserved := func(d *stats.DeviceStats) *stats.StatArray { return &d.ReservedBytes }
	gauge := prometheus.GaugeValue
	return &Collector{
		read: func(func(int, *stats.DeviceStats)) {},
		metrics: []metric{
			pooled("gpumem_allocated_bytes",
				"Bytes in blocks handed to callers and not yet freed (allocated_bytes.POOL.current, PyTorch's memory_allocated).",
				gauge, allocated, current),
			pooled("gpumem_allocated_peak_bytes",
				"Highest gpumem_allocated_bytes since the last peak reset (allocated_bytes.POOL.peak, PyTorch's max_memory_allocated).",
				gauge, allocated, peak),
			pooled("gpumem_reserved_bytes",
				"Bytes the allocator holds from the device, allocated or cached (reserved_bytes.POOL.current, PyTorch's memory_reserved).",
				gauge, reserved, current),
			pooled("gpumem_reserved_peak_bytes",
				"Highest gpumem_reserved_bytes since the last peak reset (reserved_bytes.POOL.peak, PyTorch's max_memory_reserved).",
				gauge, reserved, peak),
			pooled("gpumem_active_bytes",
				"Bytes in allocated blocks and in freed blocks still waiting for other streams (active_bytes.POOL.current).",
				gauge, func(d *stats.DeviceStats) *stats.StatArray { return &d.ActiveBytes }, current),
			pooled("gpumem_inactive_split_bytes",
				"Cached free bytes in segments that are partly in use, which cannot be returned to the device (inactive_split_bytes.POOL.current).",
				gauge, func(d *stats.DeviceStats) *stats.StatArray { return &d.InactiveSplitBytes }, current),
			pooled("gpumem_allocated_blocks",
				"Blocks handed to callers and not yet freed (allocation.POOL.current).",
				gauge, func(d *stats.DeviceStats) *stats.StatArray { return &d.Allocation }, current),
			pooled("gpumem_segments",
				"Device allocations the allocator holds; expandable segments are not counted (segment.POOL.current).",
				gauge, func(d *stats.DeviceStats) *stats.StatArray { return &d.Segment }, current),
			pooled("gpumem_allocations_total",
				"Blocks handed to callers (allocation.POOL.allocated).",
				prometheus.CounterValue, func(d *stats.DeviceStats) *stats.StatArray { return &d.Allocation }, cumulative),
			counter("gpumem_ooms_total",
				"Out-of-memory errors returned to callers (num_ooms).",
				func(d *stats.DeviceStats) int64 { return d.NumOOMs }),
			counter("gpumem_alloc_retries_total",
				"Device allocations retried after the allocator released its whole cache (num_alloc_retries).",
				func(d *stats.DeviceStats) int64 { return d.NumAllocRetries }),
			counter("gpumem_device_allocs_total",
				"Successful device allocations, page mappings of expandable segments included (num_device_alloc).",
				func(d *stats.DeviceStats) int64 { return d.NumDeviceAlloc }),
			counter("gpumem_device_frees_total",
				"Successful device frees, page unmappings of expandable segments included (num_device_free).",
				func(d *stats.DeviceStats) int64 { return d.NumDeviceFree }),
		},
	}
}

// pools are the values of the pool label, in PyTorch's order.
var pools = [...]stats.Pool{stats.All, stats.SmallPool, stats.LargePool}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, m := range c.metrics {
		ch <- m.desc
	}
}

// Collect implements prometheus.Collector: it reads the stats of each
// device once and sends every metric.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	c.read(func(ordinal int, st *stats.DeviceStats) {
		dev := strconv.Itoa(ordinal)
		for _, m := range c.metrics {
			if !m.perPool {
				ch <- constMetric(m, float64(m.value(st, stats.All)), dev)
				continue
			}
			for _, p := range pools {
				ch <- constMetric(m, float64(m.value(st, p)), dev, p.String())
			}
		}
	})
}

// constMetric builds one sample; a description made invalid by bad
// constant labels gives an invalid metric, which the registry reports as
// an error, instead of a panic.
func constMetric(m metric, v float64, labels ...string) prometheus.Metric {
	s, err := prometheus.NewConstMetric(m.desc, m.kind, v, labels...)
	if err != nil {
		return prometheus.NewInvalidMetric(m.desc, err)
	}
	return s
}
