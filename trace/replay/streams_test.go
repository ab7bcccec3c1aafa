package replay

import (
	"io"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/device/counting"
	"github.com/gpumem/gpumem/gpumemtest"
	"github.com/gpumem/gpumem/internal/simtest"
	"github.com/gpumem/gpumem/trace"
)

// streamPerAlloc is a generated trace that puts every allocation on a
// stream of its own: for i < n, "a i 512 i+1", "f i" and "S". It makes
// its ops on the fly, so that the test holds no trace in memory.
type streamPerAlloc struct {
	n, i int
}

func (g *streamPerAlloc) Next() (trace.Op, error) {
	if g.i >= 3*g.n {
		return trace.Op{}, io.EOF
	}
	id := uint64(g.i / 3)
	g.i++
	switch g.i % 3 {
	case 1:
		return trace.Op{Kind: trace.Alloc, ID: id, Size: 512, Stream: id + 1}, nil
	case 2:
		return trace.Op{Kind: trace.Free, ID: id}, nil
	}
	return trace.Op{Kind: trace.SyncDevice}, nil
}

func (g *streamPerAlloc) Line() int { return g.i }

// TestReplayStreamPerAllocation replays a trace whose every allocation is
// on a new stream. Each op must cost the same however many streams came
// before it: the allocator's set of known streams and the simulated
// device's synchronization used to walk every stream, which made this
// trace quadratic (50 s for 300,000 streams, against about a second
// now). The work is counted, not timed: the device calls through
// device/counting, a bounded number per op, and the streams the
// simulated device's synchronizations visit (sim.Counters.StreamVisits),
// at most one per allocation, where the walk of every stream made
// n(n+1)/2 of them.
func TestReplayStreamPerAllocation(t *testing.T) {
	n := 300_000
	switch {
	case selfChecks:
		n = 2_000 // every op walks the whole allocator
	case raceDetector || testing.Short():
		n = 30_000
	}
	dev := simtest.New(t)
	counted := counting.New(dev)
	a := gpumemtest.NewOn(t, counted.Device())

	res, err := Run(&streamPerAlloc{n: n}, a, counted.Device(), Options{})
	require.NoError(t, err)
	assert.EqualValues(t, 3*n, res.Ops)
	assert.EqualValues(t, n, res.Alloc)
	assert.EqualValues(t, n, res.Frees)
	assert.Zero(t, res.OOMs)
	c := dev.Counters()
	assert.EqualValues(t, n, c.StreamsCreated, "one device stream per trace stream")
	assert.EqualValues(t, n, dev.Streams()-1)
	require.NoError(t, a.CheckInvariants())

	// Each allocation takes a new segment (a block is cached for its own
	// stream) and some are given back when the device fills: per
	// allocation, at most one call of each kind, and a few more for the
	// out-of-memory recoveries. A call made per known stream would make
	// about n*n/2 of a kind.
	calls := counted.Counts()
	for k, m := range calls.Calls {
		assert.LessOrEqual(t, m, int64(n+n/1000+8), "%v: at most one call per allocation", device.Call(k))
	}
	assert.LessOrEqual(t, c.StreamVisits, int64(n), "at most one stream visited per allocation")
}
