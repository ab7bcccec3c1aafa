// Tests of the stream-ordered pool: unit tests of its rules, and a state
// machine that checks it against a simple model of what stream order
// allows.

package sim

import (
	"maps"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/gpumem/gpumem/device"
)

func mallocAsync(t tb, d *Device, size uint64, s device.Stream) device.Ptr {
	t.Helper()
	p, err := d.MallocAsync(size, s)
	require.NoError(t, err)
	return p
}

func usage(t tb, d *Device) device.PoolUsage {
	t.Helper()
	u, err := d.PoolUsage()
	require.NoError(t, err)
	return u
}

// TestPoolGrowsInChunks: the first allocation takes a chunk of PoolChunk
// bytes from the device's capacity; the next ones are carved from it,
// rounded to PoolAlignment, at rising addresses.
func TestPoolGrowsInChunks(t *testing.T) {
	d := newDev(t, Config{Capacity: GiB})
	a := mallocAsync(t, d, 1000, device.DefaultStream)
	b := mallocAsync(t, d, 1, device.DefaultStream)
	assert.Equal(t, a+1024, b)
	assert.Equal(t, device.PoolUsage{Reserved: PoolChunk, ReservedPeak: PoolChunk, Used: 1536, UsedPeak: 1536}, usage(t, d))
	assert.Equal(t, uint64(PoolChunk), d.BytesInUse(), "the chunk is charged against capacity")
	free, _, err := d.MemInfo()
	require.NoError(t, err)
	assert.Equal(t, GiB-PoolChunk, free)
	big := mallocAsync(t, d, 100*MiB+1, device.DefaultStream)
	assert.Equal(t, []PoolChunkInfo{{Ptr: a, Size: PoolChunk, Used: 1536}, {Ptr: big, Size: 102 * MiB, Used: 100*MiB + 512}}, d.PoolChunks())
	require.Error(t, d.Free(a), "a pool block is not Malloc's")
}

// TestPoolStreamOrderedReuse: a block freed on s is reused at once by s;
// by another stream only once s's work queued before the free is done.
func TestPoolStreamOrderedReuse(t *testing.T) {
	d := newDev(t, Config{Capacity: GiB})
	s, err := d.NewStream()
	require.NoError(t, err)
	other, err := d.NewStream()
	require.NoError(t, err)
	require.NoError(t, d.SetStreamBusy(s, true))
	_, err = d.RecordEvent(s) // work on s, pending
	require.NoError(t, err)

	a := mallocAsync(t, d, PoolChunk, s) // fills a chunk
	require.NoError(t, d.FreeAsync(a, s))
	b := mallocAsync(t, d, PoolChunk, other)
	assert.NotEqual(t, a, b, "the free waits for s's work: another stream may not reuse it")
	assert.Equal(t, uint64(2*PoolChunk), usage(t, d).Reserved)
	require.NoError(t, d.FreeAsync(b, other))

	c := mallocAsync(t, d, PoolChunk, s)
	assert.Equal(t, a, c, "s reuses its own free at once")
	require.NoError(t, d.FreeAsync(c, s))
	// Work queued on s after the free does not hold it back.
	_, err = d.RecordEvent(s)
	require.NoError(t, err)
	require.NoError(t, d.CompleteStream(s))
	_, err = d.RecordEvent(s)
	require.NoError(t, err)
	assert.Equal(t, a, mallocAsync(t, d, PoolChunk, other), "s's work before the free is done")
}

// TestPoolFreeAfterAWait: a free on a stream that waits for another
// stream's work is reusable elsewhere only once that work is done (how
// an allocator frees a block used on several streams: a stream waits for
// each, then frees).
func TestPoolFreeAfterAWait(t *testing.T) {
	d := newDev(t, Config{Capacity: GiB})
	busy, err := d.NewStream()
	require.NoError(t, err)
	unifier, err := d.NewStream()
	require.NoError(t, err)
	require.NoError(t, d.SetStreamBusy(busy, true))
	a := mallocAsync(t, d, PoolChunk, device.DefaultStream)
	e, err := d.RecordEvent(busy) // the block is in use on busy
	require.NoError(t, err)
	require.NoError(t, d.WaitEvent(unifier, e))
	require.NoError(t, d.ReleaseEvent(e))
	require.NoError(t, d.FreeAsync(a, unifier))
	assert.NotEqual(t, a, mallocAsync(t, d, PoolChunk, device.DefaultStream), "busy's work is not done")
	require.NoError(t, d.CompleteStream(busy))
	assert.Equal(t, a, mallocAsync(t, d, PoolChunk, device.DefaultStream))
}

// TestPoolReleaseThreshold: a synchronization returns idle chunks above
// the threshold to the device; 0 (the default) returns them all.
func TestPoolReleaseThreshold(t *testing.T) {
	for _, sync := range map[string]func(d *Device) error{
		"device": (*Device).Synchronize,
		"stream": func(d *Device) error { return d.SynchronizeStream(device.DefaultStream) },
		"event": func(d *Device) error {
			e, err := d.RecordEvent(device.DefaultStream)
			if err != nil {
				return err
			}
			return d.SynchronizeEvent(e)
		},
	} {
		d := newDev(t, Config{Capacity: GiB})
		var ps []device.Ptr
		for range 3 {
			ps = append(ps, mallocAsync(t, d, PoolChunk, device.DefaultStream))
		}
		require.NoError(t, d.SetReleaseThreshold(PoolChunk+1))
		for _, p := range ps[1:] {
			require.NoError(t, d.FreeAsync(p, device.DefaultStream))
		}
		assert.Equal(t, uint64(3*PoolChunk), usage(t, d).Reserved, "a free returns nothing")
		require.NoError(t, sync(d))
		assert.Equal(t, uint64(2*PoolChunk), usage(t, d).Reserved, "one idle chunk returned, one kept to stay above the threshold")
		assert.Equal(t, uint64(2*PoolChunk), d.BytesInUse())
		require.NoError(t, d.SetReleaseThreshold(0))
		require.NoError(t, sync(d))
		assert.Equal(t, uint64(PoolChunk), usage(t, d).Reserved, "the chunk with a live block stays")
		assert.Equal(t, []PoolChunkInfo{{Ptr: ps[0], Size: PoolChunk, Used: PoolChunk}}, d.PoolChunks())
		assert.Equal(t, uint64(3*PoolChunk), usage(t, d).ReservedPeak)
		assert.Equal(t, int64(2), d.Counters().PoolReleases)
	}
}

// TestTrimPool: TrimPool returns idle chunks, keeping at least keep bytes,
// and never a chunk whose free another stream's work still orders.
func TestTrimPool(t *testing.T) {
	d := newDev(t, Config{Capacity: GiB})
	s, err := d.NewStream()
	require.NoError(t, err)
	require.NoError(t, d.SetReleaseThreshold(^uint64(0)))
	var ps []device.Ptr
	for range 4 {
		ps = append(ps, mallocAsync(t, d, PoolChunk, device.DefaultStream))
	}
	for _, p := range ps {
		require.NoError(t, d.FreeAsync(p, device.DefaultStream))
	}
	require.NoError(t, d.Synchronize())
	assert.Equal(t, uint64(4*PoolChunk), usage(t, d).Reserved, "the threshold keeps everything")
	require.NoError(t, d.TrimPool(2*PoolChunk+1))
	assert.Equal(t, uint64(3*PoolChunk), usage(t, d).Reserved)

	require.NoError(t, d.SetStreamBusy(s, true))
	_, err = d.RecordEvent(s)
	require.NoError(t, err)
	p := mallocAsync(t, d, PoolChunk, s)
	require.NoError(t, d.FreeAsync(p, s))
	require.NoError(t, d.TrimPool(0))
	assert.Equal(t, []PoolChunkInfo{{Ptr: p, Size: PoolChunk}}, d.PoolChunks(), "the free on s is not done")
	require.NoError(t, d.CompleteStream(s))
	require.NoError(t, d.TrimPool(0))
	assert.Empty(t, d.PoolChunks())
	assert.Zero(t, d.BytesInUse())
}

// TestPoolOutOfMemory: when the device cannot hold a growth, MallocAsync
// fails with ErrOutOfMemory and changes nothing; a smaller chunk is taken
// when a whole PoolChunk does not fit.
func TestPoolOutOfMemory(t *testing.T) {
	d := newDev(t, Config{Capacity: 40 * MiB})
	mallocAsync(t, d, 30*MiB, device.DefaultStream)
	p := mallocAsync(t, d, 3*MiB, device.DefaultStream) // 2 MiB left in the chunk: grows by 4 MiB, not 32
	assert.Equal(t, uint64(36*MiB), usage(t, d).Reserved)
	before := stateOf(d)
	_, err := d.MallocAsync(5*MiB, device.DefaultStream)
	requireDeviceError(t, err, "malloc async", 0, device.ErrOutOfMemory)
	requireUnchanged(t, d, before, func(c *Counters) { c.FailedAsyncMallocs++ })
	require.NoError(t, d.FreeAsync(p, device.DefaultStream))
	mallocAsync(t, d, 4*MiB, device.DefaultStream) // served from the freed chunk

	d.FailNthMalloc(1)
	before = stateOf(d)
	_, err = d.MallocAsync(5*MiB, device.DefaultStream)
	requireDeviceError(t, err, "malloc async", 0, device.ErrOutOfMemory)
	requireUnchanged(t, d, before, func(c *Counters) { c.FailedAsyncMallocs++ })
}

// TestPoolBadArguments: bad sizes, streams and pointers fail with their
// sentinel and change nothing.
func TestPoolBadArguments(t *testing.T) {
	d := newDev(t, Config{Capacity: GiB})
	p := mallocAsync(t, d, 4096, device.DefaultStream)
	for _, c := range []struct {
		size     uint64
		s        device.Stream
		sentinel error
	}{{0, 0, device.ErrInvalidSize}, {^uint64(0), 0, device.ErrInvalidSize}, {1, 77, device.ErrInvalidStream}} {
		before := stateOf(d)
		_, err := d.MallocAsync(c.size, c.s)
		requireDeviceError(t, err, "malloc async", 0, c.sentinel)
		requireUnchanged(t, d, before, func(c *Counters) { c.FailedAsyncMallocs++ })
	}
	for _, c := range []struct {
		p        device.Ptr
		s        device.Stream
		sentinel error
	}{{p + 512, 0, device.ErrInvalidPointer}, {0, 0, device.ErrInvalidPointer}, {p, 77, device.ErrInvalidStream}} {
		before := stateOf(d)
		err := d.FreeAsync(c.p, c.s)
		requireDeviceError(t, err, "free async", 0, c.sentinel)
		requireUnchanged(t, d, before, func(c *Counters) { c.FailedAsyncFrees++ })
	}
	d.FailFrees(errFault)
	before := stateOf(d)
	require.ErrorIs(t, d.FreeAsync(p, 0), errFault)
	requireUnchanged(t, d, before, func(c *Counters) { c.FailedAsyncFrees++ })
	d.FailFrees(nil)
	require.NoError(t, d.FreeAsync(p, 0))
	require.ErrorIs(t, d.FreeAsync(p, 0), device.ErrInvalidPointer, "a double free")
}

// TestPoolPeaks: the peaks follow the highest values and ResetPoolPeaks
// sets them to the current ones.
func TestPoolPeaks(t *testing.T) {
	d := newDev(t, Config{Capacity: GiB})
	a := mallocAsync(t, d, 40*MiB, device.DefaultStream)
	b := mallocAsync(t, d, MiB, device.DefaultStream)
	require.NoError(t, d.FreeAsync(a, device.DefaultStream))
	require.NoError(t, d.Synchronize())
	assert.Equal(t, device.PoolUsage{Reserved: PoolChunk, ReservedPeak: 40*MiB + PoolChunk, Used: MiB, UsedPeak: 41 * MiB}, usage(t, d))
	require.NoError(t, d.ResetPoolPeaks())
	assert.Equal(t, device.PoolUsage{Reserved: PoolChunk, ReservedPeak: PoolChunk, Used: MiB, UsedPeak: MiB}, usage(t, d))
	require.NoError(t, d.FreeAsync(b, device.DefaultStream))
	assert.Equal(t, device.PoolUsage{Reserved: PoolChunk, ReservedPeak: PoolChunk, UsedPeak: MiB}, usage(t, d), "a free returns nothing to the device")
}

// poolModel is what the state machine knows: the live blocks, the frees
// not yet ordered before other streams' work, and each stream's queue.
type poolModel struct {
	d         *Device
	streams   []device.Stream
	busy      []bool
	queued    []uint64 // events recorded per stream
	completed []uint64
	live      map[device.Ptr]uint64 // rounded sizes
	liveOn    map[device.Ptr]int
	pending   []pendingFree
	threshold uint64
	usedPeak  uint64
	resvPeak  uint64
}

type pendingFree struct {
	lo, hi uint64
	stream int
	seq    uint64
}

func (m *poolModel) done(f pendingFree) bool { return m.completed[f.stream] >= f.seq }

// take removes a new block's bytes [lo, hi) from the pending frees it
// overlaps (its stream's own): those bytes are the new block's, ordered
// by its stream. What a pending free keeps on either side of the block
// stays pending: a small block carved from a large pending free leaves
// the rest of it waiting on the freeing stream's work.
func (m *poolModel) take(lo, hi uint64) {
	var out []pendingFree
	for _, f := range m.pending {
		if !(lo < f.hi && f.lo < hi) {
			out = append(out, f)
			continue
		}
		if f.lo < lo {
			out = append(out, pendingFree{lo: f.lo, hi: lo, stream: f.stream, seq: f.seq})
		}
		if hi < f.hi {
			out = append(out, pendingFree{lo: hi, hi: f.hi, stream: f.stream, seq: f.seq})
		}
	}
	m.pending = out
}

func (m *poolModel) prune() {
	out := m.pending[:0]
	for _, f := range m.pending {
		if !m.done(f) {
			out = append(out, f)
		}
	}
	m.pending = out
}

// TestPoolAgainstModel runs random allocations, frees, stream work,
// synchronizations, trims and threshold changes, and after each checks
// the pool against the model: blocks never overlap, each lies in a chunk;
// no stream gets bytes another stream freed before work that is not done;
// used and reserved add up; a stream's own free serves it without growth;
// growth fails only when the device has no room; and after a
// synchronization or trim no idle chunk is left that the rule would
// return.
func TestPoolAgainstModel(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		d := newDev(t, Config{Capacity: 256 * MiB, PageSize: 2 * MiB})
		m := &poolModel{d: d, streams: []device.Stream{device.DefaultStream}, live: map[device.Ptr]uint64{}, liveOn: map[device.Ptr]int{}}
		for range 2 {
			s, err := d.NewStream()
			require.NoError(t, err)
			m.streams = append(m.streams, s)
		}
		m.busy = make([]bool, 3)
		m.queued = make([]uint64, 3)
		m.completed = make([]uint64, 3)
		// Stream 1 starts busy with work pending, so that its frees wait.
		require.NoError(t, d.SetStreamBusy(m.streams[1], true))
		_, err := d.RecordEvent(m.streams[1])
		require.NoError(t, err)
		m.busy[1], m.queued[1] = true, 1
		sizes := rapid.OneOf(rapid.Uint64Range(1, 4096), rapid.Uint64Range(1, 8*MiB), rapid.Uint64Range(16*MiB, 100*MiB))
		check := func() {
			u := usage(t, d)
			var used uint64
			for _, size := range m.live {
				used += size
			}
			require.Equal(t, used, u.Used)
			var resv uint64
			chunks := d.PoolChunks()
			for _, c := range chunks {
				resv += c.Size
			}
			require.Equal(t, resv, u.Reserved)
			require.Equal(t, resv, d.BytesInUse(), "only the pool holds device memory")
			m.usedPeak, m.resvPeak = max(m.usedPeak, u.Used), max(m.resvPeak, u.Reserved)
			require.Equal(t, m.usedPeak, u.UsedPeak)
			require.Equal(t, m.resvPeak, u.ReservedPeak)
			d.mu.Lock()
			checkPoolLocked(t, d)
			d.mu.Unlock()
		}
		// idleAbove fails if a chunk that holds no block and no pending
		// free could go while keeping keep bytes.
		idleAbove := func(keep uint64) {
			u := usage(t, d)
			for _, c := range d.PoolChunks() {
				if c.Used != 0 || u.Reserved < keep {
					continue
				}
				held := false
				for _, f := range m.pending {
					held = held || (f.lo < uint64(c.Ptr)+c.Size && uint64(c.Ptr) < f.hi)
				}
				if !held {
					require.Less(t, u.Reserved-c.Size, keep, "idle chunk %v of %d left with %d reserved, keep %d", c.Ptr, c.Size, u.Reserved, keep)
				}
			}
		}
		t.Repeat(map[string]func(*rapid.T){
			"malloc": func(t *rapid.T) {
				size := sizes.Draw(t, "size")
				si := rapid.IntRange(0, 2).Draw(t, "stream")
				room := d.capacity - d.BytesInUse()
				p, err := d.MallocAsync(size, m.streams[si])
				if err != nil {
					require.ErrorIs(t, err, device.ErrOutOfMemory)
					pages, _ := d.pagesFor(size)
					require.Greater(t, pages, room, "growth failed with room for it")
					check()
					return
				}
				rounded := (size + PoolAlignment - 1) &^ (PoolAlignment - 1)
				lo, hi := uint64(p), uint64(p)+rounded
				for q, n := range m.live {
					require.False(t, lo < uint64(q)+n && uint64(q) < hi, "%v+%d overlaps live %v+%d", p, rounded, q, n)
				}
				for _, f := range m.pending {
					if f.stream != si {
						require.False(t, lo < f.hi && f.lo < hi, "stream %d got bytes stream %d freed before pending work", si, f.stream)
					}
				}
				m.take(lo, hi)
				m.live[p], m.liveOn[p] = rounded, si
				check()
			},
			"free": func(t *rapid.T) {
				if len(m.live) == 0 {
					t.Skip("nothing live")
				}
				ps := slices.Sorted(maps.Keys(m.live))
				p := rapid.SampledFrom(ps).Draw(t, "block")
				si := rapid.IntRange(0, 2).Draw(t, "stream")
				require.NoError(t, d.FreeAsync(p, m.streams[si]))
				m.queued[si]++ // the free is queued on the stream
				if !m.busy[si] {
					m.completed[si] = m.queued[si]
				}
				f := pendingFree{lo: uint64(p), hi: uint64(p) + m.live[p], stream: si, seq: m.queued[si]}
				delete(m.live, p)
				delete(m.liveOn, p)
				if !m.done(f) {
					m.pending = append(m.pending, f)
				}
				// The same stream gets the same size back without growth.
				if rapid.Bool().Draw(t, "again") {
					before := usage(t, d).Reserved
					q := mallocAsync(t, d, f.hi-f.lo, m.streams[si])
					require.Equal(t, before, usage(t, d).Reserved, "a stream's own free serves it")
					m.take(uint64(q), uint64(q)+f.hi-f.lo)
					m.live[q], m.liveOn[q] = f.hi-f.lo, si
				}
				check()
			},
			"work": func(t *rapid.T) {
				si := rapid.IntRange(0, 2).Draw(t, "stream")
				_, err := d.RecordEvent(m.streams[si])
				require.NoError(t, err)
				m.queued[si]++
				if !m.busy[si] {
					m.completed[si] = m.queued[si]
				}
				check()
			},
			"busy": func(t *rapid.T) {
				si := rapid.IntRange(1, 2).Draw(t, "stream")
				b := rapid.Bool().Draw(t, "busy")
				require.NoError(t, d.SetStreamBusy(m.streams[si], b))
				m.busy[si] = b
				if !b {
					m.completed[si] = m.queued[si]
					m.prune()
				}
				check()
			},
			"complete": func(t *rapid.T) {
				si := rapid.IntRange(1, 2).Draw(t, "stream")
				require.NoError(t, d.CompleteStream(m.streams[si]))
				m.completed[si] = m.queued[si]
				m.prune()
				check()
			},
			"synchronize": func(t *rapid.T) {
				require.NoError(t, d.Synchronize())
				copy(m.completed, m.queued)
				m.prune()
				check()
				idleAbove(m.threshold)
			},
			"threshold": func(t *rapid.T) {
				m.threshold = rapid.SampledFrom([]uint64{0, PoolChunk, 100 * MiB, ^uint64(0)}).Draw(t, "threshold")
				require.NoError(t, d.SetReleaseThreshold(m.threshold))
			},
			"trim": func(t *rapid.T) {
				keep := rapid.SampledFrom([]uint64{0, PoolChunk, 100 * MiB}).Draw(t, "keep")
				require.NoError(t, d.TrimPool(keep))
				check()
				idleAbove(keep)
			},
			"resetPeaks": func(t *rapid.T) {
				require.NoError(t, d.ResetPoolPeaks())
				u := usage(t, d)
				m.usedPeak, m.resvPeak = u.Used, u.Reserved
				check()
			},
		})
	})
}

// checkPoolLocked checks the pool's invariants (see asyncPool).
func checkPoolLocked(t tb, d *Device) {
	t.Helper()
	pl := &d.pool
	var resv, used uint64
	blocks := 0
	for k, c := range pl.chunks {
		if k > 0 {
			prev := pl.chunks[k-1]
			require.LessOrEqual(t, prev.base+prev.size, c.base, "chunks sorted and disjoint")
		}
		resv += c.size
		at := c.base
		var free uint64
		pending := 0
		for k, f := range c.frags {
			if !f.live {
				free += f.size
				if f.stream >= 0 {
					pending++
				}
			}
			if k > 0 && !f.live {
				prev := c.frags[k-1]
				require.False(t, !prev.live && prev.stream == f.stream, "neighbours free with the same tag are merged")
			}
			require.Equal(t, at, f.addr, "fragments cover the chunk")
			require.NotZero(t, f.size)
			at += f.size
			if f.live {
				used += f.size
				blocks++
				require.Same(t, c, pl.blocks[device.Ptr(f.addr)])
			}
		}
		require.Equal(t, c.base+c.size, at, "fragments cover the chunk")
		require.Equal(t, free, c.free, "the chunk's free bytes")
		require.Equal(t, pending, c.pending, "the chunk's tagged fragments")
	}
	require.Equal(t, resv, pl.reserved)
	require.Equal(t, used, pl.used)
	require.Len(t, pl.blocks, blocks)
	require.GreaterOrEqual(t, pl.reservedPeak, pl.reserved)
	require.GreaterOrEqual(t, pl.usedPeak, pl.used)
}
