// This file holds the allocator's own representation of its statistics,
// laid out for the hot path. Only the ledger (ledger.go) changes it.

package allocator

import "github.com/gpumem/gpumem/stats"

// poolStat is a stats.StatArray kept per pool only: the "all" entry is
// derived when the stats are read. Current, Allocated and Freed of "all"
// are the sums of the pools' (exactly, resets included, since resets apply
// to every entry at once); the "all" peak is the one figure that is not a
// sum, so it is tracked at every increase. An update thus touches one pool
// entry instead of two entries, which halves the stores on every Alloc and
// Free.
type poolStat struct {
	pool    [2]stats.Stat // indexed by poolIndex
	allPeak int64
}

// poolIndex maps stats.SmallPool and stats.LargePool to 0 and 1.
func poolIndex(p stats.Pool) int { return int(p-stats.SmallPool) & 1 }

// increase adds n to pool p.
func (a *poolStat) increase(p stats.Pool, n int64) {
	s := &a.pool[poolIndex(p)]
	s.Current += n
	s.Allocated += n
	if s.Current > s.Peak {
		s.Peak = s.Current
	}
	if t := a.pool[0].Current + a.pool[1].Current; t > a.allPeak {
		a.allPeak = t
	}
}

// decrease subtracts n from pool p.
func (a *poolStat) decrease(p stats.Pool, n int64) {
	s := &a.pool[poolIndex(p)]
	s.Current -= n
	s.Freed += n
}

// add adds n, which may be negative or zero, to pool p.
func (a *poolStat) add(p stats.Pool, n int64) {
	switch {
	case n > 0:
		a.increase(p, n)
	case n < 0:
		a.decrease(p, -n)
	}
}

// current returns the "all" current value.
func (a *poolStat) current() int64 { return a.pool[0].Current + a.pool[1].Current }

// array returns the stats.StatArray this poolStat stands for.
func (a *poolStat) array() stats.StatArray {
	var out stats.StatArray
	out[stats.SmallPool] = a.pool[poolIndex(stats.SmallPool)]
	out[stats.LargePool] = a.pool[poolIndex(stats.LargePool)]
	out[stats.All] = stats.Stat{
		Current:   a.current(),
		Peak:      a.allPeak,
		Allocated: a.pool[0].Allocated + a.pool[1].Allocated,
		Freed:     a.pool[0].Freed + a.pool[1].Freed,
	}
	return out
}

// counters is everything the allocator counts; stats() turns it into the
// stats.DeviceStats that callers see. Guarded by Allocator.mu.
type counters struct {
	metrics [stats.NumMetrics]poolStat // indexed by stats.Metric

	oversizeAllocations stats.Stat
	oversizeSegments    stats.Stat

	numAllocRetries   int64
	numOOMs           int64
	numSyncAllStreams int64
	numDeviceAlloc    int64
	numDeviceFree     int64

	maxSplitSize int64 // the setting, -1 when unlimited
}

// of returns the poolStat of metric m.
func (c *counters) of(m stats.Metric) *poolStat { return &c.metrics[m] }

func (c *counters) stats() stats.DeviceStats {
	d := stats.DeviceStats{
		OversizeAllocations: c.oversizeAllocations,
		OversizeSegments:    c.oversizeSegments,
		NumAllocRetries:     c.numAllocRetries,
		NumOOMs:             c.numOOMs,
		NumSyncAllStreams:   c.numSyncAllStreams,
		NumDeviceAlloc:      c.numDeviceAlloc,
		NumDeviceFree:       c.numDeviceFree,
		MaxSplitSize:        c.maxSplitSize,
	}
	for m := range stats.NumMetrics {
		*d.Of(m) = c.metrics[m].array()
	}
	return d
}

// load sets the counters from d, the inverse of stats.
func (c *counters) load(d *stats.DeviceStats) {
	for m := range stats.NumMetrics {
		a := d.Of(m)
		c.metrics[m] = poolStat{allPeak: a[stats.All].Peak}
		c.metrics[m].pool[poolIndex(stats.SmallPool)] = a[stats.SmallPool]
		c.metrics[m].pool[poolIndex(stats.LargePool)] = a[stats.LargePool]
	}
	c.oversizeAllocations, c.oversizeSegments = d.OversizeAllocations, d.OversizeSegments
	c.numAllocRetries, c.numOOMs, c.numSyncAllStreams = d.NumAllocRetries, d.NumOOMs, d.NumSyncAllStreams
	c.numDeviceAlloc, c.numDeviceFree = d.NumDeviceAlloc, d.NumDeviceFree
	c.maxSplitSize = d.MaxSplitSize
}

// resetPeak and resetAccumulated apply the stats package's resets, which
// follow its one table of stats, through a DeviceStats.
func (c *counters) resetPeak() {
	d := c.stats()
	d.ResetPeak()
	c.load(&d)
}

func (c *counters) resetAccumulated() {
	d := c.stats()
	d.ResetAccumulated()
	c.load(&d)
}
