package allocator_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/gpumem/gpumem/allocator"
	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/device/counting"
	"github.com/gpumem/gpumem/device/faulty"
	"github.com/gpumem/gpumem/device/sim"
	"github.com/gpumem/gpumem/gpumemtest"
	"github.com/gpumem/gpumem/internal/simtest"
)

// writeBytes fills the first n bytes at p with a pattern made of seed,
// through the device's own copies (not counted or failed by a wrapper).
func writeBytes(t testing.TB, d device.Copier, p device.Ptr, n int, seed byte) []byte {
	t.Helper()
	b := make([]byte, n)
	for i := range b {
		b[i] = seed + byte(i%251) | 1
	}
	require.NoError(t, d.CopyFromHost(p, b))
	return b
}

// readBytes returns the n bytes at p.
func readBytes(t testing.TB, d device.Copier, p device.Ptr, n int) []byte {
	t.Helper()
	b := make([]byte, n)
	require.NoError(t, d.CopyToHost(b, p))
	return b
}

// pausable returns an allocator with expandable segments on a simulated
// device of capacity bytes, seen through wrap (nil: the device itself).
func pausable(t *testing.T, capacity uint64, wrap func(device.Device) device.Device) (*allocator.Allocator, *sim.Device) {
	t.Helper()
	inner := simtest.New(t, simtest.Capacity(capacity))
	var dev device.Device = inner
	if wrap != nil {
		dev = wrap(inner)
	}
	return gpumemtest.NewOn(t, dev, gpumemtest.WithConfig(allocator.Config{ExpandableSegments: true})), inner
}

// poolWith makes the pool name on a, allocates sizes in it, in order, on
// stream s, and routes s back to the default pool.
func poolWith(t testing.TB, a *allocator.Allocator, name string, s device.Stream, sizes ...uint64) (*allocator.Pool, []device.Ptr) {
	t.Helper()
	p, err := a.NewPool(name, allocator.PoolOptions{})
	require.NoError(t, err)
	require.NoError(t, a.UsePool(p, s))
	ptrs := make([]device.Ptr, len(sizes))
	for i, n := range sizes {
		ptrs[i], err = a.Alloc(n, s)
		require.NoError(t, err)
	}
	require.NoError(t, a.UseDefaultPool(s))
	return p, ptrs
}

func allocStat(t testing.TB, a *allocator.Allocator, key string) int64 {
	t.Helper()
	v, ok := a.Stats().Get(key)
	require.True(t, ok, key)
	return v
}

// TestPauseResumeKeepsAddressesAndBytes pauses a pool with a backup on
// the simulated device, and on it through the fault injector and the call
// counter (adaptors that offer the copies when the device does): the
// blocks' bytes read back equal after the resume, at the same addresses,
// and while paused the device holds only the default pool's pages (the
// pool's are unmapped: a copy from them fails, their contents are gone).
func TestPauseResumeKeepsAddressesAndBytes(t *testing.T) {
	for _, w := range []struct {
		name string
		wrap func(device.Device) device.Device
	}{
		{"sim", nil},
		{"faulty", func(d device.Device) device.Device { return faulty.New(d).Device() }},
		{"counting", func(d device.Device) device.Device { return counting.New(d).Device() }},
	} {
		t.Run(w.name, func(t *testing.T) { testPauseResumeKeepsAddressesAndBytes(t, w.wrap) })
	}
}

func testPauseResumeKeepsAddressesAndBytes(t *testing.T, wrap func(device.Device) device.Device) {
	a, inner := pausable(t, 1<<30, wrap)
	side, err := inner.NewStream()
	require.NoError(t, err)
	p, err := a.NewPool("weights", allocator.PoolOptions{})
	require.NoError(t, err)
	require.NoError(t, a.UsePool(p, side))
	sizes := []uint64{3 << 20, 512, 50 << 20}
	var ptrs []device.Ptr
	var want [][]byte
	for i, n := range sizes {
		q, err := a.Alloc(n, side)
		require.NoError(t, err)
		ptrs = append(ptrs, q)
		want = append(want, writeBytes(t, inner, q, int(min(n, 4096)), byte(i*40)))
	}
	gone, err := a.Alloc(1<<20, side) // freed before the pause: its pages go
	require.NoError(t, err)
	require.NoError(t, a.Free(gone))
	require.NoError(t, a.UseDefaultPool(side))
	d, err := a.Alloc(8<<20, 0)
	require.NoError(t, err)
	require.NoError(t, a.CheckInvariants())
	before, err := a.PoolStats(p)
	require.NoError(t, err)
	defReserved := allocStat(t, a, "reserved_bytes.all.current") - int64(before.ReservedBytes)

	require.NoError(t, a.PausePool(p, true))
	require.NoError(t, a.CheckInvariants())
	require.True(t, p.Paused())
	// The pool counts in no stat; the device holds only the default pool's
	// pages.
	require.Equal(t, defReserved, allocStat(t, a, "reserved_bytes.all.current"))
	require.Equal(t, int64(8<<20), allocStat(t, a, "allocated_bytes.all.current"))
	require.Equal(t, uint64(defReserved), inner.BytesInUse())
	require.Equal(t, uint64(defReserved), inner.Counters().MappedBytes, "only the default pool's pages are mapped")
	for _, q := range ptrs {
		require.ErrorIs(t, inner.CopyToHost(make([]byte, 1), q), device.ErrInvalidPointer, "the page under %v is unmapped", q)
	}
	require.Zero(t, inner.ContentPages(), "the pool's bytes are in host memory only")
	c := inner.Counters()
	require.Equal(t, int64(len(ptrs)), c.HostAllocs-c.HostFrees, "one host copy per live block")
	ps, err := a.PoolStats(p)
	require.NoError(t, err)
	require.True(t, ps.Paused)
	// A paused pool's blocks stay live but cannot be freed, and the pool
	// cannot be routed to, released or paused again.
	require.ErrorContains(t, a.Free(ptrs[0]), "paused")
	require.ErrorContains(t, a.RecordStream(ptrs[0], 0), "paused")
	require.ErrorContains(t, a.UsePool(p, side), "paused")
	require.ErrorContains(t, a.ReleasePool(p), "paused")
	require.ErrorContains(t, a.PausePool(p, false), "paused")
	require.NoError(t, a.CheckInvariants())

	require.NoError(t, a.ResumePool(p))
	require.NoError(t, a.CheckInvariants())
	require.False(t, p.Paused())
	after, err := a.PoolStats(p)
	require.NoError(t, err)
	require.Equal(t, before.AllocatedBytes, after.AllocatedBytes)
	require.Equal(t, uint64(defReserved)+after.ReservedBytes, uint64(allocStat(t, a, "reserved_bytes.all.current")))
	for i, q := range ptrs {
		require.Equal(t, want[i], readBytes(t, inner, q, len(want[i])), "block %d's bytes", i)
	}
	require.ErrorContains(t, a.ResumePool(p), "not paused")
	for _, q := range append(ptrs, d) {
		require.NoError(t, a.Free(q))
	}
	require.NoError(t, a.ReleasePool(p))
	require.NoError(t, a.EmptyCache())
	require.Zero(t, inner.BytesInUse())
	c = inner.Counters()
	require.Equal(t, c.HostAllocs, c.HostFrees, "host copies freed")
}

func TestPauseWithoutBackupLosesTheBytes(t *testing.T) {
	a, inner := pausable(t, 1<<30, nil)
	p, ptrs := poolWith(t, a, "kv", 0, 4<<20)
	q := ptrs[0]
	writeBytes(t, inner, q, 64, 7)
	require.NoError(t, a.PausePool(p, false))
	require.NoError(t, a.ResumePool(p))
	require.Equal(t, make([]byte, 64), readBytes(t, inner, q, 64), "fresh pages")
	require.NoError(t, a.Free(q))
}

// TestPauseFreesRoomAndResumeRunsTheLadder: 6 GiB live in a paused pool
// leave room for 6 GiB elsewhere on an 8 GiB device; resuming while they
// are live fails with an out-of-memory error and leaves the pool paused;
// once they are freed (and cached) the resume releases the cache and
// maps the pool at the same addresses.
func TestPauseFreesRoomAndResumeRunsTheLadder(t *testing.T) {
	a, inner := pausable(t, 8<<30, nil)
	p, ptrs := poolWith(t, a, "model", 0, slices.Repeat([]uint64{1 << 30}, 6)...)
	_, err := a.Alloc(6<<30, 0)
	require.ErrorIs(t, err, device.ErrOutOfMemory)
	require.NoError(t, a.PausePool(p, false))
	other, err := a.Alloc(6<<30, 0)
	require.NoError(t, err)
	ooms := allocStat(t, a, "num_ooms")
	err = a.ResumePool(p)
	var oom *allocator.OutOfMemoryError
	require.ErrorAs(t, err, &oom)
	require.Equal(t, ooms+1, allocStat(t, a, "num_ooms"))
	require.True(t, p.Paused())
	require.NoError(t, a.CheckInvariants())
	require.NoError(t, a.Free(other)) // cached: the resume's ladder releases it
	// But not while a capture is underway.
	g, err := a.NewPool("graph", allocator.PoolOptions{})
	require.NoError(t, err)
	side, err := inner.NewStream()
	require.NoError(t, err)
	require.NoError(t, a.BeginCapture(g, side))
	frees := allocStat(t, a, "num_device_free")
	require.ErrorIs(t, a.ResumePool(p), device.ErrOutOfMemory)
	require.Equal(t, frees, allocStat(t, a, "num_device_free"))
	require.True(t, p.Paused())
	require.NoError(t, a.EndCapture(side))
	require.NoError(t, a.ReleasePool(g))
	require.NoError(t, a.ResumePool(p))
	require.NoError(t, a.CheckInvariants())
	for _, q := range ptrs {
		require.NoError(t, a.Free(q), "the same addresses are live")
	}
	require.NoError(t, a.ReleasePool(p))
	require.NoError(t, a.EmptyCache())
	require.Zero(t, inner.BytesInUse())
}

func TestPauseBadInputChangesNothing(t *testing.T) {
	// A device without virtual memory: no pages to unmap.
	inner := simtest.New(t, simtest.Capacity(1<<30))
	noVM := device.Compose(inner, device.Capabilities{HostMemory: inner, StreamChecker: inner, Copier: inner})
	a := gpumemtest.NewOn(t, noVM)
	p, live := poolWith(t, a, "p", 0, 1<<20)
	require.ErrorIs(t, a.PausePool(p, false), device.ErrNotSupported)
	require.ErrorContains(t, a.PausePool(p, false), "needs a device with virtual memory")
	require.False(t, p.Paused())
	require.NoError(t, a.Free(live[0]))

	// Backup without a device that copies.
	noCopy := device.Compose(inner, device.Capabilities{VirtualMemory: inner, HostMemory: inner, StreamChecker: inner})
	b := gpumemtest.NewOn(t, noCopy, gpumemtest.WithConfig(allocator.Config{ExpandableSegments: true}))
	q, err := b.NewPool("q", allocator.PoolOptions{})
	require.NoError(t, err)
	require.ErrorIs(t, b.PausePool(q, true), device.ErrNotSupported)
	require.NoError(t, b.UsePool(q, 0))
	require.ErrorContains(t, b.PausePool(q, false), "in use")
	require.NoError(t, b.UseDefaultPool(0))
	require.ErrorContains(t, b.ResumePool(q), "not paused")
	require.NoError(t, b.CheckInvariants())
	require.False(t, q.Paused())

	// Blocks whose free waits for stream events.
	c, inner2 := pausable(t, 1<<30, nil)
	side, err := inner2.NewStream()
	require.NoError(t, err)
	require.NoError(t, inner2.SetStreamBusy(side, true))
	r, x := poolWith(t, c, "r", 0, 1<<20)
	require.NoError(t, c.RecordStream(x[0], side))
	require.NoError(t, c.Free(x[0]))
	require.ErrorContains(t, c.PausePool(r, true), "wait for stream events")
	require.NoError(t, c.CheckInvariants())
	g, err := c.NewPool("g", allocator.PoolOptions{})
	require.NoError(t, err)
	require.NoError(t, c.BeginCapture(g, side))
	require.ErrorContains(t, c.PausePool(r, false), "capture is underway")
	require.NoError(t, c.EndCapture(side))
	require.NoError(t, inner2.SynchronizeStream(side))
	require.NoError(t, c.EmptyCache())
	require.NoError(t, c.PausePool(r, true))
	require.NoError(t, c.ResumePool(r))
}

// pauseCalls are the device calls pausing and resuming make, each failed
// at every point of the matrix.
var pauseCalls = []device.Call{
	device.CallSynchronizeStream, device.CallMap, device.CallUnmap, device.CallReserve,
	device.CallRelease, device.CallHostAlloc, device.CallHostFree, device.CallMemInfo,
	device.CallRecordEvent, device.CallEventDone, device.CallReleaseEvent,
	device.CallCopyToHost, device.CallCopyFromHost, device.CallMalloc, device.CallFree,
}

// TestFaultMatrixPauseResume fails each device call pausing and resuming
// make, at a spread of points, over a workload that pauses (with a backup)
// and resumes a pool three times with the default pool allocating in
// between, with expandable segments and with plain ones (a named pool's
// then reserved and mapped whole); and fails the copies to and from the
// host too. After every
// failure the invariants hold and the pool is paused or not as a whole
// (its blocks' bytes, when not paused, are those written); at the end,
// with everything freed, the pool released and the cache emptied, the
// device holds nothing: no memory, no reservation, no host memory.
func TestFaultMatrixPauseResume(t *testing.T) {
	fired := map[string]int{}
	type point struct {
		call device.Call
		n    int
	}
	var points []point
	for _, c := range pauseCalls {
		for _, n := range []int{1, 2, 3, 5, 8, 13} {
			points = append(points, point{c, n})
		}
	}
	for _, pt := range points {
		for _, expandable := range []bool{true, false} {
			name := pt.call.String()
			t.Run(fmt.Sprintf("%s/%d/expandable=%v", name, pt.n, expandable), func(t *testing.T) {
				inner := simtest.New(t, simtest.Capacity(1<<30))
				j := faulty.New(inner)
				a := gpumemtest.NewOn(t, j.Device(), gpumemtest.WithConfig(allocator.Config{ExpandableSegments: expandable}))
				side, err := inner.NewStream()
				require.NoError(t, err)
				require.NoError(t, inner.SetStreamBusy(side, true))
				p, err := a.NewPool("p", allocator.PoolOptions{})
				require.NoError(t, err)
				require.NoError(t, a.UsePool(p, 0))
				var ptrs []device.Ptr
				var want [][]byte
				for i, n := range []uint64{30 << 20, 5 << 20, 4096, 10 << 20} {
					q, err := a.Alloc(n, 0)
					require.NoError(t, err)
					ptrs = append(ptrs, q)
					want = append(want, writeBytes(t, inner, q, 256, byte(i*50)))
				}
				tmp, err := a.Alloc(40<<20, 0)
				require.NoError(t, err)
				require.NoError(t, a.Free(tmp))
				require.NoError(t, a.UseDefaultPool(0))
				_, err = j.Add(faulty.Rule{Call: pt.call, Nth: int64(pt.n), Err: []error{device.ErrOutOfMemory, nil}[pt.n%2]})
				require.NoError(t, err)
				check := func(what string) {
					t.Helper()
					require.NoError(t, a.CheckInvariants(), what)
					if !p.Paused() {
						for i, q := range ptrs {
							require.Equal(t, want[i], readBytes(t, inner, q, 256), "%s: block %d's bytes", what, i)
						}
					}
				}
				var others []device.Ptr
				for round := range 3 {
					if err := a.PausePool(p, true); err != nil {
						check(fmt.Sprintf("round %d: a failed pause (%v)", round, err))
					}
					if o, err := a.Alloc(uint64(20+round*10)<<20, 0); err == nil {
						others = append(others, o)
						d, err := a.Alloc(1<<20, 0)
						if err == nil {
							require.NoError(t, a.RecordStream(d, side))
							_ = a.Free(d)
						}
					}
					if len(others) > 1 {
						_ = a.Free(others[0])
						others = others[1:]
					}
					require.NoError(t, inner.SynchronizeStream(side))
					require.NoError(t, inner.SetStreamBusy(side, true))
					for range 3 { // the one fault may fire in a resume
						if !p.Paused() {
							break
						}
						if err := a.ResumePool(p); err != nil {
							check(fmt.Sprintf("round %d: a failed resume (%v)", round, err))
						}
					}
					require.False(t, p.Paused())
					check(fmt.Sprintf("round %d", round))
				}
				for _, q := range append(ptrs, others...) {
					require.NoError(t, a.Free(q))
				}
				require.NoError(t, inner.Synchronize())
				if err := a.ReleasePool(p); err != nil { // the fault fired there: EmptyCache returns the rest
					require.NoError(t, a.CheckInvariants(), "a failed release (%v)", err)
				}
				for range 3 {
					if err = a.EmptyCache(); err == nil {
						break
					}
				}
				require.NoError(t, err)
				require.NoError(t, a.CheckInvariants())
				require.Zero(t, inner.BytesInUse(), "device memory left")
				require.Empty(t, inner.Reservations(), "reservations left")
				c := inner.Counters()
				require.Equal(t, c.HostAllocs, c.HostFrees, "host memory left")
				require.Zero(t, c.HostBytesInUse)
				if len(j.Fired()) > 0 {
					fired[name]++
				}
			})
		}
	}
	for _, c := range []string{"map", "unmap", "synchronize stream", "host alloc", "host free", "copy to host", "copy from host"} {
		require.Positive(t, fired[c], "no %s fault fired: the matrix does not reach it", c)
	}
	t.Logf("faults fired: %v", fired)
}

// TestPausePoolWithoutExpandableSegments pauses, with a backup, a pool of
// an allocator with plain segments on a device with virtual memory: the
// pool's segments are reserved and mapped whole (the default pool's are
// allocated, as PyTorch's), and have a plain segment's sizes and counts;
// the pause returns their pages, the resume maps them at the same
// addresses with the bytes of before.
func TestPausePoolWithoutExpandableSegments(t *testing.T) {
	inner := simtest.New(t, simtest.Capacity(1<<30))
	a := gpumemtest.NewOn(t, inner)
	d, err := a.Alloc(8<<20, 0)
	require.NoError(t, err)
	c := inner.Counters()
	require.Equal(t, int64(1), c.Mallocs, "the default pool allocates")
	require.Zero(t, c.Reserves)

	side, err := inner.NewStream()
	require.NoError(t, err)
	sizes := []uint64{512, 3 << 20, 50 << 20}
	p, ptrs := poolWith(t, a, "weights", side, sizes...)
	var want [][]byte
	for i, q := range ptrs {
		want = append(want, writeBytes(t, inner, q, int(min(sizes[i], 4096)), byte(i*30)))
	}
	c = inner.Counters()
	require.Equal(t, int64(1), c.Mallocs, "the pool maps")
	require.Equal(t, int64(3), c.Reserves)
	require.Equal(t, uint64(2<<20+20<<20+50<<20), c.MappedBytes, "a plain segment's sizes: 2 MiB, 20 MiB, 50 MiB")
	before, err := a.PoolStats(p)
	require.NoError(t, err)
	require.Equal(t, c.MappedBytes, before.ReservedBytes)
	require.Equal(t, int64(4), allocStat(t, a, "num_device_alloc"))
	require.Equal(t, int64(4), allocStat(t, a, "segment.all.current"))
	require.NoError(t, a.CheckInvariants())

	require.NoError(t, a.PausePool(p, true))
	require.NoError(t, a.CheckInvariants())
	require.Equal(t, uint64(20<<20), inner.BytesInUse(), "only the default pool's segment")
	require.Zero(t, inner.Counters().MappedBytes)
	require.Len(t, inner.Reservations(), 3, "the addresses are kept")
	require.NoError(t, a.ResumePool(p))
	require.NoError(t, a.CheckInvariants())
	for i, q := range ptrs {
		require.Equal(t, want[i], readBytes(t, inner, q, len(want[i])), "block %d's bytes", i)
	}
	after, err := a.PoolStats(p)
	require.NoError(t, err)
	require.Equal(t, before.ReservedBytes, after.ReservedBytes)
	require.Equal(t, before.AllocatedBytes, after.AllocatedBytes)

	for _, q := range append(ptrs, d) {
		require.NoError(t, a.Free(q))
	}
	require.NoError(t, a.ReleasePool(p))
	require.NoError(t, a.EmptyCache())
	require.NoError(t, a.CheckInvariants())
	require.Zero(t, inner.BytesInUse())
	require.Empty(t, inner.Reservations(), "the mapped segments' ranges are released")
}

// cumulative returns the stats' cumulative figures (the keys ending in
// .allocated or .freed).
func cumulative(a *allocator.Allocator) map[string]int64 {
	out := map[string]int64{}
	for k, v := range a.Stats().Entries() {
		if strings.HasSuffix(k, ".allocated") || strings.HasSuffix(k, ".freed") {
			out[k] = v
		}
	}
	return out
}

// TestPauseIsNeitherFreeingNorAllocating: the cumulative figures
// (allocation and free counts and bytes, segments, reserved bytes) count a
// pause as no free and a resume as no allocation, while the current
// allocated and reserved bytes drop while paused and come back; so do the
// phase counts of the pool's blocks, which leave the phase while paused.
// The device calls of the pause and resume count in num_device_free and
// num_device_alloc, as they are made.
func TestPauseIsNeitherFreeingNorAllocating(t *testing.T) {
	for _, expandable := range []bool{true, false} {
		t.Run(fmt.Sprintf("expandable=%v", expandable), func(t *testing.T) {
			inner := simtest.New(t, simtest.Capacity(1<<30))
			a := gpumemtest.NewOn(t, inner, gpumemtest.WithConfig(allocator.Config{ExpandableSegments: expandable}))
			a.SetPhase("load")
			d, err := a.Alloc(4<<20, 0)
			require.NoError(t, err)
			p, ptrs := poolWith(t, a, "weights", 0, 512, 3<<20, 30<<20)
			a.SetPhase("serve")
			before := cumulative(a)
			phases := a.PhaseStats()
			cur := a.Stats()
			devFrees := allocStat(t, a, "num_device_free")

			require.NoError(t, a.PausePool(p, false))
			require.Equal(t, before, cumulative(a), "a pause frees nothing")
			require.Equal(t, int64(4<<20), a.Stats().AllocatedBytes[0].Current)
			require.Less(t, a.Stats().ReservedBytes[0].Current, cur.ReservedBytes[0].Current)
			require.Greater(t, allocStat(t, a, "num_device_free"), devFrees, "the unmaps are device frees")
			ph := a.PhaseStats()
			require.Len(t, ph, 1)
			require.Equal(t, "load", ph[0].Name)
			require.Equal(t, int64(4<<20), ph[0].AllocatedBytes.Current, "the paused blocks leave their phase")
			require.Equal(t, phases[0].AllocatedBytes.Allocated, ph[0].AllocatedBytes.Allocated)
			require.Equal(t, phases[0].AllocatedBytes.Freed, ph[0].AllocatedBytes.Freed)
			require.Equal(t, phases[0].Allocations.Freed, ph[0].Allocations.Freed)
			require.NoError(t, a.CheckInvariants())

			require.NoError(t, a.ResumePool(p))
			require.Equal(t, before, cumulative(a), "a resume allocates nothing")
			require.Equal(t, cur.AllocatedBytes, a.Stats().AllocatedBytes)
			require.Equal(t, cur.ReservedBytes, a.Stats().ReservedBytes)
			require.Equal(t, phases, a.PhaseStats())
			require.NoError(t, a.CheckInvariants())

			for _, q := range append(ptrs, d) {
				require.NoError(t, a.Free(q))
			}
			after := cumulative(a)
			require.Equal(t, after["allocation.all.allocated"], after["allocation.all.freed"])
			require.Equal(t, after["allocated_bytes.all.allocated"], after["allocated_bytes.all.freed"])
		})
	}
}
