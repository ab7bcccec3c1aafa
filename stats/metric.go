// This file holds the one table of the nine per-pool stats: their names in
// the key space and in the summary, and where each lives in a DeviceStats.
// The key space, Map, Get, the summary's rows, the resets, Add and the
// allocator's invariant checker are all derived from it.

package stats

// Metric names one of the nine per-pool stats of a DeviceStats. Its
// constants carry the names of the DeviceStats fields they select, so that
// d.Of(stats.AllocatedBytes) is &d.AllocatedBytes.
type Metric uint8

// The nine per-pool stats, in the order of PyTorch's memory_summary rows.
const (
	AllocatedBytes     Metric = iota // allocated_bytes: bytes of blocks handed to callers
	ActiveBytes                      // active_bytes: bytes of allocated and pending blocks
	RequestedBytes                   // requested_bytes: bytes asked for, over active blocks
	ReservedBytes                    // reserved_bytes: device memory held
	InactiveSplitBytes               // inactive_split_bytes: bytes of free blocks of split segments
	Allocation                       // allocation: blocks handed to callers
	Active                           // active: allocated and pending blocks
	Segment                          // segment: device allocations held
	InactiveSplit                    // inactive_split: free blocks of split segments
	NumMetrics                       // the number of metrics
)

// metricInfo is one row of the table.
type metricInfo struct {
	key   string // key segment in memory_stats
	label string // row label in memory_summary
	bytes bool   // a byte count (sizes in B/KiB/...), otherwise a count
}

// metrics is the table, indexed by Metric.
var metrics = [NumMetrics]metricInfo{
	AllocatedBytes:     {"allocated_bytes", "Allocated memory", true},
	ActiveBytes:        {"active_bytes", "Active memory", true},
	RequestedBytes:     {"requested_bytes", "Requested memory", true},
	ReservedBytes:      {"reserved_bytes", "GPU reserved memory", true},
	InactiveSplitBytes: {"inactive_split_bytes", "Non-releasable memory", true},
	Allocation:         {"allocation", "Allocations", false},
	Active:             {"active", "Active allocs", false},
	Segment:            {"segment", "GPU reserved segments", false},
	InactiveSplit:      {"inactive_split", "Non-releasable allocs", false},
}

// String returns the metric's memory_stats key segment, such as
// "allocated_bytes".
func (m Metric) String() string {
	if m < NumMetrics {
		return metrics[m].key
	}
	return "unknown"
}

// IsBytes reports whether the metric counts bytes (otherwise blocks or
// segments).
func (m Metric) IsBytes() bool { return m < NumMetrics && metrics[m].bytes }

// Of returns the StatArray of metric m, or nil for a metric out of range.
func (d *DeviceStats) Of(m Metric) *StatArray {
	switch m {
	case AllocatedBytes:
		return &d.AllocatedBytes
	case ActiveBytes:
		return &d.ActiveBytes
	case RequestedBytes:
		return &d.RequestedBytes
	case ReservedBytes:
		return &d.ReservedBytes
	case InactiveSplitBytes:
		return &d.InactiveSplitBytes
	case Allocation:
		return &d.Allocation
	case Active:
		return &d.Active
	case Segment:
		return &d.Segment
	case InactiveSplit:
		return &d.InactiveSplit
	}
	return nil
}

// The two pool-less stats, with their key segments.
var oversizeStats = [...]struct {
	key string
	of  func(d *DeviceStats) *Stat
}{
	{"oversize_allocations", func(d *DeviceStats) *Stat { return &d.OversizeAllocations }},
	{"oversize_segments", func(d *DeviceStats) *Stat { return &d.OversizeSegments }},
}

// The single-value keys. A setting is not a counter: resets and Add leave
// it alone.
var counterKeys = [...]struct {
	key     string
	of      func(d *DeviceStats) *int64
	setting bool
}{
	{"num_alloc_retries", func(d *DeviceStats) *int64 { return &d.NumAllocRetries }, false},
	{"num_ooms", func(d *DeviceStats) *int64 { return &d.NumOOMs }, false},
	{"num_sync_all_streams", func(d *DeviceStats) *int64 { return &d.NumSyncAllStreams }, false},
	{"num_device_alloc", func(d *DeviceStats) *int64 { return &d.NumDeviceAlloc }, false},
	{"num_device_free", func(d *DeviceStats) *int64 { return &d.NumDeviceFree }, false},
	{"max_split_size", func(d *DeviceStats) *int64 { return &d.MaxSplitSize }, true},
}

// The names of the four fields of a Stat, in field order.
var fieldNames = [4]string{"current", "peak", "allocated", "freed"}

// field returns the field of s with index i in fieldNames order.
func (s *Stat) field(i int) *int64 {
	switch i {
	case 0:
		return &s.Current
	case 1:
		return &s.Peak
	case 2:
		return &s.Allocated
	default:
		return &s.Freed
	}
}
