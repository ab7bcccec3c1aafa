package allocator

import (
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/device/sim"
	"github.com/gpumem/gpumem/internal/simtest"
)

// TestPeaksFollowTheOrderOfTwoGoroutines: two goroutines on two streams,
// whose Allocs and Frees run under their shards' locks alone, hand over
// to each other through channels, so that only one order of their
// operations is possible. The all peaks must be that order's.
func TestPeaksFollowTheOrderOfTwoGoroutines(t *testing.T) {
	for _, overlap := range []bool{true, false} {
		a, dev := newTest(t, 0, Config{})
		s1, _ := dev.NewStream()
		s2, _ := dev.NewStream()
		// Warm both shards: each has a free segment and its limits.
		mustFree(t, a, mustAlloc(t, a, 8*mib, s1))
		mustFree(t, a, mustAlloc(t, a, 8*mib, s2))
		a.ResetPeakStats()
		const x, y = 3 * mib, 5 * mib
		turn1, turn2 := make(chan struct{}), make(chan struct{})
		var wg sync.WaitGroup
		wg.Add(2)
		go func() { // A on s1
			defer wg.Done()
			p, err := a.Alloc(x, s1)
			require.NoError(t, err)
			if overlap {
				turn2 <- struct{}{} // B allocates while A lives
				<-turn1
			}
			require.NoError(t, a.Free(p))
			if !overlap {
				turn2 <- struct{}{} // B allocates after A is freed
			}
		}()
		go func() { // B on s2
			defer wg.Done()
			<-turn2
			p, err := a.Alloc(y, s2)
			require.NoError(t, err)
			if overlap {
				turn1 <- struct{}{}
			}
			require.NoError(t, a.Free(p))
		}()
		wg.Wait()
		want := int64(y)
		if overlap {
			want = x + y
		}
		assert.Equal(t, want, get(t, a, "allocated_bytes.all.peak"), "overlap %v", overlap)
		assert.Equal(t, want, get(t, a, "allocated_bytes.large_pool.peak"), "overlap %v", overlap)
		assert.EqualValues(t, 0, get(t, a, "allocated_bytes.all.current"))
		require.NoError(t, a.CheckInvariants())
	}
}

// TestStreamsInParallel runs goroutines on streams of their own and on a
// shared one, with random sizes over both pools, while others read the
// stats, and checks the invariants (the limits and peaks among them) and
// that every byte comes back. Run it with -race.
func TestStreamsInParallel(t *testing.T) {
	for _, cfg := range []Config{{}, {ExpandableSegments: true}, {MaxSplitSize: 32 * mib}} {
		a, dev := newTest(t, 16*gib, cfg)
		streams := []device.Stream{device.DefaultStream}
		for range 3 {
			s, err := dev.NewStream()
			require.NoError(t, err)
			streams = append(streams, s)
		}
		var wg sync.WaitGroup
		var peakLive sync.Map
		for w := range 6 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				s := streams[w%len(streams)]
				var live []device.Ptr
				var bytes, most int64
				sizes := map[device.Ptr]int64{}
				for i := range 3000 {
					if len(live) > 0 && (i%3 == 0 || len(live) > 50) {
						j := (i * 7) % len(live)
						if err := a.Free(live[j]); err != nil {
							t.Error(err)
							return
						}
						bytes -= sizes[live[j]]
						live[j] = live[len(live)-1]
						live = live[:len(live)-1]
						continue
					}
					size := uint64(1+(i*7919+w*104729)%(4*mib)) * uint64(1+i%3)
					p, err := a.Alloc(size, s)
					if err != nil {
						t.Error(err)
						return
					}
					live = append(live, p)
					sizes[p] = int64((size + 511) &^ 511)
					bytes += sizes[p]
					most = max(most, bytes)
				}
				peakLive.Store(w, most)
				for _, p := range live {
					if err := a.Free(p); err != nil {
						t.Error(err)
					}
				}
			}()
		}
		stop := make(chan struct{})
		done := make(chan struct{})
		go func() {
			defer close(done)
			for {
				select {
				case <-stop:
					return
				default:
					st := a.Stats()
					if st.AllocatedBytes[0].Peak < st.AllocatedBytes[0].Current {
						t.Error("peak below current")
					}
				}
			}
		}()
		wg.Wait()
		close(stop)
		<-done
		require.NoError(t, a.CheckInvariants())
		// The all peak lies between the largest of one goroutine's peaks
		// and their sum (each goroutine's own order is fixed).
		var sum, most int64
		peakLive.Range(func(_, v any) bool {
			sum += v.(int64)
			most = max(most, v.(int64))
			return true
		})
		peak := get(t, a, "allocated_bytes.all.peak")
		assert.GreaterOrEqual(t, peak, most)
		assert.LessOrEqual(t, peak, sum)
		require.NoError(t, a.EmptyCache())
		assert.EqualValues(t, 0, dev.BytesInUse())
	}
}

// offsetDevice is a simulated device whose addresses are 512 bytes past
// the simulated ones, so that segments are not 2 MiB aligned.
type offsetDevice struct{ *sim.Device }

func (d offsetDevice) Malloc(size uint64) (device.Ptr, error) {
	p, err := d.Device.Malloc(size)
	if err != nil {
		return 0, err
	}
	return p + 512, nil
}

func (d offsetDevice) Free(p device.Ptr) error { return d.Device.Free(p - 512) }

// TestRoutesShareChunks: on a device whose segments are not 2 MiB
// aligned, segments of two streams share chunks of addresses; Free finds
// their blocks all the same (taking every lock for a chunk of two
// shards).
func TestRoutesShareChunks(t *testing.T) {
	dev := offsetDevice{simtest.New(t)}
	a, err := New(dev, Config{})
	require.NoError(t, err)
	s1, _ := dev.NewStream()
	var ps []device.Ptr
	for i := range 40 {
		s := device.DefaultStream
		if i%2 == 1 {
			s = s1
		}
		ps = append(ps, mustAlloc(t, a, uint64(i%4)*mib+1000, s))
	}
	ambiguous := 0
	for _, o := range a.routes.owners {
		if o.value() == routeAmbig {
			ambiguous++
		}
	}
	assert.Positive(t, ambiguous, "some chunk holds segments of both streams")
	for _, p := range ps {
		mustFree(t, a, p)
	}
	require.NoError(t, a.EmptyCache())
	require.NoError(t, a.CheckInvariants())
	assert.Empty(t, a.routes.owners)
}

// TestRoutesMatchModel drives routes with random units of random shards,
// registered and unregistered as the allocator does, against a count per
// chunk and shard.
func TestRoutesMatchModel(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		shards := []*shard{{id: 0}, {id: 1}, {id: 2}}
		r := routes{on: true, owners: map[uint64]chunkOwners{}}
		type unit struct {
			p  device.Ptr
			n  uint64
			sh *shard
		}
		var units []unit
		for range rapid.IntRange(0, 60).Draw(t, "ops") {
			if len(units) > 0 && rapid.Bool().Draw(t, "remove") {
				i := rapid.IntRange(0, len(units)-1).Draw(t, "which")
				u := units[i]
				r.add(u.p, u.n, u.sh, -1)
				units = append(units[:i], units[i+1:]...)
			} else {
				// Units of at least 2 MiB, anywhere: at most two reach into
				// a chunk when they do not overlap, so place them apart.
				base := device.Ptr(rapid.IntRange(0, 40).Draw(t, "slot")) * 8 << 20
				u := unit{base + device.Ptr(rapid.IntRange(0, 4095).Draw(t, "off"))*512, uint64(rapid.IntRange(4, 12).Draw(t, "size")) << 19, shards[rapid.IntRange(0, 2).Draw(t, "shard")]}
				clash := false
				for _, v := range units {
					if u.p < v.p+device.Ptr(v.n) && v.p < u.p+device.Ptr(u.n) {
						clash = true
					}
				}
				if clash {
					continue
				}
				r.add(u.p, u.n, u.sh, +1)
				units = append(units, u)
			}
			// Every chunk: the shards of the units that reach into it.
			want := map[uint64]map[int]bool{}
			for _, u := range units {
				for c := uint64(u.p) >> chunkShift; c <= (uint64(u.p)+u.n-1)>>chunkShift; c++ {
					if want[c] == nil {
						want[c] = map[int]bool{}
					}
					want[c][u.sh.id] = true
				}
			}
			if len(want) != len(r.owners) {
				t.Fatalf("%d chunks, want %d", len(r.owners), len(want))
			}
			for c, ids := range want {
				id, ok := r.lookup(device.Ptr(c<<chunkShift + 4096))
				if len(ids) == 1 {
					if !ok || !ids[int(id)] {
						t.Fatalf("chunk %#x: shard %d (%v), want %v", c, id, ok, ids)
					}
				} else if ok {
					t.Fatalf("chunk %#x of %d shards: found shard %d", c, len(ids), id)
				}
			}
		}
	})
}

// TestCutsOfTwoWaitingOperations: two operations on two shards pass their
// limits while a third party holds Allocator.mu, so both leave a
// cut waiting and one cut settles both. Their changes to allocated bytes
// and to inactive split bytes go opposite ways; the peaks must be those
// of one order of the two (the order of the shards: the alloc, then the
// free), not of their sum alone.
func TestCutsOfTwoWaitingOperations(t *testing.T) {
	a, bx := twoWaitingOperations(t, "")
	const x, q = waitX, waitQ
	allocated := get(t, a, "allocated_bytes.all.current")
	split := get(t, a, "inactive_split_bytes.all.current")

	allocAndFreeIntoOneCut(t, a, q, bx, func(sh *shard) bool { return sh.cut })
	// The alloc first: allocated rises by q, then falls by x; inactive
	// split falls by q, then rises by x (to below where it started).
	assert.Equal(t, allocated+q, get(t, a, "allocated_bytes.all.peak"))
	assert.Equal(t, split, get(t, a, "inactive_split_bytes.all.peak"))
	assert.Equal(t, allocated+q-x, get(t, a, "allocated_bytes.all.current"))
	assert.Equal(t, split-q+x, get(t, a, "inactive_split_bytes.all.current"))
}

// The sizes of the cut tests: the block freed (x) and the one allocated
// (q).
const waitX, waitQ = 4096, 3 * mib / 2

// twoWaitingOperations builds the state of the cut tests and returns the
// allocator and the block bx to free. With x = waitX and q = waitQ,
// stream B holds [x][y][rest] in a small segment: freeing bx
// leaves a free block in a split segment (inactive split +x, allocated
// -x). The default stream holds [p][q free][r][rest] in a large segment:
// allocating q takes q whole (allocated +q, inactive split -q). A phase,
// if named, is set before the first allocation; the peaks are reset last,
// so that every limit is the value now and any rise passes one.
func twoWaitingOperations(t *testing.T, phase string) (a *Allocator, bx device.Ptr) {
	t.Helper()
	a, dev := newTest(t, 0, Config{})
	sB, _ := dev.NewStream()
	if phase != "" {
		a.SetPhase(phase)
	}
	bx = mustAlloc(t, a, waitX, sB)
	mustAlloc(t, a, waitX, sB)
	mustAlloc(t, a, 3*mib, device.DefaultStream)
	bq := mustAlloc(t, a, waitQ, device.DefaultStream)
	mustAlloc(t, a, 2*mib, device.DefaultStream)
	mustFree(t, a, bq)
	a.ResetPeakStats()
	return a, bx
}

// allocAndFreeIntoOneCut runs Alloc(q) and Free(bx) on the default
// stream in two goroutines while the test holds Allocator.mu, so
// that both operations pass a limit and wait for one cut (waiting tells
// a shard whose operation waits); then it lets the cut settle them and
// waits for both.
func allocAndFreeIntoOneCut(t *testing.T, a *Allocator, q uint64, bx device.Ptr, waiting func(*shard) bool) {
	t.Helper()
	a.mu.Lock() // the operations' cuts wait for it
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		_, err := a.Alloc(q, device.DefaultStream)
		assert.NoError(t, err)
	}()
	go func() {
		defer wg.Done()
		assert.NoError(t, a.Free(bx))
	}()
	for n := 0; n < 2; {
		n = 0
		for _, sh := range a.shards {
			sh.mu.Lock()
			if waiting(sh) {
				n++
			}
			sh.mu.Unlock()
		}
	}
	a.mu.Unlock()
	wg.Wait()
}
