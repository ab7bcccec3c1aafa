// Tests of stopping a replay by its context.

package replay

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpumem/gpumem/allocator"
	"github.com/gpumem/gpumem/internal/ctxtest"
	"github.com/gpumem/gpumem/stats"
	"github.com/gpumem/gpumem/trace"
)

func TestRunContextStops(t *testing.T) {
	ops, err := trace.ReadFile("testdata/bert_b2.trace.gz")
	require.NoError(t, err)
	require.Greater(t, len(ops), 4*replayBatch)

	a, dev := newAllocator(t, 0, allocator.Config{})
	// A Ctrl-C after the third check.
	res, err := RunContext(ctxtest.NewCountdown(3), trace.SliceReader(ops), a, dev, Options{})
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
