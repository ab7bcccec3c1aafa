package allocator

import (
	"cmp"
	"slices"
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
		streams := simtest.Streams(t, dev, 3)
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
		stop := inBackground(func() {
			st := a.Stats()
			if st.AllocatedBytes[0].Peak < st.AllocatedBytes[0].Current {
				t.Error("peak below current")
			}
		})
		wg.Wait()
		stop()
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
// aligned, segments of two streams share 2 MiB chunks of addresses; the
// routes still name each block's shard (they keep ranges, not chunks),
// and Free finds every block.
func TestRoutesShareChunks(t *testing.T) {
	dev := offsetDevice{simtest.New(t)}
	a := onDevice(t, dev, Config{})
	s1, _ := dev.NewStream()
	var ps []device.Ptr
	for i := range 40 {
		s := device.DefaultStream
		if i%2 == 1 {
			s = s1
		}
		ps = append(ps, mustAlloc(t, a, uint64(i%4)*mib+1000, s))
	}
	require.NoError(t, a.CheckInvariants())
	for i, p := range ps {
		id, ok := a.routes.lookup(p)
		require.True(t, ok, "block %d at %#x has no route", i, p)
		want := a.def
		for _, sh := range a.shards {
			if i%2 == 1 && sh.stream == s1 {
				want = sh
			}
		}
		assert.Equal(t, uint32(want.id), id, "block %d", i)
	}
	// Chunks that hold memory of both shards: what the test is about.
	shared := 0
	for _, seg := range a.segments {
		if other, ok := a.routes.lookup(seg.Ptr() - 1); ok && other != uint32(a.shardOf(seg.Free()).id) && seg.Ptr()>>chunkShift == (seg.Ptr()-1)>>chunkShift {
			shared++
		}
	}
	assert.Positive(t, shared, "some chunk holds segments of both streams")
	for _, p := range ps {
		mustFree(t, a, p)
	}
	require.NoError(t, a.EmptyCache())
	require.NoError(t, a.CheckInvariants())
	a.routes.each(func(region uint64, ps []routePiece) { t.Errorf("region %#x keeps %v", region, ps) })
}

// TestRoutesKeepVirtualMemory: the simulated device reserves virtual
// memory from 2^56 on, above the routes' first zone; the routes keep the
// mapped pages of two streams' expandable segments there, so that Free
// finds each block's shard by its address, not by asking every shard.
func TestRoutesKeepVirtualMemory(t *testing.T) {
	for _, conf := range []string{"expandable_segments:True", "gpumem_policy:low_fragmentation"} {
		t.Run(conf, func(t *testing.T) {
			cfg, err := ParseConf(conf)
			require.NoError(t, err)
			dev := simtest.New(t)
			a := onDevice(t, dev, cfg)
			s1, _ := dev.NewStream()
			var ps []device.Ptr
			for i := range 12 {
				s := device.DefaultStream
				if i%2 == 1 {
					s = s1
				}
				ps = append(ps, mustAlloc(t, a, uint64(1+i%3)*mib, s))
			}
			require.NoError(t, a.CheckInvariants()) // the routes are the segments' mapped pages
			for i, p := range ps {
				require.GreaterOrEqual(t, uint64(p), uint64(1)<<routeZoneShift, "block %d is not in virtual memory above the first zone", i)
				id, ok := a.routes.lookup(p)
				require.True(t, ok, "block %d at %#x has no route", i, p)
				// The shard of the block's segment (the policy may lend a
				// block of the other stream's cache).
				want := a.shardOf(a.liveBlock(p).Seg().Free())
				assert.Equal(t, uint32(want.id), id, "block %d", i)
				if sh := a.routes.cached(p); assert.NotNil(t, sh, "block %d: the cache, filled by the lookup", i) {
					assert.Equal(t, want.id, sh.id, "block %d: the cache", i)
				}
				if i%2 == 1 && conf == "expandable_segments:True" {
					assert.Equal(t, s1, want.stream, "block %d", i)
				}
			}
			for _, p := range ps {
				mustFree(t, a, p)
			}
			require.NoError(t, a.EmptyCache())
			require.NoError(t, a.CheckInvariants())
			a.routes.each(func(region uint64, ps []routePiece) { t.Errorf("region %#x keeps %v", region, ps) })
		})
	}
}

// chunkShift is a 2 MiB chunk of addresses, the unit of the routes of
// old, which could not tell two shards apart within one.
const chunkShift = 21

// TestRoutesMatchModel drives routes with random ranges of random shards,
// some touching, some across regions, some in zones of addresses above
// 2^48 (more of them than the routes keep), registered whole and
// unregistered whole or in parts, against a model that keeps the shard of
// every range and the zones kept.
func TestRoutesMatchModel(t *testing.T) {
	hits := 0
	rapid.Check(t, func(t *rapid.T) {
		shards := []*shard{{id: 0}, {id: 1}, {id: 2}}
		var r routes
		// Some runs start where the stamp is about to come round.
		r.gen = rapid.SampledFrom([]uint64{0, 1<<routeStampBits - 3}).Draw(t, "gen")
		r.start()
		type unit struct {
			p  uint64
			n  uint64
			sh *shard
		}
		var units []unit
		var zones []uint64 // the zones above the first that the routes keep, as they came
		kept := func(p uint64) bool {
			z := p >> routeZoneShift
			return z == 0 || slices.Contains(zones, z)
		}
		for range rapid.IntRange(0, 60).Draw(t, "ops") {
			if len(units) > 0 && rapid.Bool().Draw(t, "remove") {
				i := rapid.IntRange(0, len(units)-1).Draw(t, "which")
				u := units[i]
				// Unregister the front part or all of it; keep the rest.
				k := uint64(rapid.IntRange(1, int(u.n>>20)).Draw(t, "part")) << 20
				r.add(device.Ptr(u.p), k, u.sh, -1)
				if k == u.n {
					units = append(units[:i], units[i+1:]...)
				} else {
					units[i].p, units[i].n = u.p+k, u.n-k
				}
			} else {
				// Ranges in MiB, near region boundaries, up to 3 GiB.
				u := unit{
					p:  uint64(rapid.IntRange(1, 6).Draw(t, "region"))<<regionShift + uint64(rapid.IntRange(-8, 8).Draw(t, "off")+64)<<20 - 64<<20,
					n:  uint64(rapid.SampledFrom([]int{1, 2, 3, 20, 1024, 3072}).Draw(t, "mib")) << 20,
					sh: shards[rapid.IntRange(0, 2).Draw(t, "shard")],
				}
				if rapid.Bool().Draw(t, "high") {
					u.p += 1 << 45 // another leaf
				}
				// Another zone: the simulated device's virtual memory
				// starts at 2^56; six zones, of which four are kept.
				u.p += rapid.SampledFrom([]uint64{0, 0, 1 << 56, 1<<56 + 1<<50, 2 << 56, 3 << 56, 4 << 56, 5 << 56}).Draw(t, "zone")
				clash := false
				for _, v := range units {
					if u.p < v.p+v.n && v.p < u.p+u.n {
						clash = true
					}
				}
				if clash {
					continue
				}
				r.add(device.Ptr(u.p), u.n, u.sh, +1)
				units = append(units, u)
				if z := u.p >> routeZoneShift; z != 0 && !slices.Contains(zones, z) && len(zones) < routeZones {
					zones = append(zones, z)
				}
			}
			owner := func(p uint64) (uint32, bool) {
				if !kept(p) {
					return 0, false // not kept: "ask everyone"
				}
				for _, u := range units {
					if u.p <= p && p < u.p+u.n {
						return uint32(u.sh.id), true
					}
				}
				return 0, false
			}
			var probes []uint64
			for _, u := range units {
				probes = append(probes, u.p, u.p+u.n-1, u.p+u.n, u.p-1, u.p+u.n/2)
			}
			for _, p := range probes {
				// The cache first, as Free asks: an answer must be the
				// owner's, whatever generation filled the slot.
				wid, wok := owner(p)
				if sh := r.cached(device.Ptr(p)); sh != nil && (!wok || uint32(sh.id) != wid) {
					t.Fatalf("%#x: the cache says shard %d, want %d (%v)", p, sh.id, wid, wok)
				}
				id, ok := r.lookup(device.Ptr(p))
				if ok != wok || ok && id != wid {
					t.Fatalf("%#x: shard %d (%v), want %d (%v)", p, id, ok, wid, wok)
				}
				if sh := r.cached(device.Ptr(p)); sh != nil && (!wok || uint32(sh.id) != wid) {
					t.Fatalf("%#x: the cache, just filled, says shard %d, want %d (%v)", p, sh.id, wid, wok)
				}
				hits += btoi(r.cached(device.Ptr(p)) != nil)
			}
			r.each(func(region uint64, ps []routePiece) {
				for i, x := range ps {
					if !kept(x.start) || x.start >= x.end || x.start>>regionShift != region || (x.end-1)>>regionShift != region ||
						i > 0 && (ps[i-1].end > x.start || ps[i-1].end == x.start && ps[i-1].id == x.id) {
						t.Fatalf("region %#x: not sorted, disjoint, coalesced pieces: %v", region, ps)
					}
				}
			})
		}
	})
	assert.Positive(t, hits, "the cache answered some lookups")
}

// TestRouteCacheStampComesRound: a slot filled at one stamp must not
// answer when the generation comes round to the same stamp with its
// chunk another shard's: the change that brings the stamp round to zero
// empties the cache.
func TestRouteCacheStampComesRound(t *testing.T) {
	sa, sb := &shard{id: 1}, &shard{id: 2}
	const p = 7 << 30
	var r routes
	r.gen = 1<<routeStampBits - 2
	r.start()
	r.add(p, 2*mib, sa, +1) // generation 2^22-1
	id, ok := r.lookup(p)
	require.True(t, ok)
	require.Equal(t, uint32(1), id)
	require.Same(t, sa, r.cached(p), "the lookup filled the slot")
	r.add(p, 2*mib, sa, -1) // 2^22: the stamp is 0 again
	r.add(p, 2*mib, sb, +1)
	// Changes elsewhere, which pass no other multiple of 2^22, bring the
	// generation to the stamp of the fill.
	r.gen = 1<<(routeStampBits+1) - 3
	r.add(p+1<<40, 2*mib, sa, +1)
	r.add(p+1<<40, 2*mib, sa, -1)
	require.Equal(t, routeStamp(1<<routeStampBits-1), r.stamp.Load(), "the fill's stamp")
	if sh := r.cached(p); sh != nil {
		t.Fatalf("the cache says shard %d for memory now shard 2's", sh.id)
	}
	id, ok = r.lookup(p)
	require.True(t, ok)
	assert.Equal(t, uint32(2), id)
	assert.Same(t, sb, r.cached(p))
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

// TestCutWaitingTellsTheWorld: a shard that leaves a cut waiting says so
// to the world (Allocator.cutWaiting) before it lets go of its lock, and
// the world that settles the cuts clears it: the world looks for cuts
// only when it is set.
func TestCutWaitingTellsTheWorld(t *testing.T) {
	a, bx := twoWaitingOperations(t, "")
	require.False(t, a.cutWaiting.Load())
	seen := 0
	allocAndFreeIntoOneCut(t, a, waitQ, bx, func(sh *shard) bool {
		if sh.cut {
			seen++
			assert.True(t, a.cutWaiting.Load(), "a cut waits on shard %d, unsaid", sh.id)
		}
		return sh.cut
	})
	assert.Positive(t, seen)
	assert.False(t, a.cutWaiting.Load())
	for _, sh := range a.shards {
		assert.False(t, sh.cut, "shard %d", sh.id)
	}
	require.NoError(t, a.CheckInvariants())
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

// TestRisingShardRunsAloneBelowThePeak: ten streams, each of which has
// run a burst of blocks and freed it, so that the peak of the counts of
// blocks is well above what any one holds; then one stream allocates a
// run of blocks, under its shard's lock alone (the cached path). Every
// pass of one of its limits is a cut, settled in the world. The shard
// that passes a limit of a row again, the row's riser, gets most of the
// room below the peak at the cut (peaks.Table.Exceed), so the run passes
// its limits twice, not every few blocks (11 times) as with the room
// shared evenly over the ten shards each time; and the peaks stay exact:
// the old one while the run is below it, then each new one.
func TestRisingShardRunsAloneBelowThePeak(t *testing.T) {
	a, dev := newTest(t, 0, Config{})
	streams := simtest.Streams(t, dev, 9)
	const burst, run, n = 40, 30, 4096
	for _, s := range streams {
		ps := make([]device.Ptr, burst)
		for i := range ps {
			ps[i] = mustAlloc(t, a, n, s)
		}
		for _, p := range ps {
			mustFree(t, a, p)
		}
	}
	require.EqualValues(t, burst, get(t, a, "allocation.all.peak"))
	s := streams[3]
	sh := a.lookupShard(s)
	require.NotNil(t, sh)
	limits := func() (l [numRows * numQ]int64) {
		a.lockAll()
		defer a.unlockAll()
		for row := range numRows {
			for k := range numQ {
				l[statRow(row, k)] = sh.limit(row, k)
			}
		}
		return l
	}
	cuts := 0
	before := limits()
	for i := range run + 20 {
		require.True(t, sh.fast.Load(), "the shard runs alone")
		mustAlloc(t, a, n, s)
		// With other shards, a limit of the shard changes only in the
		// world: at a cut of this shard's operation here.
		if after := limits(); after != before {
			cuts++
			before = after
		}
		if i+1 == run {
			assert.EqualValues(t, burst, get(t, a, "allocation.all.peak"), "the old peak, above the run")
			assert.LessOrEqual(t, cuts, 2, "cuts in a run of %d blocks below the peak", run)
		}
	}
	assert.EqualValues(t, run+20, get(t, a, "allocation.all.peak"))
	assert.EqualValues(t, run+20, get(t, a, "allocation.all.current"))
	assert.EqualValues(t, (run+20)*n, get(t, a, "allocated_bytes.all.peak"))
	require.NoError(t, a.CheckInvariants())
}

// TestStreamTableFindsEveryShard: streams that share a slot of the
// lock-free table, and streams that have none, are found by the list; a
// stream without a shard is not found, even where its slot holds another.
func TestStreamTableFindsEveryShard(t *testing.T) {
	var shards []*shard
	bySlot := map[int]int{}
	s := device.Stream(1)
	for ; len(shards) < maxShards; s++ {
		if streamSlot(s) < 8 { // 32 streams in 8 slots
			shards = append(shards, &shard{stream: s, id: len(shards)})
			bySlot[streamSlot(s)]++
		}
	}
	shared := 0
	for _, n := range bySlot {
		shared += n - 1
	}
	require.Positive(t, shared, "some streams share a slot: what the test is about")
	slices.SortFunc(shards, func(x, y *shard) int { return cmp.Compare(x.stream, y.stream) })
	var a Allocator
	a.byStream.Store(streamList(shards))
	for _, sh := range shards {
		assert.Same(t, sh, a.lookupShard(sh.stream), "stream %d", sh.stream)
	}
	for n := 0; n < 20; s++ {
		if streamSlot(s) < 8 {
			assert.Nil(t, a.lookupShard(s), "stream %d has no shard", s)
			n++
		}
	}
}

// TestRouteCacheAfterAddressReuse: a 2 MiB chunk cached as one stream's
// and released (EmptyCache) comes back as another stream's segment at the
// same address; the cache must not name the first stream's shard, and the
// free of the new block fills it with the second's.
func TestRouteCacheAfterAddressReuse(t *testing.T) {
	a, dev := newTest(t, 0, Config{})
	s1, _ := dev.NewStream()
	s2, _ := dev.NewStream()
	// Alloc, not mustAlloc: the invariant checker's lookups would fill
	// the cache first.
	p, err := a.Alloc(mib, s1)
	require.NoError(t, err)
	require.NoError(t, a.Free(p))
	sh1 := a.lookupShard(s1)
	require.Same(t, sh1, a.routes.cached(p), "the free filled the slot of p's chunk")
	require.NoError(t, a.EmptyCache())
	q, err := a.Alloc(mib, s2)
	require.NoError(t, err)
	require.Equal(t, p>>routeChunkShift, q>>routeChunkShift, "the device gave the same chunk again")
	if sh := a.routes.cached(q); sh != nil {
		require.Same(t, a.lookupShard(s2), sh, "the cache names the shard of the segment released")
	}
	require.NoError(t, a.Free(q))
	assert.Same(t, a.lookupShard(s2), a.routes.cached(q))
	require.NoError(t, a.CheckInvariants())
}

// TestRoutesStartedWithoutMemory: routes that start with no segment (a
// second stream's first Alloc fails, say) have changed nothing yet, and
// their cache must answer nothing: an empty slot is zero, and so was the
// stamp word before start.
func TestRoutesStartedWithoutMemory(t *testing.T) {
	a, dev := newTest(t, 8*mib, Config{})
	s1, _ := dev.NewStream()
	_, err := a.Alloc(64*mib, s1)
	require.ErrorIs(t, err, device.ErrOutOfMemory)
	require.True(t, a.routes.on)
	require.NoError(t, a.CheckInvariants())
	for p := device.Ptr(0); p < 64*mib; p += 2 * mib {
		require.Nil(t, a.routes.cached(p), "chunk at %#x", p)
	}
	mustFree(t, a, mustAlloc(t, a, mib, s1))
}

// TestShardsRunAloneOnceEventsSettle: while a stream event is pending no
// shard runs alone; once none is, the world makes the shards fast again
// only after it has left settleExits times with none pending (it counts
// the operation that found the events done), so that a program whose
// events come and go every few operations does not pay for making ten
// shards fast and slow again each time. With one shard there is nothing
// to settle: it runs alone from the first operation that finds the event
// done.
func TestShardsRunAloneOnceEventsSettle(t *testing.T) {
	setup := func(t *testing.T) (*Allocator, *sim.Device, device.Stream, device.Stream) {
		a, dev := newTest(t, 0, Config{})
		streams := simtest.Streams(t, dev, 2)
		require.NoError(t, dev.SetStreamBusy(streams[2], true))
		return a, dev, streams[1], streams[2]
	}
	t.Run("one shard", func(t *testing.T) {
		a, dev, _, u := setup(t)
		p := mustAlloc(t, a, 4096, 0)
		require.NoError(t, a.RecordStream(p, u))
		mustFree(t, a, p)
		require.False(t, a.def.fast.Load(), "an event is pending")
		require.NoError(t, dev.SetStreamBusy(u, false))
		mustFree(t, a, mustAlloc(t, a, 4096, 0)) // the Alloc finds the event done
		require.True(t, a.def.fast.Load(), "one shard runs alone at once")
	})
	t.Run("two shards", func(t *testing.T) {
		a, dev, s, u := setup(t)
		mustFree(t, a, mustAlloc(t, a, 4096, s))
		sh := a.lookupShard(s)
		require.NotNil(t, sh)
		require.True(t, sh.fast.Load(), "no event was pending: nothing to settle")
		p := mustAlloc(t, a, 4096, s)
		require.NoError(t, a.RecordStream(p, u))
		mustFree(t, a, p)
		var held []device.Ptr
		for i := range 3 * settleExits {
			require.False(t, sh.fast.Load() || a.def.fast.Load(), "op %d: an event is pending", i)
			if i%2 == 0 {
				held = append(held, mustAlloc(t, a, 4096, s))
			} else {
				mustFree(t, a, held[len(held)-1])
				held = held[:len(held)-1]
			}
		}
		require.NoError(t, dev.SetStreamBusy(u, false))
		exits := 0
		for !sh.fast.Load() {
			require.Less(t, exits, 4*settleExits, "the shard never ran alone again")
			require.False(t, a.def.fast.Load())
			p, err := a.Alloc(4096, s) // one world operation (mustAlloc's check is another)
			require.NoError(t, err)
			held = append(held, p)
			exits++
		}
		assert.Equal(t, settleExits, exits, "world operations before the shards run alone again")
		assert.True(t, a.def.fast.Load(), "every shard runs alone again")
		for _, p := range held {
			mustFree(t, a, p)
		}
		assert.EqualValues(t, 0, get(t, a, "allocation.all.current"))
		require.NoError(t, a.CheckInvariants())
	})
}
