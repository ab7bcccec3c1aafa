package offline

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/gpumem/gpumem/internal/ctxtest"
	"github.com/gpumem/gpumem/trace"
)

// A packing whose context is done stops and says why; with a live
// context it packs as Pack does.
func TestPackContextStops(t *testing.T) {
	var ops []trace.Op
	for i := range uint64(5000) {
		ops = append(ops, trace.Op{Kind: trace.Alloc, ID: i, Size: 512 * (1 + i%7)})
		if i%3 == 0 {
			ops = append(ops, trace.Op{Kind: trace.Free, ID: i})
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := PackContext(ctx, ops)
	require.ErrorIs(t, err, context.Canceled)

	p, err := PackContext(context.Background(), ops)
	require.NoError(t, err)
	q, err := Pack(ops)
	require.NoError(t, err)
	require.Equal(t, q.Footprint, p.Footprint)
	require.NoError(t, p.Check())
}

// A packing stopped at any of its checks of the context, before, between
// or during its passes, returns the context's error and never a half-made
// plan (a stop during a pass left a pass's offsets unset, and the choice
// of the best pass read them).
func TestPackContextStopsAnywhere(t *testing.T) {
	var ops []trace.Op
	for i := range uint64(3000) { // random-like sizes: the first pass misses the bound
		ops = append(ops, trace.Op{Kind: trace.Alloc, ID: i, Size: 512 * (1 + i*7919%97)})
		if i >= 40 {
			ops = append(ops, trace.Op{Kind: trace.Free, ID: i - 40 + (i*31)%7})
		}
	}
	ops = validOps(ops)
	whole, err := Pack(ops)
	require.NoError(t, err)
	require.Greater(t, whole.Footprint, whole.Bound, "the other passes run")
	stops := 0
	for n := int64(0); ; n++ {
		ctx := ctxtest.NewCountdown(n)
		p, err := PackContext(ctx, ops)
		if err == nil {
			require.Equal(t, whole.Footprint, p.Footprint)
			break
		}
		require.ErrorIs(t, err, context.Canceled)
		require.Nil(t, p)
		stops++
	}
	require.Greater(t, stops, 3, "the packing checks its context more than at its start and end")
}

// validOps keeps only the frees of live IDs, once each.
func validOps(ops []trace.Op) []trace.Op {
	live := map[uint64]bool{}
	var out []trace.Op
	for _, op := range ops {
		switch op.Kind {
		case trace.Alloc:
			live[op.ID] = true
		case trace.Free:
			if !live[op.ID] {
				continue
			}
			delete(live, op.ID)
		}
		out = append(out, op)
	}
	return out
}
