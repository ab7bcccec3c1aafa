package allocator

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/gpumem/gpumem/device"
)

// TestKnownStreamCostsNothing checks that a stream the allocator has seen
// costs no allocation on the cached path, however many streams it knows:
// the known streams are a set, not a list to walk.
func TestKnownStreamCostsNothing(t *testing.T) {
	if selfCheck {
		t.Skip("the self-checks of the gpumem_invariants tag allocate")
	}
	a, dev := newOn(t, Config{})
	var streams []device.Stream
	for range 1000 {
		s, err := dev.NewStream()
		require.NoError(t, err)
		p, err := a.Alloc(512, s)
		require.NoError(t, err)
		require.NoError(t, a.Free(p))
		streams = append(streams, s)
	}
	last := streams[len(streams)-1]
	allocs := testing.AllocsPerRun(100, func() {
		p, err := a.Alloc(512, last)
		if err != nil {
			t.Fatal(err)
		}
		if err := a.Free(p); err != nil {
			t.Fatal(err)
		}
	})
	require.Zero(t, allocs, "a cached allocation on a known stream allocates nothing")
	require.NoError(t, a.CheckInvariants())
}
