// This file holds the cost model: what each call adds to the device clock.

package sim

import "time"

// Costs is the simulated time each call takes. A negative field means the
// call is free; a zero Costs value as a whole means DefaultCosts. Malloc
// costs MallocBase plus MallocPerGiB for each GiB charged; Map and Unmap
// cost their figure per page.
type Costs struct {
	MallocBase, MallocPerGiB time.Duration
	Free                     time.Duration // plus Synchronize: cudaFree synchronizes the device
	MemInfo                  time.Duration
	Synchronize              time.Duration
	StreamCreate             time.Duration
	EventRecord              time.Duration
	EventQuery               time.Duration
	EventSynchronize         time.Duration
	EventRelease             time.Duration
	Reserve, Release         time.Duration
	MapPerPage, UnmapPerPage time.Duration
	HostAlloc, HostFree      time.Duration
}

// DefaultCosts returns figures near a real driver on a current GPU:
// cudaMalloc takes tens to hundreds of microseconds, growing with size;
// cudaFree tens of microseconds plus a device synchronization; event calls
// a few microseconds.
func DefaultCosts() Costs {
	return Costs{
		MallocBase:       60 * time.Microsecond,
		MallocPerGiB:     150 * time.Microsecond,
		Free:             40 * time.Microsecond,
		MemInfo:          2 * time.Microsecond,
		Synchronize:      10 * time.Microsecond,
		StreamCreate:     5 * time.Microsecond,
		EventRecord:      2 * time.Microsecond,
		EventQuery:       1 * time.Microsecond,
		EventSynchronize: 3 * time.Microsecond,
		EventRelease:     1 * time.Microsecond,
		Reserve:          5 * time.Microsecond,
		Release:          5 * time.Microsecond,
		MapPerPage:       20 * time.Microsecond,
		UnmapPerPage:     15 * time.Microsecond,
		HostAlloc:        200 * time.Microsecond,
		HostFree:         100 * time.Microsecond,
	}
}

// normalized turns negative fields into zero.
func (c Costs) normalized() Costs {
	for _, f := range []*time.Duration{&c.MallocBase, &c.MallocPerGiB, &c.Free, &c.MemInfo, &c.Synchronize,
		&c.StreamCreate, &c.EventRecord, &c.EventQuery, &c.EventSynchronize, &c.EventRelease,
		&c.Reserve, &c.Release, &c.MapPerPage, &c.UnmapPerPage, &c.HostAlloc, &c.HostFree} {
		if *f < 0 {
			*f = 0
		}
	}
	return c
}

// mallocCost is the cost of a malloc charging n bytes.
func (c *Costs) mallocCost(n uint64) time.Duration {
	return c.MallocBase + time.Duration(float64(c.MallocPerGiB)*float64(n)/(1<<30))
}
