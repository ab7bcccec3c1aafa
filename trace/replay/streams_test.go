package replay

import (
	"io"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpumem/gpumem/allocator"
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
// trace quadratic: 50 s for 300,000 streams, and 25 s or 12 s with either
// walk alone, where it now takes about a second on a quiet machine, and
// up to ten on a loaded one. The deadline is a minute, so that it trips
// only on a return of a quadratic walk (minutes on a loaded machine), not
// on a slow machine.
func TestReplayStreamPerAllocation(t *testing.T) {
	n := 300_000
	switch {
	case selfChecks:
		n = 2_000 // every op walks the whole allocator
	case raceDetector || testing.Short():
		n = 30_000
	}
	a, dev := newAllocator(t, 0, allocator.Config{})

	done := make(chan struct{})
	var res *Result
	var err error
	go func() {
		defer close(done)
		res, err = Run(&streamPerAlloc{n: n}, a, dev, Options{})
	}()
	// Under the self-checks every op walks every stream the allocator
	// knows, so that the cost there grows with the streams by design: the
	// deadline is for the plain build alone.
	deadline := time.After(time.Minute)
	if selfChecks {
		deadline = nil
	}
	select {
	case <-done:
	case <-deadline:
		t.Fatalf("replaying %d single-use streams takes over a minute: the cost per op grows with the streams", n)
	}
	require.NoError(t, err)
	assert.EqualValues(t, 3*n, res.Ops)
	assert.EqualValues(t, n, res.Alloc)
	assert.EqualValues(t, n, res.Frees)
	assert.Zero(t, res.OOMs)
	c := dev.Counters()
	assert.EqualValues(t, n, c.StreamsCreated, "one device stream per trace stream")
	assert.EqualValues(t, n, dev.Streams()-1)
	require.NoError(t, a.CheckInvariants())
}
