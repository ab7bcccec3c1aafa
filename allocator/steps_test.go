package allocator

import (
	"maps"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/gpumem/gpumem/allocator/internal/freeindex"
	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/internal/simtest"
)

// TestMarkStepCostsWhatChanged: a step boundary counts the live blocks
// from the changes since the last one, not by a walk of every live block
// under every shard's lock: 20,000 boundaries with one more live block
// each looked at 200 million blocks before (26 s at 40,000).
func TestMarkStepCostsWhatChanged(t *testing.T) {
	n := 20_000
	if selfCheck {
		n = 500 // the self-check after every operation walks every block
	}
	a, _ := newTest(t, 0, Config{})
	a.SetPhase("train")
	a.MarkStep("first") // nothing is live: nothing to count
	for i := range n {
		_, err := a.Alloc(4096, device.DefaultStream) // the leak, one a step
		require.NoError(t, err)
		a.examined = 0
		a.MarkStep("step")
		require.Zero(t, a.examined, "boundary %d looked at live blocks", i)
	}
	leaks := a.Leaks()
	require.Len(t, leaks, 1)
	assert.EqualValues(t, n, leaks[0].Count())
	assert.Equal(t, 7, leaks[0].Grew, "every one of the boundaries kept")
}

// TestMarkStepWalksWhereFewerAreLive: a boundary nets the step's log
// while it holds no more changes than the shard has live blocks (and
// minStepLog), and counts the live blocks otherwise, the cheaper of the
// two; either way the counts are a walk's.
func TestMarkStepWalksWhereFewerAreLive(t *testing.T) {
	for _, c := range []struct {
		live, pairs int
		walks       bool
	}{
		{live: 10, pairs: minStepLog / 2, walks: false},  // minStepLog changes: the log
		{live: 10, pairs: minStepLog/2 + 1, walks: true}, // more: the 10 live blocks
		{live: 500, pairs: 250, walks: false},            // as many changes as live blocks
		{live: 500, pairs: 251, walks: true},             // more
		{live: 500, pairs: 1004, walks: true},            // a training step's shape
		{live: 5000, pairs: 100, walks: false},           // a generation step's
	} {
		a, _ := newTest(t, 0, Config{})
		for i := range c.live {
			_, err := a.Alloc(uint64(512*(1+i%7)), device.DefaultStream)
			require.NoError(t, err)
		}
		a.MarkStep("first")
		for range 2 { // the second boundary's bound is the live blocks the first left
			for i := range c.pairs {
				p, err := a.Alloc(uint64(512*(1+i%5)), device.DefaultStream)
				require.NoError(t, err)
				require.NoError(t, a.Free(p))
			}
			a.lockAll()
			a.examined = 0
			got := a.markStepLocked()
			walked := a.examined
			want := make(map[leakKey]int64)
			a.def.live.Each(func(b *freeindex.Block) { want[leakKey{b.Phase, b.Requested}]++ })
			a.unlockAll()
			assert.Equal(t, want, got, "%d live, %d pairs", c.live, c.pairs)
			assert.Equal(t, c.walks, walked > 0, "%d live, %d pairs: walked %d blocks", c.live, c.pairs, walked)
		}
	}
}

// TestMarkStepCountsMatchAWalk: over random operations on several
// streams, with frees that wait for stream events, blocks lent under the
// policy, and runs of operations long enough to pass the step logs'
// bound, every boundary's counts are those of a walk of the live blocks.
func TestMarkStepCountsMatchAWalk(t *testing.T) {
	for _, cfg := range []Config{{}, lowFrag} {
		a, dev := newTest(t, 0, cfg)
		streams := []device.Stream{device.DefaultStream}
		for range 3 {
			s, err := dev.NewStream()
			require.NoError(t, err)
			require.NoError(t, dev.SetStreamBusy(s, true))
			streams = append(streams, s)
		}
		rng := rand.New(rand.NewPCG(1, 2))
		var live []device.Ptr
		phases := []string{"a", "b", "c"}
		for step := range 24 {
			for range 50 {
				switch k := rng.IntN(10); {
				case k < 5 || len(live) == 0:
					a.SetPhase(phases[rng.IntN(len(phases))])
					p, err := a.Alloc(uint64(rng.IntN(4)+1)*512*uint64(1+rng.IntN(3000)), streams[rng.IntN(len(streams))])
					require.NoError(t, err)
					live = append(live, p)
				case k < 9:
					i := rng.IntN(len(live))
					if rng.IntN(4) == 0 {
						require.NoError(t, a.RecordStream(live[i], streams[rng.IntN(len(streams))]))
					}
					require.NoError(t, a.Free(live[i]))
					live[i] = live[len(live)-1]
					live = live[:len(live)-1]
				default:
					require.NoError(t, dev.CompleteStream(streams[rng.IntN(len(streams))]))
				}
			}
			if step%8 == 7 { // past the bound of the default stream's log: the next boundary walks
				for range minStepLog + len(live) {
					p, err := a.Alloc(512, device.DefaultStream)
					require.NoError(t, err)
					require.NoError(t, a.Free(p))
				}
			}
			a.lockAll() // MarkStep, with its counts kept
			a.examined = 0
			got := a.markStepLocked()
			if step > 0 {
				assert.Equal(t, step%8 == 7, a.examined > 0, "boundary %d walked %d live blocks", step, a.examined)
			}
			a.steps.Record(got)
			want := make(map[leakKey]int64)
			for _, sh := range a.shards {
				sh.live.Each(func(b *freeindex.Block) { want[leakKey{b.Phase, b.Requested}]++ })
			}
			a.unlockAll()
			assert.Equal(t, want, got, "boundary %d", step)
			require.NoError(t, a.CheckInvariants())
		}
		for _, p := range live {
			require.NoError(t, a.Free(p))
		}
	}
}

// TestMarkStepUnderConcurrency: boundaries marked while goroutines
// allocate and free on their own streams, on the fast paths, count what
// a walk counts once they stop (run with -race).
func TestMarkStepUnderConcurrency(t *testing.T) {
	a, dev := newTest(t, 0, Config{})
	streams := simtest.Streams(t, dev, 4)[1:]
	errs := make(chan error, len(streams))
	kept := make([]int, len(streams))
	for i, s := range streams {
		go func() {
			var keep []device.Ptr
			for j := range 3000 {
				p, err := a.Alloc(uint64(512*(1+j%7)), s)
				if err != nil {
					errs <- err
					return
				}
				if j%(3+i) == 0 {
					keep = append(keep, p)
				} else if err := a.Free(p); err != nil {
					errs <- err
					return
				}
			}
			kept[i] = len(keep)
			errs <- nil
		}()
	}
	stop := inBackground(func() { a.MarkStep("step") })
	for range streams {
		require.NoError(t, <-errs)
	}
	stop()
	a.lockAll()
	got := a.markStepLocked()
	want := make(map[leakKey]int64)
	for _, sh := range a.shards {
		sh.live.Each(func(b *freeindex.Block) { want[leakKey{b.Phase, b.Requested}]++ })
	}
	a.unlockAll()
	assert.Equal(t, want, got)
	var live, total int64
	for _, n := range got {
		live += n
	}
	for _, n := range kept {
		total += int64(n)
	}
	assert.Equal(t, total, live, "the blocks the goroutines kept")
}

// TestLeakNetsMatchMap sums random changes by key, over several resets
// of one table (as markStepLocked reuses it) and its growths, against a
// Go map.
func TestLeakNetsMatchMap(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		var nets leakNets
		for range rapid.IntRange(1, 4).Draw(t, "logs") {
			n := rapid.IntRange(0, 200).Draw(t, "changes")
			nets.reset()
			want := map[leakKey]int64{}
			for range n {
				k := leakKey{
					phase: uint16(rapid.IntRange(0, 3).Draw(t, "phase")),
					size: rapid.OneOf(
						rapid.SampledFrom([]uint64{0, 512, 4096, 1 << 20, 1<<20 + 512, 1 << 48}),
						rapid.Map(rapid.Uint64Range(1, 100), func(n uint64) uint64 { return n << 9 }), // many keys: the table grows
					).Draw(t, "size"),
				}
				d := int64(rapid.SampledFrom([]int{-1, 1}).Draw(t, "d"))
				nets.add(k, d)
				want[k] += d
			}
			got := map[leakKey]int64{}
			nets.each(func(k leakKey, d int64) {
				if _, twice := got[k]; twice {
					t.Fatalf("%+v given twice", k)
				}
				got[k] = d
			})
			for k, d := range want {
				if d == 0 {
					delete(want, k)
				}
			}
			if !maps.Equal(got, want) {
				t.Fatalf("sums %v, want %v", got, want)
			}
		}
	})
}
