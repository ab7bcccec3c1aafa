// Concurrent use: many goroutines on one device, checked under -race.

package sim

import (
	"errors"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpumem/gpumem/device"
)

// TestConcurrentUse drives one device from many goroutines, with less
// memory than they ask for, and checks that every counter adds up to what
// the goroutines saw.
func TestConcurrentUse(t *testing.T) {
	const (
		workers = 8
		rounds  = 300
		page    = 4096
	)
	// Unbounded, the workers would keep about 5,400 pages live: more than
	// twice the capacity, so many of their calls find the device full.
	d := mustNew(t, Config{Capacity: 2048 * page, PageSize: page})
	var failing sync.Mutex // guards fails
	var fails []error
	failf := func(err error) {
		failing.Lock()
		fails = append(fails, err)
		failing.Unlock()
	}
	type result struct {
		mallocs, ooms, frees, events, maps, mapOOMs, hosts int64
		live                                               []device.Ptr
	}
	results := make([]result, workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			res := &results[w]
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			s, err := d.NewStream()
			if err != nil {
				failf(err)
				return
			}
			resv, err := d.Reserve(16 * page)
			if err != nil {
				failf(err)
				return
			}
			// Odd workers' streams never hold work; even ones hold it
			// every other round.
			toggles := w%2 == 0
			for i := range rounds {
				busy := toggles && i%2 == 0
				if err := d.SetStreamBusy(s, busy); err != nil {
					failf(err)
					return
				}
				p, err := d.Malloc(1 + rng.Uint64N(8*page))
				switch {
				case errors.Is(err, device.ErrOutOfMemory):
					res.ooms++
				case err != nil:
					failf(err)
					return
				default:
					res.mallocs++
					res.live = append(res.live, p)
				}
				if len(res.live) > 0 && rng.IntN(2) == 0 {
					j := rng.IntN(len(res.live))
					if err := d.Free(res.live[j]); err != nil {
						failf(err)
					}
					res.frees++
					res.live = append(res.live[:j], res.live[j+1:]...)
				}
				e, err := d.RecordEvent(s)
				if err != nil {
					failf(err)
					return
				}
				res.events++
				done, err := d.EventDone(e)
				if err != nil || (!busy && !done) {
					failf(errors.Join(err, errors.New("event on an idle stream not done")))
				}
				if i%3 == 0 {
					if err := d.SynchronizeEvent(e); err != nil {
						failf(err)
					}
					if done, err := d.EventDone(e); err != nil || !done {
						failf(errors.Join(err, errors.New("event not done after SynchronizeEvent")))
					}
				}
				if err := d.ReleaseEvent(e); err != nil {
					failf(err)
				}
				if _, _, err := d.MemInfo(); err != nil {
					failf(err)
				}
				if i%7 == 0 {
					off := device.Ptr(rng.IntN(8) * page)
					switch err := d.Map(resv+off, 8*page); {
					case errors.Is(err, device.ErrOutOfMemory):
						res.mapOOMs++
					case err != nil:
						failf(err)
					default:
						if err := d.Unmap(resv+off, 8*page); err != nil {
							failf(err)
						}
						res.maps++
					}
				}
				if i%25 == 0 {
					h, err := d.HostAlloc(64)
					if err == nil {
						h[63] = 1
						err = d.HostFree(h)
					}
					if err != nil {
						failf(err)
					}
					res.hosts++
				}
				if i%50 == 0 {
					if err := d.Synchronize(); err != nil {
						failf(err)
					}
					_ = d.Allocations()
					_ = d.Reservations()
				}
			}
			if err := d.Release(resv); err != nil {
				failf(err)
			}
		})
	}
	wg.Wait()
	require.Empty(t, fails)

	var sum result
	for _, r := range results {
		sum.mallocs += r.mallocs
		sum.ooms += r.ooms
		sum.frees += r.frees
		sum.events += r.events
		sum.maps += r.maps
		sum.mapOOMs += r.mapOOMs
		sum.hosts += r.hosts
		sum.live = append(sum.live, r.live...)
	}
	require.Positive(t, sum.ooms, "the device ran full")
	allocs := d.Allocations()
	require.Len(t, allocs, len(sum.live))
	var inUse uint64
	for i, r := range allocs {
		inUse += r.Charged
		assert.Zero(t, uint64(r.Ptr)%page)
		if i > 0 {
			assert.LessOrEqual(t, allocs[i-1].End(), r.Ptr, "live ranges overlap")
		}
	}
	c := d.Counters()
	assert.Equal(t, int64(workers*rounds), sum.mallocs+sum.ooms)
	assert.Equal(t, sum.mallocs, c.Mallocs)
	assert.Equal(t, sum.ooms, c.FailedMallocs)
	assert.Equal(t, sum.frees, c.Frees)
	assert.Equal(t, c.Mallocs-int64(len(sum.live)), c.Frees)
	assert.Equal(t, sum.events, c.EventsRecorded)
	assert.Equal(t, int64(workers*rounds), c.EventsRecorded)
	assert.Equal(t, sum.events, c.EventsReleased)
	assert.Equal(t, sum.maps, c.Maps)
	assert.Equal(t, sum.maps, c.Unmaps)
	assert.Equal(t, sum.mapOOMs, c.FailedMaps)
	assert.Equal(t, sum.hosts, c.HostAllocs)
	assert.Equal(t, sum.hosts, c.HostFrees)
	assert.Equal(t, int64(workers), c.StreamsCreated)
	assert.Equal(t, int64(workers), c.Reserves)
	assert.Equal(t, int64(workers), c.Releases)
	assert.Equal(t, inUse, c.BytesInUse)
	assert.Zero(t, c.MappedBytes)
	assert.Zero(t, c.FailedFrees+c.FailedUnmaps+c.FailedEventQueries)
	assert.Empty(t, d.Reservations())

	for _, p := range sum.live {
		require.NoError(t, d.Free(p))
	}
	assert.Zero(t, d.BytesInUse())
	free, total, err := d.MemInfo()
	require.NoError(t, err)
	assert.Equal(t, total, free)
	assert.Empty(t, d.Allocations())
	// With everything free each region is one range again.
	d.mu.Lock()
	checkSpace(t, &d.mem)
	checkSpace(t, &d.vm)
	assert.Equal(t, 1, d.mem.count, "everything freed merges back into one range")
	assert.Equal(t, 1, d.vm.count)
	d.mu.Unlock()
	assert.Equal(t, d.MemoryBase(), mustMalloc(t, d, 1))
	r, err := d.Reserve(page)
	require.NoError(t, err)
	assert.Equal(t, d.VirtualBase(), r)
}
