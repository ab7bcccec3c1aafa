package stats

// Stat is one tracked quantity: its current value, the highest value it has
// reached since the last peak reset, and the cumulative sums of its
// increases (Allocated) and decreases (Freed) since the last accumulated
// reset. It is PyTorch's c10::CachingDeviceAllocator::Stat.
//
// Invariant: Current == Allocated - Freed as long as neither reset has
// run; Peak >= Current always.
type Stat struct {
	Current   int64
	Peak      int64
	Allocated int64
	Freed     int64
}

// Increase adds n to Current (and to Allocated) and raises Peak if needed.
func (s *Stat) Increase(n int64) {
	s.Current += n
	if s.Current > s.Peak {
		s.Peak = s.Current
	}
	s.Allocated += n
}

// Decrease subtracts n from Current and adds it to Freed.
func (s *Stat) Decrease(n int64) {
	s.Current -= n
	s.Freed += n
}

// ResetPeak makes Peak equal to Current.
func (s *Stat) ResetPeak() { s.Peak = s.Current }

// ResetAccumulated zeroes Allocated and Freed.
func (s *Stat) ResetAccumulated() { s.Allocated, s.Freed = 0, 0 }

// Pool selects one entry of a StatArray.
type Pool int

// The entries of a StatArray, in PyTorch's StatType order.
const (
	All       Pool = iota // the aggregate over both pools ("all")
	SmallPool             // blocks of at most 1 MiB ("small_pool")
	LargePool             // blocks above 1 MiB ("large_pool")
	NumPools
)

// String returns the key segment PyTorch uses for the pool.
func (p Pool) String() string {
	switch p {
	case All:
		return "all"
	case SmallPool:
		return "small_pool"
	case LargePool:
		return "large_pool"
	}
	return "unknown"
}

// StatArray holds one Stat per pool: All, SmallPool, LargePool. Every change
// updates All and exactly one pool entry, so All.Peak is the true peak of the
// sum, which may be less than the sum of the pool peaks.
type StatArray [NumPools]Stat

// Increase adds n to All and to pool p.
func (a *StatArray) Increase(p Pool, n int64) {
	a[All].Increase(n)
	a[p].Increase(n)
}

// Decrease subtracts n from All and from pool p.
func (a *StatArray) Decrease(p Pool, n int64) {
	a[All].Decrease(n)
	a[p].Decrease(n)
}

// ResetPeak resets the peak of every entry.
func (a *StatArray) ResetPeak() {
	for i := range a {
		a[i].ResetPeak()
	}
}

// ResetAccumulated resets the cumulative sums of every entry.
func (a *StatArray) ResetAccumulated() {
	for i := range a {
		a[i].ResetAccumulated()
	}
}

// DeviceStats is everything an allocator counts, with PyTorch's meaning for
// each field (c10::CachingDeviceAllocator::DeviceStats). The allocator
// keeps one and hands out copies; a copy is a consistent snapshot.
//
// The rules that are easy to get wrong:
//
//   - Allocation and AllocatedBytes fall when the caller frees a block.
//     Active, ActiveBytes and RequestedBytes fall only when the free
//     completes, which for a block recorded on other streams is later: once
//     the events recorded on those streams are done. Until then the block is
//     active but not allocated ("active_pending_free").
//   - InactiveSplit counts free blocks that are part of a split segment:
//     they cannot be returned to the device without the rest of the segment
//     ("non-releasable"). A free block that fills its whole segment is not
//     counted; blocks of expandable segments are never counted.
//   - AllocatedBytes and ActiveBytes count whole blocks (the rounded size
//     plus any remainder too small to split); RequestedBytes counts the sizes
//     callers asked for.
//   - Segment counts device allocations (cudaMalloc); mapping pages of an
//     expandable segment adds to ReservedBytes and NumDeviceAlloc but not to
//     Segment.
//   - NumDeviceAlloc and NumDeviceFree count successful device calls
//     (mallocs plus page mappings, frees plus unmappings).
//   - NumAllocRetries counts the times the allocator flushed its whole cache
//     and retried a device allocation; NumOOMs the out-of-memory errors it
//     returned; NumSyncAllStreams the times it waited for every outstanding
//     stream event (EmptyCache and the flush before a retry).
//   - MaxSplitSize is the configured max_split_size in bytes, or -1 when
//     unlimited, as PyTorch reports SIZE_MAX.
type DeviceStats struct {
	Allocation         StatArray
	Segment            StatArray
	Active             StatArray
	InactiveSplit      StatArray
	AllocatedBytes     StatArray
	ReservedBytes      StatArray
	ActiveBytes        StatArray
	InactiveSplitBytes StatArray
	RequestedBytes     StatArray

	OversizeAllocations Stat
	OversizeSegments    Stat

	NumAllocRetries   int64
	NumOOMs           int64
	NumSyncAllStreams int64
	NumDeviceAlloc    int64
	NumDeviceFree     int64

	MaxSplitSize int64
}

// ResetPeak makes every peak equal to its current value, as PyTorch's
// reset_peak_memory_stats does.
func (d *DeviceStats) ResetPeak() {
	for m := range NumMetrics {
		d.Of(m).ResetPeak()
	}
	for _, o := range oversizeStats {
		o.of(d).ResetPeak()
	}
}

// ResetAccumulated zeroes every cumulative sum and every counter, as
// PyTorch's reset_accumulated_memory_stats does. MaxSplitSize, a setting,
// stays.
func (d *DeviceStats) ResetAccumulated() {
	for m := range NumMetrics {
		d.Of(m).ResetAccumulated()
	}
	for _, o := range oversizeStats {
		o.of(d).ResetAccumulated()
	}
	for _, c := range counterKeys {
		if !c.setting {
			*c.of(d) = 0
		}
	}
}

// Add adds every field of src to d, to total several allocators (devices).
// Current values, cumulative sums and counters become exact totals; each
// peak becomes the sum of the peaks, which bounds the true peak of the
// total from above, since the parts may have peaked at different times.
// MaxSplitSize, a setting, stays d's.
func (d *DeviceStats) Add(src *DeviceStats) {
	add := func(d, s *Stat) {
		d.Current += s.Current
		d.Peak += s.Peak
		d.Allocated += s.Allocated
		d.Freed += s.Freed
	}
	for m := range NumMetrics {
		da, sa := d.Of(m), src.Of(m)
		for p := range da {
			add(&da[p], &sa[p])
		}
	}
	for _, o := range oversizeStats {
		add(o.of(d), o.of(src))
	}
	for _, c := range counterKeys {
		if !c.setting {
			*c.of(d) += *c.of(src)
		}
	}
}
