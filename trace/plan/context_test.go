// Tests of stopping the long searches by their context.

package plan

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpumem/gpumem/allocator"
	"github.com/gpumem/gpumem/internal/ctxtest"
	"github.com/gpumem/gpumem/trace/internal/tracetest"
)

func TestFitContextStops(t *testing.T) {
	ops := tracetest.ReadFile(t, "testdata/batches/bert_b2.trace.gz")
	want, err := Fit(ops, FitOptions{})
	require.NoError(t, err)
	require.Greater(t, len(want.Trials), 3)
	for _, n := range []int64{0, 1, 5, 20} {
		ctx := ctxtest.NewCountdown(n)
		r, err := FitContext(ctx, ops, FitOptions{})
		assert.Nil(t, r, "n=%d", n)
		require.ErrorIs(t, err, context.Canceled, "n=%d", n)
		assert.Equal(t, int64(-1), ctx.Left(), "n=%d: the search stops at the first check that sees the context done", n)
	}
}

func TestTuneContextStops(t *testing.T) {
	ops := tracetest.ReadFile(t, smallTrace)
	cands := Sweep()[:4]
	for _, jobs := range []int{1, 3} {
		// Done after the first configuration: the others stop or are
		// skipped.
		ctx, cancel := context.WithCancel(context.Background())
		calls := 0
		_, err := TuneContext(ctx, ops, TuneOptions{Candidates: cands, Jobs: jobs, Progress: func(int, int) {
			calls++
			cancel()
		}})
		require.ErrorIs(t, err, context.Canceled, "jobs=%d", jobs)
		assert.Less(t, calls, len(cands), "jobs=%d", jobs)
		done, cancel := context.WithCancel(context.Background())
		cancel()
		_, err = TuneContext(done, ops, TuneOptions{Candidates: cands, Jobs: jobs, Progress: func(int, int) {
			t.Error("no configuration is evaluated after the context is done")
		}})
		require.ErrorIs(t, err, context.Canceled, "jobs=%d", jobs)
	}
}

func TestScaleContextStops(t *testing.T) {
	b2 := tracetest.ReadFile(t, "testdata/batches/bert_b2.trace.gz")
	b4 := tracetest.ReadFile(t, "testdata/batches/bert_b4.trace.gz")
	m, err := NewModel(Probe{"bert_b2", 2, b2}, Probe{"bert_b4", 4, b4})
	require.NoError(t, err)
	_, err = m.PredictContext(ctxtest.NewCountdown(2), 16, allocator.Config{}, 0)
	require.ErrorIs(t, err, context.Canceled)
	_, err = m.MaxBatchContext(ctxtest.NewCountdown(5), allocator.Config{}, 4<<30)
	require.ErrorIs(t, err, context.Canceled)
	// Without a done context the answers are those of the plain calls.
	a, err := m.MaxBatchContext(context.Background(), allocator.Config{}, 4<<30)
	require.NoError(t, err)
	b, err := m.MaxBatch(allocator.Config{}, 4<<30)
	require.NoError(t, err)
	assert.Equal(t, b.MaxBatch, a.MaxBatch)
}
