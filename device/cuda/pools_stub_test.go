//go:build cuda

// pools_stub_test.go: the allocator's named pools, graph capture, and
// sleep and wake (pause and resume, with a backup through the copies) on
// the CUDA backend against the stub driver, which keeps the bytes written
// and drops them when their pages are unmapped.

package cuda

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpumem/gpumem/allocator"
	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/device/cuda/internal/cudastub"
	"github.com/gpumem/gpumem/gpumemtest"
)

// pattern returns n bytes made of seed.
func pattern(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = seed + byte(i%251) | 1
	}
	return b
}

// releaseToEmpty releases the pools, empties a's cache, and requires the
// invariants to hold and the stub driver to hold nothing: no memory in
// use, no reservation, no mapping, no allocation.
func releaseToEmpty(t *testing.T, a *allocator.Allocator, pools ...*allocator.Pool) {
	t.Helper()
	for _, p := range pools {
		require.NoError(t, a.ReleasePool(p))
	}
	require.NoError(t, a.EmptyCache())
	require.NoError(t, a.CheckInvariants())
	assert.Zero(t, cudastub.Used())
	for _, kind := range []string{"reservation", "mapping", "mem"} {
		assert.Zero(t, cudastub.Live(kind), kind)
	}
}

// TestStubPoolsPauseResume pauses a named pool with a backup and resumes
// it, with expandable segments and with plain ones (the pool's then
// reserved and mapped whole): while paused the driver holds only the
// default pool's memory and a copy from a paused block fails; after the
// resume the blocks have their addresses and bytes. A pause without a
// backup gives fresh pages. At the end the driver holds nothing.
func TestStubPoolsPauseResume(t *testing.T) {
	for _, expandable := range []bool{true, false} {
		t.Run(fmt.Sprintf("expandable=%v", expandable), func(t *testing.T) {
			d := openStub(t)
			a := gpumemtest.NewOn(t, d, gpumemtest.WithConfig(allocator.Config{ExpandableSegments: expandable}))
			def, err := a.Alloc(8*mib, device.DefaultStream)
			require.NoError(t, err)
			side, err := d.NewStream()
			require.NoError(t, err)
			p, err := a.NewPool("weights", allocator.PoolOptions{})
			require.NoError(t, err)
			require.NoError(t, a.UsePool(p, side))
			var ptrs []device.Ptr
			var want [][]byte
			for i, n := range []uint64{512, 3 * mib, 30 * mib} {
				q, err := a.Alloc(n, side)
				require.NoError(t, err)
				ptrs = append(ptrs, q)
				b := pattern(int(min(n, 4096)), byte(i*40))
				require.NoError(t, d.CopyFromHost(q, b))
				want = append(want, b)
			}
			require.NoError(t, a.UseDefaultPool(side))
			withPool := cudastub.Used()
			st, err := a.PoolStats(p)
			require.NoError(t, err)

			require.NoError(t, a.PausePool(p, true))
			require.NoError(t, a.CheckInvariants())
			assert.Equal(t, withPool-st.ReservedBytes, cudastub.Used(), "the pool's pages went back to the driver")
			assert.Equal(t, len(ptrs), cudastub.Live("host"), "one pinned host copy per live block")
			err = d.CopyToHost(make([]byte, 1), ptrs[0])
			requireDeviceError(t, err, device.ErrInvalidPointer, 0)
			require.NoError(t, a.ResumePool(p))
			require.NoError(t, a.CheckInvariants())
			assert.Equal(t, withPool, cudastub.Used())
			assert.Zero(t, cudastub.Live("host"), "the host copies are freed")
			for i, q := range ptrs {
				got := make([]byte, len(want[i]))
				require.NoError(t, d.CopyToHost(got, q))
				assert.Equal(t, want[i], got, "block %d's bytes at the same address", i)
			}

			require.NoError(t, a.PausePool(p, false))
			require.NoError(t, a.ResumePool(p))
			got := make([]byte, 64)
			require.NoError(t, d.CopyToHost(got, ptrs[2]))
			assert.Equal(t, make([]byte, 64), got, "without a backup the pages are fresh")

			for _, q := range append(ptrs, def) {
				require.NoError(t, a.Free(q))
			}
			releaseToEmpty(t, a, p)
		})
	}
}

// TestStubPoolsAndCapture routes a stream to a named pool and captures
// another into a private pool on the stub driver: each pool's blocks
// serve only its own allocations, a block freed in the capture on its own
// stream serves the capture again, EmptyCache leaves the live pools'
// segments alone, and releasing the pools returns everything.
func TestStubPoolsAndCapture(t *testing.T) {
	d := openStub(t)
	a := gpumemtest.NewOn(t, d)
	kv, err := a.NewPool("kv", allocator.PoolOptions{NoSplit: true})
	require.NoError(t, err)
	graph, err := a.NewPool("graph", allocator.PoolOptions{})
	require.NoError(t, err)
	s1, err := d.NewStream()
	require.NoError(t, err)
	s2, err := d.NewStream()
	require.NoError(t, err)

	require.NoError(t, a.UsePool(kv, s1))
	k, err := a.Alloc(4*mib, s1)
	require.NoError(t, err)
	require.NoError(t, a.UseDefaultPool(s1))

	require.NoError(t, a.BeginCapture(graph, s2))
	cp, capturing := a.Capturing(s2)
	assert.True(t, capturing)
	assert.Equal(t, graph, cp)
	g1, err := a.Alloc(mib, s2)
	require.NoError(t, err)
	require.NoError(t, a.Free(g1))
	g2, err := a.Alloc(mib, s2)
	require.NoError(t, err)
	assert.Equal(t, g1, g2, "a block freed on the capturing stream serves the capture")
	require.NoError(t, a.EndCapture(s2))
	require.NoError(t, a.Free(g2))

	ids := map[uint64]int{}
	for _, s := range a.Snapshot() {
		ids[s.PoolID]++
	}
	assert.Equal(t, map[uint64]int{kv.ID(): 1, graph.ID(): 1}, ids)
	require.NoError(t, a.EmptyCache())
	assert.Len(t, a.Snapshot(), 2, "EmptyCache leaves the live pools' segments")
	require.NoError(t, a.Free(k))
	releaseToEmpty(t, a, kv, graph)
}

// TestStubPauseNeedsVirtualMemory: on a device without virtual memory
// management a pool's segments are allocated, and pausing it fails with a
// clear error and changes nothing.
func TestStubPauseNeedsVirtualMemory(t *testing.T) {
	d := openStub(t, func() { cudastub.SetVirtualMemory(false) })
	a := gpumemtest.NewOn(t, d)
	p, err := a.NewPool("p", allocator.PoolOptions{})
	require.NoError(t, err)
	require.NoError(t, a.UsePool(p, device.DefaultStream))
	q, err := a.Alloc(mib, device.DefaultStream)
	require.NoError(t, err)
	require.NoError(t, a.UseDefaultPool(device.DefaultStream))
	err = a.PausePool(p, true)
	require.ErrorIs(t, err, device.ErrNotSupported)
	require.ErrorContains(t, err, "needs a device with virtual memory")
	assert.False(t, p.Paused())
	assert.Zero(t, cudastub.Live("reservation"))
	require.NoError(t, a.Free(q))
	releaseToEmpty(t, a, p)
}
