package faulty_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpumem/gpumem/allocator"
	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/device/faulty"
	"github.com/gpumem/gpumem/gpumemtest"
)

// TestAllocatorSurvivesMapFailures runs a caching allocator with
// expandable segments over an injector and fails the Map calls that would
// grow its segment: the Alloc fails with the failure's kind of error, the
// allocator's invariants hold, and once the faults stop it works on and
// gives everything back.
func TestAllocatorSurvivesMapFailures(t *testing.T) {
	for _, sentinel := range []error{device.ErrOutOfMemory, nil} {
		t.Run(fmt.Sprint(sentinel), func(t *testing.T) {
			s := newSim(t)
			j := faulty.New(s)
			a := gpumemtest.NewOn(t, j.Device(), gpumemtest.WithConfig(allocator.Config{ExpandableSegments: true}))
			p, err := a.Alloc(mib, device.DefaultStream) // maps the first page
			require.NoError(t, err)
			before := a.Stats()

			add(t, j, faulty.Rule{Call: device.CallMap, Count: faulty.Always, Err: sentinel})
			q, err := a.Alloc(24*mib, device.DefaultStream) // needs pages of its own
			require.Error(t, err)
			assert.Zero(t, q)
			if sentinel != nil {
				require.ErrorIs(t, err, device.ErrOutOfMemory)
				var oom *allocator.OutOfMemoryError
				require.True(t, errors.As(err, &oom), "%v", err)
			} else {
				require.ErrorIs(t, err, faulty.ErrInjected, "a device error other than out of memory comes through")
			}
			require.NotEmpty(t, j.Fired())
			require.NoError(t, a.CheckInvariants())
			after := a.Stats()
			assert.Equal(t, before.AllocatedBytes, after.AllocatedBytes, "the failed Alloc allocated nothing")

			// A single failure: the allocator frees its cache and retries,
			// and the retry maps.
			j.Clear()
			add(t, j, faulty.Rule{Call: device.CallMap, Err: sentinel})
			q, err = a.Alloc(24*mib, device.DefaultStream)
			if sentinel != nil {
				require.NoError(t, err, "retried after freeing the cache")
				require.Len(t, j.Fired(), 1)
			} else if err == nil {
				t.Log("a generic device error was retried too")
			}
			require.NoError(t, a.CheckInvariants())

			j.Clear()
			if q == 0 {
				q, err = a.Alloc(24*mib, device.DefaultStream)
				require.NoError(t, err)
			}
			require.NoError(t, a.Free(p))
			require.NoError(t, a.Free(q))
			require.NoError(t, a.EmptyCache())
			require.NoError(t, a.CheckInvariants())
			assert.Zero(t, s.BytesInUse(), "every page unmapped")
			assert.Zero(t, a.Stats().ReservedBytes[0].Current)
		})
	}
}

// TestAllocatorSurvivesEveryFault fails one call of each kind, at several
// places in a short workload on two streams (with RecordStream), with and
// without expandable segments. After each failed operation the allocator's
// invariants hold; at the end, with the faults stopped, everything freed
// and the cache emptied, the device holds nothing.
func TestAllocatorSurvivesEveryFault(t *testing.T) {
	for _, expandable := range []bool{false, true} {
		for k := range device.NumCalls {
			for _, n := range []int64{1, 2, 4} {
				name := fmt.Sprintf("expandable=%t/%v/%d", expandable, k, n)
				s := newSim(t)
				j := faulty.New(s)
				add(t, j, faulty.Rule{Call: k, Nth: n, Err: device.ErrOutOfMemory})
				add(t, j, faulty.Rule{Call: k, Nth: n + 3})
				a, err := allocator.New(j.Device(), allocator.Config{ExpandableSegments: expandable})
				if err != nil {
					require.ErrorIs(t, err, faulty.ErrInjected, name)
					continue
				}
				side, err := s.NewStream()
				require.NoError(t, err)
				require.NoError(t, s.SetStreamBusy(side, true))
				var live []device.Ptr
				for i, size := range []uint64{512, 3 * mib, 100 << 10, 12 * mib, 2 * mib, 700 << 10, 25 * mib, 1 << 10} {
					if p, err := a.Alloc(size, device.DefaultStream); err == nil {
						live = append(live, p)
						if i%2 == 0 {
							_ = a.RecordStream(p, side)
						}
					}
					require.NoError(t, a.CheckInvariants(), "%s: after alloc %d", name, i)
					if i%3 == 2 && len(live) > 0 {
						_ = a.Free(live[0])
						live = live[1:]
						require.NoError(t, a.CheckInvariants(), "%s: after free", name)
					}
					if i == 5 {
						_ = s.CompleteStream(side)
						_ = a.EmptyCache()
						require.NoError(t, a.CheckInvariants(), "%s: after empty cache", name)
					}
				}
				j.Clear()
				for _, p := range live {
					require.NoError(t, a.Free(p), name)
				}
				require.NoError(t, s.SetStreamBusy(side, false))
				require.NoError(t, a.EmptyCache(), name)
				require.NoError(t, a.CheckInvariants(), name)
				assert.Zero(t, s.BytesInUse(), name)
				assert.Empty(t, s.Allocations(), name)
			}
		}
	}
}
