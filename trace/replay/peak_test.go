// Tests of the peak search and of stopping a replay early.

package replay

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpumem/gpumem/allocator"
	"github.com/gpumem/gpumem/stats"
	"github.com/gpumem/gpumem/trace"
)

func replayOps(t *testing.T, ops []trace.Op, opt Options) (*Result, *allocator.Allocator) {
	t.Helper()
	a, dev := newAllocator(t, 0, allocator.Config{})
	res, err := Run(trace.SliceReader(ops), a, dev, opt)
	require.NoError(t, err)
	return res, a
}

func TestPeakAndStopAfter(t *testing.T) {
	ops, err := trace.ReadFile("testdata/bert_b2.trace.gz")
	require.NoError(t, err)

	full, _ := replayOps(t, ops, Options{Peak: true, Batch: 100})
	require.Positive(t, full.PeakOp)
	assert.Less(t, full.PeakOp, full.Ops, "this trace frees after its peak")
	assert.Equal(t, trace.Alloc, ops[full.PeakOp-1].Kind, "the peak is reached by an a line")
	assert.Positive(t, full.PeakLine)

	plain, _ := replayOps(t, ops, Options{})
	assert.Zero(t, plain.PeakOp, "only with Options.Peak")
	assert.Equal(t, full.PeakAllocated, plain.PeakAllocated)

	// Stopping at the peak leaves the allocator at the peak: its current
	// allocated bytes are the whole replay's peak, reached by the last op.
	at, a := replayOps(t, ops, Options{StopAfter: full.PeakOp, Peak: true})
	assert.Equal(t, full.PeakOp, at.Ops)
	assert.Equal(t, full.PeakOp, at.PeakOp)
	assert.Equal(t, full.PeakLine, at.PeakLine)
	st := a.Stats()
	assert.Equal(t, full.PeakAllocated, st.AllocatedBytes[stats.All].Current)
	assert.Equal(t, full.PeakAllocated, at.PeakAllocated)

	// One op earlier, the peak is not reached yet.
	before, _ := replayOps(t, ops, Options{StopAfter: full.PeakOp - 1})
	assert.Less(t, before.PeakAllocated, full.PeakAllocated)

	// A stop past the end replays everything.
	all, _ := replayOps(t, ops, Options{StopAfter: full.Ops + 10})
	assert.Equal(t, full.Ops, all.Ops)
}
