// The cost model: simulated time charged for each driver call.

package sim

import (
	"math"
	"math/bits"
	"time"
)

// Costs gives the simulated time each call takes. Every call adds its cost
// to the device clock (Device.Clock), whether it succeeds or fails; with
// Config.Sleep the calling goroutine also really sleeps that long.
//
// A zero field takes its default (see DefaultCosts), so the zero Costs is
// the default model. A negative field means the call costs nothing. NoCosts
// returns a model where every call is free.
type Costs struct {
	Malloc       time.Duration // fixed part of cudaMalloc
	MallocPerGiB time.Duration // added per GiB charged (pro rata)
	Free         time.Duration // cudaFree, not counting the synchronization it implies
	MemInfo      time.Duration // cudaMemGetInfo

	Synchronize       time.Duration // device-wide synchronization (also charged by each Free)
	StreamSynchronize time.Duration // cudaStreamSynchronize
	StreamCreate      time.Duration // cudaStreamCreate

	EventRecord      time.Duration // cudaEventRecord (creation included)
	EventQuery       time.Duration // cudaEventQuery
	EventSynchronize time.Duration // cudaEventSynchronize
	EventRelease     time.Duration // cudaEventDestroy
	EventWait        time.Duration // cuStreamWaitEvent

	Reserve time.Duration // cuMemAddressReserve
	Release time.Duration // cuMemAddressFree
	Map     time.Duration // per page mapped: cuMemCreate + cuMemMap + cuMemSetAccess
	Unmap   time.Duration // per page unmapped: cuMemUnmap + cuMemRelease

	HostAlloc       time.Duration // fixed part of cudaHostAlloc
	HostAllocPerGiB time.Duration // page pinning, per GiB (pro rata)
	HostFree        time.Duration // cudaFreeHost

	Copy       time.Duration // fixed part of cuMemcpyDtoH / cuMemcpyHtoD
	CopyPerGiB time.Duration // transfer time per GiB (pro rata)

	MallocAsync time.Duration // cuMemAllocFromPoolAsync (a growth of the pool adds Malloc's cost of the chunk)
	FreeAsync   time.Duration // cuMemFreeAsync (each chunk returned to the device costs Free)
}

// DefaultCosts returns the default model, in the range a current data-centre
// GPU and driver show: cudaMalloc costs tens of microseconds plus about a
// quarter of a millisecond per GiB, cudaFree tens of microseconds plus a
// device synchronization, event calls a microsecond or two.
func DefaultCosts() Costs {
	return Costs{
		Malloc:       30 * time.Microsecond,
		MallocPerGiB: 250 * time.Microsecond,
		Free:         20 * time.Microsecond,
		MemInfo:      2 * time.Microsecond,

		Synchronize:       10 * time.Microsecond,
		StreamSynchronize: 5 * time.Microsecond,
		StreamCreate:      10 * time.Microsecond,

		EventRecord:      2 * time.Microsecond,
		EventQuery:       1 * time.Microsecond,
		EventSynchronize: 3 * time.Microsecond,
		EventRelease:     1 * time.Microsecond,
		EventWait:        1 * time.Microsecond,

		Reserve: 10 * time.Microsecond,
		Release: 10 * time.Microsecond,
		Map:     20 * time.Microsecond,
		Unmap:   15 * time.Microsecond,

		HostAlloc:       20 * time.Microsecond,
		HostAllocPerGiB: 150 * time.Millisecond,
		HostFree:        30 * time.Microsecond,

		Copy:       10 * time.Microsecond,
		CopyPerGiB: 40 * time.Millisecond, // about 25 GB/s over PCIe

		MallocAsync: 1 * time.Microsecond,
		FreeAsync:   1 * time.Microsecond,
	}
}

// NoCosts returns a model where every call takes no simulated time.
func NoCosts() Costs {
	return Costs{
		Malloc: -1, MallocPerGiB: -1, Free: -1, MemInfo: -1,
		Synchronize: -1, StreamSynchronize: -1, StreamCreate: -1,
		EventRecord: -1, EventQuery: -1, EventSynchronize: -1, EventRelease: -1, EventWait: -1,
		Reserve: -1, Release: -1, Map: -1, Unmap: -1,
		HostAlloc: -1, HostAllocPerGiB: -1, HostFree: -1,
		Copy: -1, CopyPerGiB: -1, MallocAsync: -1, FreeAsync: -1,
	}
}

// resolve replaces zero fields by their defaults and negative ones by zero.
func (c Costs) resolve() Costs {
	d := DefaultCosts()
	pick := func(v, def time.Duration) time.Duration {
		switch {
		case v == 0:
			return def
		case v < 0:
			return 0
		}
		return v
	}
	return Costs{
		Malloc:            pick(c.Malloc, d.Malloc),
		MallocPerGiB:      pick(c.MallocPerGiB, d.MallocPerGiB),
		Free:              pick(c.Free, d.Free),
		MemInfo:           pick(c.MemInfo, d.MemInfo),
		Synchronize:       pick(c.Synchronize, d.Synchronize),
		StreamSynchronize: pick(c.StreamSynchronize, d.StreamSynchronize),
		StreamCreate:      pick(c.StreamCreate, d.StreamCreate),
		EventRecord:       pick(c.EventRecord, d.EventRecord),
		EventQuery:        pick(c.EventQuery, d.EventQuery),
		EventSynchronize:  pick(c.EventSynchronize, d.EventSynchronize),
		EventRelease:      pick(c.EventRelease, d.EventRelease),
		EventWait:         pick(c.EventWait, d.EventWait),
		Reserve:           pick(c.Reserve, d.Reserve),
		Release:           pick(c.Release, d.Release),
		Map:               pick(c.Map, d.Map),
		Unmap:             pick(c.Unmap, d.Unmap),
		HostAlloc:         pick(c.HostAlloc, d.HostAlloc),
		HostAllocPerGiB:   pick(c.HostAllocPerGiB, d.HostAllocPerGiB),
		HostFree:          pick(c.HostFree, d.HostFree),
		Copy:              pick(c.Copy, d.Copy),
		CopyPerGiB:        pick(c.CopyPerGiB, d.CopyPerGiB),
		MallocAsync:       pick(c.MallocAsync, d.MallocAsync),
		FreeAsync:         pick(c.FreeAsync, d.FreeAsync),
	}
}

// perGiB returns rate × bytes / GiB, saturating instead of overflowing.
func perGiB(rate time.Duration, bytes uint64) time.Duration {
	hi, lo := bits.Mul64(uint64(rate), bytes)
	if hi>>30 != 0 {
		return math.MaxInt64
	}
	q := hi<<34 | lo>>30
	if q > math.MaxInt64 {
		return math.MaxInt64
	}
	return time.Duration(q)
}

// times returns rate × n, saturating.
func times(rate time.Duration, n uint64) time.Duration {
	hi, lo := bits.Mul64(uint64(rate), n)
	if hi != 0 || lo > math.MaxInt64 {
		return math.MaxInt64
	}
	return time.Duration(lo)
}

// plus adds durations, saturating.
func plus(a, b time.Duration) time.Duration {
	if s := a + b; s >= a {
		return s
	}
	return math.MaxInt64
}

func (c *Costs) malloc(bytes uint64) time.Duration {
	return plus(c.Malloc, perGiB(c.MallocPerGiB, bytes))
}

func (c *Costs) hostAlloc(bytes uint64) time.Duration {
	return plus(c.HostAlloc, perGiB(c.HostAllocPerGiB, bytes))
}

func (c *Costs) copy(bytes uint64) time.Duration {
	return plus(c.Copy, perGiB(c.CopyPerGiB, bytes))
}
