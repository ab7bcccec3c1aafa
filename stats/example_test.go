// This file holds the package's runnable examples.

package stats_test

import (
	"fmt"
	"log/slog"
	"os"

	"github.com/gpumem/gpumem/stats"
)

// trainingStats returns the stats an allocator would report after one
// 8 MiB large-pool block and one 4 KiB small-pool block were handed out
// from two fresh segments, and the small block was freed again.
func trainingStats() stats.DeviceStats {
	var d stats.DeviceStats
	d.MaxSplitSize = -1
	// Two device allocations: a 20 MiB large segment and a 2 MiB small one.
	d.Segment.Increase(stats.LargePool, 1)
	d.ReservedBytes.Increase(stats.LargePool, 20<<20)
	d.Segment.Increase(stats.SmallPool, 1)
	d.ReservedBytes.Increase(stats.SmallPool, 2<<20)
	d.NumDeviceAlloc = 2
	// Hand out 8 MiB and 4 KiB (the caller asked for 4000 bytes).
	for _, b := range []struct {
		pool            stats.Pool
		size, requested int64
	}{{stats.LargePool, 8 << 20, 8 << 20}, {stats.SmallPool, 4096, 4000}} {
		d.Allocation.Increase(b.pool, 1)
		d.AllocatedBytes.Increase(b.pool, b.size)
		d.Active.Increase(b.pool, 1)
		d.ActiveBytes.Increase(b.pool, b.size)
		d.RequestedBytes.Increase(b.pool, b.requested)
	}
	// The large segment is split: its 12 MiB remainder is inactive split.
	d.InactiveSplit.Increase(stats.LargePool, 1)
	d.InactiveSplitBytes.Increase(stats.LargePool, 12<<20)
	// Free the small block; it merges back into a whole free segment.
	d.Allocation.Decrease(stats.SmallPool, 1)
	d.AllocatedBytes.Decrease(stats.SmallPool, 4096)
	d.Active.Decrease(stats.SmallPool, 1)
	d.ActiveBytes.Decrease(stats.SmallPool, 4096)
	d.RequestedBytes.Decrease(stats.SmallPool, 4000)
	return d
}

// Read stats by PyTorch's memory_stats keys.
func ExampleDeviceStats_Get() {
	d := trainingStats()
	for _, key := range []string{
		"allocated_bytes.all.current",
		"allocated_bytes.small_pool.peak",
		"requested_bytes.all.allocated",
		"segment.all.current",
		"max_split_size",
		"no.such.key",
	} {
		v, ok := d.Get(key)
		fmt.Println(key, v, ok)
	}
	m := d.Map()
	fmt.Println(len(m), "keys; inactive_split_bytes.all.current =", m["inactive_split_bytes.all.current"])
	// Output:
	// allocated_bytes.all.current 8388608 true
	// allocated_bytes.small_pool.peak 4096 true
	// requested_bytes.all.allocated 8392608 true
	// segment.all.current 2 true
	// max_split_size -1 true
	// no.such.key 0 false
	// 122 keys; inactive_split_bytes.all.current = 12582912
}

// Print PyTorch's memory summary table.
func ExampleSummary() {
	d := trainingStats()
	fmt.Print(stats.Summary(&d, stats.SummaryOptions{Device: 0, Name: "sim", Abbreviated: true}))
	// Output:
	// |===========================================================================|
	// |                   gpumem memory summary, device 0 (sim)                   |
	// |---------------------------------------------------------------------------|
	// |            CUDA OOMs: 0            |        cudaMalloc retries: 0         |
	// |===========================================================================|
	// |        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  |
	// |---------------------------------------------------------------------------|
	// | Allocated memory      |   8192 KiB |   8196 KiB |   8196 KiB |   4096 B   |
	// |---------------------------------------------------------------------------|
	// | Active memory         |   8192 KiB |   8196 KiB |   8196 KiB |   4096 B   |
	// |---------------------------------------------------------------------------|
	// | Requested memory      |   8192 KiB |   8195 KiB |   8195 KiB |   4000 B   |
	// |---------------------------------------------------------------------------|
	// | GPU reserved memory   |  22528 KiB |  22528 KiB |  22528 KiB |      0 B   |
	// |---------------------------------------------------------------------------|
	// | Non-releasable memory |  12288 KiB |  12288 KiB |  12288 KiB |      0 B   |
	// |---------------------------------------------------------------------------|
	// | Allocations           |       1    |       2    |       2    |       1    |
	// |---------------------------------------------------------------------------|
	// | Active allocs         |       1    |       2    |       2    |       1    |
	// |---------------------------------------------------------------------------|
	// | GPU reserved segments |       2    |       2    |       2    |       0    |
	// |---------------------------------------------------------------------------|
	// | Non-releasable allocs |       1    |       1    |       1    |       0    |
	// |---------------------------------------------------------------------------|
	// | Oversize allocations  |       0    |       0    |       0    |       0    |
	// |---------------------------------------------------------------------------|
	// | Oversize GPU segments |       0    |       0    |       0    |       0    |
	// |===========================================================================|
}

// Report memory every few steps of a training loop.
func ExampleLine() {
	d := trainingStats()
	for step := 100; step <= 200; step += 100 {
		fmt.Printf("step %d: %s\n", step, stats.Line(&d))
	}
	fmt.Println(stats.FormatSize(1024), stats.FormatSize(1025), stats.FormatSize(3<<29))
	// Output:
	// step 100: allocated 8.00 MiB (peak 8.00 MiB) | reserved 22.00 MiB (peak 22.00 MiB)
	// step 200: allocated 8.00 MiB (peak 8.00 MiB) | reserved 22.00 MiB (peak 22.00 MiB)
	// 1024 bytes 1.00 KiB 1.50 GiB
}

// A DeviceStats logs as a group of byte counts.
func ExampleDeviceStats_LogValue() {
	d := trainingStats()
	logger := slog.New(slog.NewTextHandler(os.Stdout, &slog.HandlerOptions{
		ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
			if a.Key == slog.TimeKey {
				return slog.Attr{} // keep the output stable
			}
			return a
		},
	}))
	logger.Info("step", "n", 100, "gpu", d)
	// Output:
	// level=INFO msg=step n=100 gpu.allocated=8388608 gpu.reserved=23068672 gpu.max_allocated=8392704 gpu.max_reserved=23068672
}
