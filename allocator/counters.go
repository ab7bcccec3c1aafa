// This file holds the allocator's own representation of its statistics,
// laid out for the hot path.

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

// Increase adds n to pool p.
func (a *poolStat) Increase(p stats.Pool, n int64) {
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

// Decrease subtracts n from pool p.
func (a *poolStat) Decrease(p stats.Pool, n int64) {
	s := &a.pool[poolIndex(p)]
	s.Current -= n
	s.Freed += n
}

func (a *poolStat) resetPeak() {
	a.pool[0].ResetPeak()
	a.pool[1].ResetPeak()
	a.allPeak = a.pool[0].Current + a.pool[1].Current
}

func (a *poolStat) resetAccumulated() {
	a.pool[0].ResetAccumulated()
	a.pool[1].ResetAccumulated()
}

// array returns the stats.StatArray this poolStat stands for.
func (a *poolStat) array() stats.StatArray {
	var out stats.StatArray
	out[stats.SmallPool] = a.pool[poolIndex(stats.SmallPool)]
	out[stats.LargePool] = a.pool[poolIndex(stats.LargePool)]
	out[stats.All] = stats.Stat{
		Current:   a.pool[0].Current + a.pool[1].Current,
		Peak:      a.allPeak,
		Allocated: a.pool[0].Allocated + a.pool[1].Allocated,
		Freed:     a.pool[0].Freed + a.pool[1].Freed,
	}
	return out
}

// counters is everything the allocator counts; stats() turns it into the
// stats.DeviceStats that callers see. The embedded DeviceStats holds the
// counters and the two oversize stats; its nine pool arrays are shadowed by
// the poolStat fields below and stay unused.
type counters struct {
	stats.DeviceStats

	Allocation         poolStat
	Segment            poolStat
	Active             poolStat
	InactiveSplit      poolStat
	AllocatedBytes     poolStat
	ReservedBytes      poolStat
	ActiveBytes        poolStat
	InactiveSplitBytes poolStat
	RequestedBytes     poolStat
}

func (c *counters) arrays() [9]*poolStat {
	return [9]*poolStat{&c.Allocation, &c.Segment, &c.Active, &c.InactiveSplit, &c.AllocatedBytes,
		&c.ReservedBytes, &c.ActiveBytes, &c.InactiveSplitBytes, &c.RequestedBytes}
}

func (c *counters) stats() stats.DeviceStats {
	d := c.DeviceStats
	d.Allocation = c.Allocation.array()
	d.Segment = c.Segment.array()
	d.Active = c.Active.array()
	d.InactiveSplit = c.InactiveSplit.array()
	d.AllocatedBytes = c.AllocatedBytes.array()
	d.ReservedBytes = c.ReservedBytes.array()
	d.ActiveBytes = c.ActiveBytes.array()
	d.InactiveSplitBytes = c.InactiveSplitBytes.array()
	d.RequestedBytes = c.RequestedBytes.array()
	return d
}

func (c *counters) resetPeak() {
	for _, a := range c.arrays() {
		a.resetPeak()
	}
	c.DeviceStats.ResetPeak()
}

func (c *counters) resetAccumulated() {
	for _, a := range c.arrays() {
		a.resetAccumulated()
	}
	c.DeviceStats.ResetAccumulated()
}
