package estimate

import (
	"context"
	"testing"
	"time"

	"github.com/gpumem/gpumem/internal/ctxtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestMaxBatchIsTheEdge(t *testing.T) {
	gpt2, _ := Preset("gpt2")
	pl := Plan{Model: &gpt2, Workload: Workload{Seq: 512}, Capacity: 24 << 30}
	n, err := pl.MaxBatch(MaxBatch)
	if err != nil {
		t.Fatal(err)
	}
	fits := func(b int) bool {
		q := pl
		q.Workload.Batch = b
		ok, err := q.Fits()
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}
	if n < 2 || !fits(n) || fits(n+1) {
		t.Errorf("largest batch %d: fits(%d) %v, fits(%d) %v", n, n, fits(n), n+1, fits(n+1))
	}
	s, err := pl.MaxSeq(MaxSequence)
	if err != nil {
		t.Fatal(err)
	}
	if s != 1024 {
		t.Errorf("longest sequence %d, want GPT-2's 1024 positions", s)
	}
}

// A model that does not fit at all gives 0, not an error, however large
// the search goes; so does a size too large to represent.
func TestSearchTooBigIsZero(t *testing.T) {
	m, _ := Preset("llama-70b")
	pl := Plan{Model: &m, Workload: Workload{Precision: AMPBF16}, Capacity: 80 << 30}
	for name, f := range map[string]func(int) (int, error){"batch": pl.MaxBatch, "seq": pl.MaxSeq} {
		n, err := f(1 << 30)
		if err != nil || n != 0 {
			t.Errorf("max %s of 70B full training on 80 GiB: %d, %v; want 0, nil", name, n, err)
		}
	}
	l, _ := Preset("llama3-8b")
	q := Plan{Model: &l, Workload: Workload{Mode: Infer, Precision: Int4, Attention: Eager}, Capacity: 80 << 30}
	start := time.Now()
	n, err := q.MaxSeq(MaxSequence)
	if err != nil || n < 4096 || n > 1<<16 {
		t.Errorf("longest int4 context with eager attention on 80 GiB: %d, %v", n, err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("the search took %v", d)
	}
	q.Workload.Attention, q.Capacity = Flash, MaxDevice
	if n, err := q.MaxSeq(MaxSequence); err != nil || n != MaxSequence {
		t.Errorf("longest int4 context with flash attention on 8 TiB: %d, %v; want the limit", n, err)
	}
}

// The searches stop by their context (MaxBatch at the first check that
// sees it done), and answer as the plain calls without one.
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
