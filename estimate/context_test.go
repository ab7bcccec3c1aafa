// Tests of stopping the searches by their context.

package estimate

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// countdown is a context that is done after its Err has been asked n
// times: a Ctrl-C in the middle of a search.
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

func TestSearchContextStops(t *testing.T) {
	m, err := Preset("gpt2")
	require.NoError(t, err)
	pl := Plan{Model: &m, Workload: Workload{Batch: 1, Seq: 256}, Capacity: 8 << 30}
	wantBatch, err := pl.MaxBatch(MaxBatch)
	require.NoError(t, err)
	wantSeq, err := pl.MaxSeq(MaxSequence)
	require.NoError(t, err)
	for _, n := range []int64{0, 1, 3} {
		ctx := &countdown{Context: context.Background()}
		ctx.n.Store(n)
		_, err := pl.MaxBatchContext(ctx, MaxBatch)
		require.ErrorIs(t, err, context.Canceled, "n=%d", n)
		assert.Equal(t, int64(-1), ctx.n.Load(), "n=%d: no simulation after the context is done", n)
		ctx.n.Store(n)
		_, err = pl.MaxSeqContext(ctx, MaxSequence)
		require.ErrorIs(t, err, context.Canceled, "n=%d", n)
	}
	got, err := pl.MaxBatchContext(context.Background(), MaxBatch)
	require.NoError(t, err)
	assert.Equal(t, wantBatch, got)
	got, err = pl.MaxSeqContext(context.Background(), MaxSequence)
	require.NoError(t, err)
	assert.Equal(t, wantSeq, got)
}
