package allocator

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sync/errgroup"

	"github.com/gpumem/gpumem/device"
)

// TestConcurrentUse runs goroutines that allocate, record, free and read
// stats on several streams at once (run it with -race), then checks the
// invariants and that every byte came back.
func TestConcurrentUse(t *testing.T) {
	a, dev := newTest(t, 0, Config{MaxSplitSize: 64 * mib})
	var streams []device.Stream
	for range 3 {
		s, err := dev.NewStream()
		require.NoError(t, err)
		streams = append(streams, s)
	}
	const workers = 8
	var g errgroup.Group
	for w := range workers {
		g.Go(func() error {
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			s := streams[w%len(streams)]
			var live []device.Ptr
			for i := range 2000 {
				switch {
				case len(live) > 0 && rng.IntN(3) == 0:
					j := rng.IntN(len(live))
					if rng.IntN(4) == 0 {
						if err := a.RecordStream(live[j], streams[rng.IntN(len(streams))]); err != nil {
							return err
						}
					}
					if err := a.Free(live[j]); err != nil {
						return err
					}
					live[j] = live[len(live)-1]
					live = live[:len(live)-1]
				case i%500 == 0 && w == 0:
					if err := a.EmptyCache(); err != nil {
						return err
					}
				case i%100 == 0:
					_ = a.Stats().Map()
					_ = a.Snapshot()
				default:
					size := uint64(rng.IntN(4 << 20))
					if rng.IntN(10) == 0 {
						size = uint64(rng.IntN(100 << 20))
					}
					p, err := a.Alloc(size, s)
					if err != nil {
						return err
					}
					if p != 0 {
						live = append(live, p)
					}
				}
			}
			for _, p := range live {
				if err := a.Free(p); err != nil {
					return err
				}
			}
			return nil
		})
	}
	require.NoError(t, g.Wait())
	require.NoError(t, a.CheckInvariants())
	require.NoError(t, a.EmptyCache())
	require.EqualValues(t, 0, dev.BytesInUse())
}
