// Tests of stopping a replay by its context.

package replay

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpumem/gpumem/allocator"
	"github.com/gpumem/gpumem/stats"
	"github.com/gpumem/gpumem/trace"
)

// countdown is a context that is done after its Err has been asked n
// times: it stands for a Ctrl-C at a known point of the work.
type countdown struct {
	context.Context
	n atomic.Int64
}

func (c *countdown) Err() error {
	if c.n.Add(-1) < 0 {
		return context.Canceled
	}
	return nil
}

func TestRunContextStops(t *testing.T) {
	ops, err := trace.ReadFile("testdata/bert_b2.trace.gz")
	require.NoError(t, err)
	require.Greater(t, len(ops), 4*replayBatch)

	a, dev := newAllocator(t, 0, allocator.Config{})
	ctx := &countdown{Context: context.Background()}
	ctx.n.Store(3)
	res, err := RunContext(ctx, trace.SliceReader(ops), a, dev, Options{})
	assert.Nil(t, res)
	require.ErrorIs(t, err, context.Canceled)
	assert.EqualError(t, err, "replay stopped after 3072 ops: context canceled", "three batches, then the check that stops")

	// A context done before the start replays nothing.
	a, dev = newAllocator(t, 0, allocator.Config{})
	done, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = RunContext(done, trace.SliceReader(ops), a, dev, Options{})
	require.ErrorIs(t, err, context.Canceled)
	assert.Zero(t, a.Stats().AllocatedBytes[stats.All].Peak, "nothing replayed")

	// Run is RunContext with a context never done.
	a, dev = newAllocator(t, 0, allocator.Config{})
	full, err := Run(trace.SliceReader(ops), a, dev, Options{})
	require.NoError(t, err)
	assert.Equal(t, int64(len(ops)), full.Ops)
}
