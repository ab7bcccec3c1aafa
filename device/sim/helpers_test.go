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

// The simulated device offers every capability.
var (
	_ device.Device        = (*Device)(nil)
	_ device.VirtualMemory = (*Device)(nil)
	_ device.HostMemory    = (*Device)(nil)
	_ device.StreamChecker = (*Device)(nil)
	_ device.UsageReporter = (*Device)(nil)
	_ device.StreamWaiter  = (*Device)(nil)
	_ device.Copier        = (*Device)(nil)

	_ device.StreamOrderedMemory = (*Device)(nil)
)

// tb is what both *testing.T and *rapid.T offer.
type tb interface {
	Helper()
	require.TestingT
}

// mustNew returns a device with cfg as given (default costs if unset).
func mustNew(t tb, cfg Config) *Device {
	t.Helper()
	d, err := New(cfg)
	require.NoError(t, err)
	return d
}

// newDev returns a device with cfg, free of costs unless cfg sets them.
func newDev(t tb, cfg Config) *Device {
	t.Helper()
	if cfg.Costs == (Costs{}) {
		cfg.Costs = NoCosts()
	}
	return mustNew(t, cfg)
}

func mustMalloc(t tb, d *Device, size uint64) device.Ptr {
	t.Helper()
	p, err := d.Malloc(size)
	require.NoError(t, err)
	return p
}

// mallocPages allocates one range a size, each given in pages of the
// device, in order, and returns their addresses.
func mallocPages(t tb, d *Device, pages ...uint64) []device.Ptr {
	t.Helper()
	ps := make([]device.Ptr, len(pages))
	for i, n := range pages {
		ps[i] = mustMalloc(t, d, n*d.PageSize())
	}
	return ps
}

// mustFree frees the ranges, in order.
func mustFree(t tb, d *Device, ps ...device.Ptr) {
	t.Helper()
	for _, p := range ps {
		require.NoError(t, d.Free(p))
	}
}

// requireDeviceError checks that err is a *device.Error of operation op on
// the given device, wrapping sentinel, with a message.
func requireDeviceError(t tb, err error, op string, ordinal int, sentinel error) {
	t.Helper()
	require.ErrorIs(t, err, sentinel)
	var de *device.Error
	require.ErrorAs(t, err, &de)
	require.Equal(t, op, de.Op)
	require.Equal(t, ordinal, de.Device)
	require.Equal(t, sentinel, de.Err)
	require.NotEmpty(t, de.Message)
	require.Contains(t, err.Error(), op)
}

// state is everything a failed call must leave unchanged. It is read
// without costing or counting anything.
type state struct {
	Allocs   []Range
	Resv     []Reservation
	Mapped   map[device.Ptr][]Range
	Used     uint64
	Counters Counters
	Streams  []streamState // queue positions and busy flags, per stream
	Events   int
	Host     int
	Pool     []PoolChunkInfo
	Usage    device.PoolUsage
	Content  int
}

func stateOf(d *Device) state {
	s := state{Allocs: d.Allocations(), Resv: d.Reservations(), Mapped: map[device.Ptr][]Range{}, Used: d.BytesInUse()}
	for _, r := range s.Resv {
		s.Mapped[r.Ptr] = d.Mapped(r.Ptr)
	}
	s.Counters = d.Counters()
	s.Pool = d.PoolChunks()
	s.Usage, _ = d.PoolUsage()
	s.Content = d.ContentPages()
	d.mu.Lock()
	s.Streams = append([]streamState(nil), d.streams...)
	s.Events = d.events.len()
	s.Host = len(d.host)
	d.mu.Unlock()
	return s
}

// requireUnchanged checks that nothing moved on d since before except the
// failure counters, which must have moved as failed says (nil: not at
// all).
func requireUnchanged(t tb, d *Device, before state, failed func(c *Counters)) {
	t.Helper()
	if failed != nil {
		failed(&before.Counters)
	}
	require.Equal(t, before, stateOf(d))
}

func failedMalloc(c *Counters) { c.FailedMallocs++ }
func failedFree(c *Counters)   { c.FailedFrees++ }
func failedMap(c *Counters)    { c.FailedMaps++ }
func failedUnmap(c *Counters)  { c.FailedUnmaps++ }

// failedEventQueries returns a counter change of n failed event queries.
func failedEventQueries(n int64) func(c *Counters) {
	return func(c *Counters) { c.FailedEventQueries += n }
}

func eventDone(t tb, d *Device, e device.Event) bool {
	t.Helper()
	done, err := d.EventDone(e)
	require.NoError(t, err)
	return done
}

func pending(t tb, d *Device, s device.Stream) uint64 {
	t.Helper()
	n, err := d.PendingWork(s)
	require.NoError(t, err)
	return n
}

// busyStream returns a device with a busy stream and two pending events on
// it, recorded in order.
func busyStream(t *testing.T) (*Device, device.Stream, device.Event, device.Event) {
	t.Helper()
	d := newDev(t, Config{Capacity: GiB})
	s, err := d.NewStream()
	require.NoError(t, err)
	require.NoError(t, d.SetStreamBusy(s, true))
	e1, err := d.RecordEvent(s)
	require.NoError(t, err)
	e2, err := d.RecordEvent(s)
	require.NoError(t, err)
	require.False(t, eventDone(t, d, e1))
	require.False(t, eventDone(t, d, e2))
	require.Equal(t, uint64(2), pending(t, d, s))
	return d, s, e1, e2
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
