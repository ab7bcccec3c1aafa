// Concurrent use: many goroutines on one device, checked under -race.

package sim

import (
	"errors"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpumem/gpumem/device"
)

func TestConcurrentUse(t *testing.T) {
	d := newDev(t, Config{Capacity: 256 * MiB, PageSize: 64 * KiB})
	const workers, rounds = 8, 300
	var wg sync.WaitGroup
	var mu sync.Mutex
	var kept []device.Ptr
	var ooms int
	errs := make(chan error, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, err := d.NewStream()
			if err != nil {
				errs <- err
				return
			}
			r, err := d.Reserve(4 * MiB)
			if err != nil {
				errs <- err
				return
			}
			x := uint64(w + 1)
			var live []device.Ptr
			for i := range rounds {
				x = x*6364136223846793005 + 1442695040888963407
				p, err := d.Malloc(1 + (x>>33)%(3*MiB))
				switch {
				case errors.Is(err, device.ErrOutOfMemory):
					mu.Lock()
					ooms++
					mu.Unlock()
				case err != nil:
					errs <- err
					return
				default:
					live = append(live, p)
				}
				if len(live) > 4 {
					if err := d.Free(live[0]); err != nil {
						errs <- err
						return
					}
					live = live[1:]
				}
				if err := d.SetStreamBusy(s, i%2 == 0); err != nil {
					errs <- err
					return
				}
				e, err := d.RecordEvent(s)
				if err == nil {
					_, err = d.EventDone(e)
				}
				if err == nil && i%3 == 0 {
					err = d.SynchronizeEvent(e)
				}
				if err == nil {
					err = d.ReleaseEvent(e)
				}
				if err == nil {
					err = d.Map(r, 64*KiB)
					if errors.Is(err, device.ErrOutOfMemory) {
						err = nil
					} else if err == nil {
						err = d.Unmap(r, 64*KiB)
					}
				}
				if err == nil && i%50 == 0 {
					var b []byte
					if b, err = d.HostAlloc(4 * KiB); err == nil {
						err = d.HostFree(b)
					}
				}
				if err != nil {
					errs <- err
					return
				}
				_, _, _ = d.MemInfo()
				_ = d.Allocations()
			}
			mu.Lock()
			kept = append(kept, live...)
			mu.Unlock()
			if err := d.Release(r); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}

	allocs := d.Allocations()
	require.Len(t, allocs, len(kept))
	var sum uint64
	for i, r := range allocs {
		if i > 0 {
			require.LessOrEqual(t, allocs[i-1].End(), r.Ptr, "no overlap")
		}
		sum += r.Pages
	}
	c := d.Counters()
	assert.Equal(t, sum, c.BytesInUse)
	assert.Equal(t, int64(workers*rounds-ooms), c.Mallocs)
	assert.Equal(t, int64(ooms), c.FailedMallocs)
	assert.Equal(t, c.Mallocs-int64(len(kept)), c.Frees)
	assert.Equal(t, int64(workers*rounds), c.EventsRecorded)
	assert.Equal(t, c.EventsRecorded, c.EventsReleased)
	assert.Equal(t, c.Maps, c.Unmaps)
	assert.Zero(t, c.MappedBytes)
	assert.Empty(t, d.Reservations())
	for _, p := range kept {
		require.NoError(t, d.Free(p))
	}
	assert.Zero(t, d.BytesInUse())
	d.mu.Lock()
	checkSpace(t, &d.mem)
	assert.Equal(t, 1, d.mem.count, "everything freed merges back into one range")
	d.mu.Unlock()
}
