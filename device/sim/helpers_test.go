// Helpers shared by the package's tests.

package sim

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/gpumem/gpumem/device"
)

const (
	KiB = uint64(1) << 10
	MiB = uint64(1) << 20
	GiB = uint64(1) << 30
)

// newDev returns a device with cfg, free of costs unless cfg sets them.
func newDev(t testing.TB, cfg Config) *Device {
	t.Helper()
	if cfg.Costs == (Costs{}) {
		cfg.Costs = NoCosts()
	}
	d, err := New(cfg)
	require.NoError(t, err)
	return d
}

// tb is what both *testing.T and *rapid.T offer.
type tb interface {
	Helper()
	require.TestingT
}

// state is everything a failed call must leave unchanged.
type state struct {
	Allocs   []Range
	Resv     []Reservation
	Mapped   map[device.Ptr][]Range
	Used     uint64
	Counters Counters // with the failure counters zeroed
	Streams  []streamState
	Events   int
	Host     int
}

func stateOf(d *Device) state {
	s := state{Allocs: d.Allocations(), Resv: d.Reservations(), Mapped: map[device.Ptr][]Range{}, Used: d.BytesInUse()}
	for _, r := range s.Resv {
		s.Mapped[r.Ptr] = d.Mapped(r.Ptr)
	}
	c := d.Counters()
	c.FailedMallocs, c.FailedFrees, c.FailedMaps, c.FailedUnmaps, c.FailedEventQueries = 0, 0, 0, 0, 0
	s.Counters = c
	d.mu.Lock()
	s.Streams = append([]streamState(nil), d.streams...)
	s.Events = len(d.events)
	s.Host = len(d.host)
	d.mu.Unlock()
	return s
}

// checkSpace verifies the treap: address order, merged ranges, maxSize
// and heap order, and that count matches.
func checkSpace(t tb, s *freeSpace) {
	t.Helper()
	var walk func(n *spanNode, lo, hi uint64) (uint64, int)
	walk = func(n *spanNode, lo, hi uint64) (uint64, int) {
		if n == nil {
			return 0, 0
		}
		require.True(t, n.start >= lo && n.start < hi, "node %x out of order", n.start)
		require.NotZero(t, n.size)
		if n.left != nil {
			require.LessOrEqual(t, n.left.prio, n.prio, "heap order")
		}
		if n.right != nil {
			require.LessOrEqual(t, n.right.prio, n.prio, "heap order")
		}
		lm, lc := walk(n.left, lo, n.start)
		rm, rc := walk(n.right, n.start+1, hi)
		require.Equal(t, max(n.size, lm, rm), n.maxSize, "maxSize of %x", n.start)
		return n.maxSize, lc + rc + 1
	}
	_, count := walk(s.root, 0, ^uint64(0))
	require.Equal(t, s.count, count)
	r := s.ranges()
	for i := 1; i < len(r); i++ {
		require.Greater(t, r[i][0], r[i-1][0]+r[i-1][1], "free ranges %d and %d touch or overlap", i-1, i)
	}
}
