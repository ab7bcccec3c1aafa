package offline

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

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
