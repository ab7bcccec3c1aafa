package allocator

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/gpumem/gpumem/device"
)

// poolStats returns p's figures, failing the test on an error.
func poolStats(t testing.TB, a *Allocator, p *Pool) PoolStats {
	t.Helper()
	ps, err := a.PoolStats(p)
	require.NoError(t, err)
	return ps
}

// segmentPool returns the pool id the snapshot gives the segment holding
// ptr, or -1 if no segment holds it.
func segmentPool(a *Allocator, ptr device.Ptr) int64 {
	for _, s := range a.Snapshot() {
		if ptr >= s.Ptr && uint64(ptr-s.Ptr) < s.Size {
			return int64(s.PoolID)
		}
	}
	return -1
}

func TestPoolServesOnlyItsRoutes(t *testing.T) {
	a, dev := newTest(t, 1<<30, Config{})
	s1, err := dev.NewStream()
	require.NoError(t, err)
	kv := mustPool(t, a, "kv", PoolOptions{})
	require.Equal(t, uint64(1), kv.ID())

	// A block freed in the default pool does not serve the pool.
	d := mustAlloc(t, a, 1<<20, device.DefaultStream)
	mustFree(t, a, d)
	require.NoError(t, a.UsePool(kv, device.DefaultStream))
	p := mustAlloc(t, a, 1<<20, device.DefaultStream)
	require.NotEqual(t, d, p, "the pool took the default pool's cached block")
	require.Equal(t, int64(1), segmentPool(a, p))
	require.Equal(t, int64(0), segmentPool(a, d))
	// Other streams still allocate in the default pool.
	q := mustAlloc(t, a, 1<<20, s1)
	require.Equal(t, int64(0), segmentPool(a, q))

	ps := poolStats(t, a, kv)
	require.Equal(t, uint64(1<<20), ps.AllocatedBytes)
	require.Equal(t, uint64(2<<20), ps.ReservedBytes) // one small segment
	require.Equal(t, uint64(2<<20), ps.PeakReservedBytes)
	require.Equal(t, 1, ps.Segments)

	// Back in the default pool, the pool's freed block does not serve it.
	mustFree(t, a, p)
	require.NoError(t, a.UseDefaultPool(device.DefaultStream))
	d2 := mustAlloc(t, a, 1<<20, device.DefaultStream)
	require.Equal(t, d, d2, "the default pool's cached block serves it again")
	require.Equal(t, int64(0), segmentPool(a, d2))
	mustFree(t, a, d2, q)

	// EmptyCache leaves a live pool's segments alone.
	require.NoError(t, a.EmptyCache())
	require.NoError(t, a.CheckInvariants())
	ps = poolStats(t, a, kv)
	require.Equal(t, uint64(2<<20), ps.ReservedBytes)
	require.Equal(t, uint64(0), ps.AllocatedBytes)
	require.Equal(t, int64(2<<20), get(t, a, "reserved_bytes.all.current"))

	// Releasing it returns them.
	require.NoError(t, a.ReleasePool(kv))
	require.NoError(t, a.CheckInvariants())
	require.Equal(t, int64(0), get(t, a, "reserved_bytes.all.current"))
	_, err = a.PoolStats(kv)
	require.ErrorContains(t, err, "released")
	require.Empty(t, a.Pools())
}

func TestPoolReleasedWithLiveBlocksGoesWithTheLast(t *testing.T) {
	a, _ := newTest(t, 1<<30, Config{})
	g := mustPool(t, a, "graph", PoolOptions{})
	require.NoError(t, a.UsePool(g, device.DefaultStream))
	x := mustAlloc(t, a, 30<<20, device.DefaultStream)
	y := mustAlloc(t, a, 4<<10, device.DefaultStream)
	require.NoError(t, a.UseDefaultPool(device.DefaultStream))
	z := mustAlloc(t, a, 4<<10, device.DefaultStream)

	require.NoError(t, a.ReleasePool(g))
	require.NoError(t, a.CheckInvariants())
	require.Equal(t, int64(30<<20+2<<20+2<<20), get(t, a, "reserved_bytes.all.current"))
	require.ErrorContains(t, a.ReleasePool(g), "released", "releasing twice")
	require.ErrorContains(t, a.UsePool(g, device.DefaultStream), "released")
	// The name is free again.
	g2 := mustPool(t, a, "graph", PoolOptions{})
	require.Equal(t, uint64(2), g2.ID())

	mustFree(t, a, x) // its segment goes now: nothing else of it is busy
	require.Equal(t, int64(2<<20+2<<20), get(t, a, "reserved_bytes.all.current"))
	mustFree(t, a, y) // the last: the pool is gone
	require.Equal(t, int64(2<<20), get(t, a, "reserved_bytes.all.current"))
	require.Equal(t, []*Pool{g2}, a.Pools())

	// The shards of the pool gone serve the next pool's stream.
	require.NoError(t, a.UsePool(g2, device.DefaultStream))
	w := mustAlloc(t, a, 4<<10, device.DefaultStream)
	require.Equal(t, int64(2), segmentPool(a, w))
	require.NoError(t, a.UseDefaultPool(device.DefaultStream))
	mustFree(t, a, w, z)
	n := len(a.shards)
	require.NoError(t, a.ReleasePool(g2))
	require.Equal(t, n, len(a.shards), "an idle shard was reused, none added")
	require.Equal(t, int64(2<<20), get(t, a, "reserved_bytes.all.current"))
}

func TestPoolNoSplit(t *testing.T) {
	a, _ := newTest(t, 1<<30, Config{})
	p := mustPool(t, a, "whole", PoolOptions{NoSplit: true})
	require.NoError(t, a.UsePool(p, device.DefaultStream))
	x := mustAlloc(t, a, 4<<10, device.DefaultStream)
	// The whole 2 MiB segment is the block.
	require.Equal(t, uint64(2<<20), poolStats(t, a, p).AllocatedBytes)
	require.Equal(t, int64(0), get(t, a, "inactive_split.all.current"))
	y := mustAlloc(t, a, 4<<10, device.DefaultStream)
	require.Equal(t, 2, poolStats(t, a, p).Segments)
	mustFree(t, a, x)
	z := mustAlloc(t, a, 512, device.DefaultStream)
	require.Equal(t, x, z, "the whole cached block serves the next request")
	require.Equal(t, int64(512), get(t, a, "requested_bytes.all.current")-4<<10)
	require.NoError(t, a.UseDefaultPool(device.DefaultStream))
	mustFree(t, a, y, z)
	require.NoError(t, a.ReleasePool(p))
}

func TestPoolUseOnOOM(t *testing.T) {
	for _, lend := range []bool{false, true} {
		a, _ := newTest(t, 64<<20, Config{})
		p := mustPool(t, a, "spare", PoolOptions{UseOnOOM: lend})
		require.NoError(t, a.UsePool(p, device.DefaultStream))
		x := mustAlloc(t, a, 60<<20, device.DefaultStream)
		mustFree(t, a, x)
		require.NoError(t, a.UseDefaultPool(device.DefaultStream))
		// The device has 4 MiB left: the default pool cannot get 30 MiB
		// but from the pool, whose 60 MiB block is cached.
		ooms := get(t, a, "num_ooms")
		y, err := a.Alloc(30<<20, device.DefaultStream)
		if !lend {
			require.ErrorIs(t, err, device.ErrOutOfMemory)
			require.Equal(t, ooms+1, get(t, a, "num_ooms"))
			require.NoError(t, a.CheckInvariants())
			continue
		}
		require.NoError(t, err)
		require.NoError(t, a.CheckInvariants())
		require.Equal(t, x, y)
		require.Equal(t, ooms, get(t, a, "num_ooms"), "no out of memory is counted")
		require.Equal(t, int64(1), segmentPool(a, y), "the block stays the pool's")
		require.Equal(t, uint64(30<<20), poolStats(t, a, p).AllocatedBytes)
		mustFree(t, a, y)
	}
}

func TestPoolBadInputChangesNothing(t *testing.T) {
	a, dev := newTest(t, 1<<30, Config{})
	other, _ := newTest(t, 1<<30, Config{})
	p := mustPool(t, a, "p", PoolOptions{})
	foreign := mustPool(t, other, "f", PoolOptions{})
	s1, err := dev.NewStream()
	require.NoError(t, err)
	for _, name := range []string{"", "-", "a b", "tab\t", "p"} {
		_, err := a.NewPool(name, PoolOptions{})
		require.Error(t, err, "name %q", name)
	}
	require.ErrorContains(t, a.UsePool(nil, 0), "nil pool")
	require.ErrorContains(t, a.UsePool(foreign, 0), "another allocator")
	require.ErrorIs(t, a.UsePool(p, 12345), device.ErrInvalidStream)
	require.ErrorContains(t, a.UseDefaultPool(s1), "not routed")
	require.NoError(t, a.UsePool(p, s1))
	require.ErrorContains(t, a.UsePool(p, s1), "already routed")
	require.ErrorContains(t, a.ReleasePool(p), "in use")
	require.ErrorContains(t, a.ReleasePool(foreign), "another allocator")
	_, err = a.PoolStats(foreign)
	require.Error(t, err)
	require.NoError(t, a.CheckInvariants())
	require.Equal(t, []*Pool{p}, a.Pools())
	require.Same(t, p, a.PoolNamed("p"))
	require.Nil(t, a.PoolNamed("q"))

	var zero Allocator
	_, err = zero.NewPool("x", PoolOptions{})
	require.ErrorIs(t, err, errNotMade)
	require.ErrorIs(t, zero.UsePool(p, 0), errNotMade)

	pol, _ := newTest(t, 1<<30, Config{Policy: PolicyLowFragmentation})
	_, err = pol.NewPool("x", PoolOptions{})
	require.ErrorContains(t, err, "faithful policy")
}

// TestPoolsOnManyStreams routes streams with shards of their own and
// streams of the cold shard to pools, with expandable segments and
// without, and checks that blocks stay in their pools.
func TestPoolsOnManyStreams(t *testing.T) {
	for _, exp := range []bool{false, true} {
		a, dev := newTest(t, 4<<30, Config{ExpandableSegments: exp})
		p := mustPool(t, a, "p", PoolOptions{})
		var ptrs []device.Ptr
		for i := range maxShards + 4 {
			s, err := dev.NewStream()
			require.NoError(t, err)
			ptrs = append(ptrs, mustAlloc(t, a, 3<<20, s)) // default pool
			if i%3 == 0 {
				require.NoError(t, a.UsePool(p, s))
				q := mustAlloc(t, a, 3<<20, s)
				require.Equal(t, int64(1), segmentPool(a, q))
				ptrs = append(ptrs, q)
				require.NoError(t, a.UseDefaultPool(s))
			}
		}
		require.Equal(t, uint64(12*3<<20), poolStats(t, a, p).AllocatedBytes)
		mustFree(t, a, ptrs...)
		require.NoError(t, a.EmptyCache())
		require.NotZero(t, poolStats(t, a, p).ReservedBytes)
		require.Equal(t, int64(poolStats(t, a, p).ReservedBytes), get(t, a, "reserved_bytes.all.current"))
		require.NoError(t, a.ReleasePool(p))
		require.Equal(t, int64(0), get(t, a, "reserved_bytes.all.current"))
	}
}

func TestNilPoolIsSafe(t *testing.T) {
	var p *Pool
	require.Equal(t, "", p.Name())
	require.Zero(t, p.ID())
	require.Equal(t, PoolOptions{}, p.Options())
	require.False(t, p.Paused())
	var zero Pool
	require.False(t, zero.Paused())
	a, _ := newTest(t, 1<<30, Config{})
	require.ErrorContains(t, a.PausePool(nil, false), "nil pool")
	require.ErrorContains(t, a.ResumePool(nil), "nil pool")
	require.ErrorContains(t, a.ReleasePool(&zero), "another allocator")
	require.ErrorContains(t, a.BeginCapture(nil, 0), "nil pool")
}
