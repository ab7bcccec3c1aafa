// Tests of stopping the searches by their context.

package estimate

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpumem/gpumem/internal/ctxtest"
)

func TestSearchContextStops(t *testing.T) {
	m, err := Preset("gpt2")
	require.NoError(t, err)
	pl := Plan{Model: &m, Workload: Workload{Batch: 1, Seq: 256}, Capacity: 8 << 30}
	wantBatch, err := pl.MaxBatch(MaxBatch)
	require.NoError(t, err)
	wantSeq, err := pl.MaxSeq(MaxSequence)
	require.NoError(t, err)
	for _, n := range []int64{0, 1, 3} {
		// A Ctrl-C in the middle of a search.
		ctx := ctxtest.NewCountdown(n)
		_, err := pl.MaxBatchContext(ctx, MaxBatch)
		require.ErrorIs(t, err, context.Canceled, "n=%d", n)
		assert.Equal(t, int64(-1), ctx.Left(), "n=%d: no simulation after the context is done", n)
		ctx.Reset(n)
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
