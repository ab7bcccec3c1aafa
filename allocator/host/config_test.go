package host

import (
	"bytes"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sync/errgroup"

	"github.com/gpumem/gpumem/allocator"
	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/device/faulty"
	"github.com/gpumem/gpumem/device/sim"
	"github.com/gpumem/gpumem/internal/simtest"
)

// checkInvariants checks the package doc's invariants: every block is
// exactly one of allocated, waiting for events, or on its class's free
// list; the stats count the blocks and host allocations held.
func checkInvariants(t *testing.T, a *Allocator) {
	t.Helper()
	a.mu.Lock()
	defer a.mu.Unlock()
	onList := map[*block]int{}
	for i, l := range a.free {
		for _, b := range l {
			onList[b]++
			require.Equal(t, i, b.class, "a block on the list of its class")
			require.Equal(t, classSize(b.class), b.size)
		}
	}
	var active, activeBytes, allocBytes, segs, reserved int64
	for p, b := range a.blocks {
		require.Same(t, p, &b.mem[0])
		states := onList[b]
		if b.allocated {
			states++
		}
		if b.events > 0 {
			states++
		}
		require.Equal(t, 1, states, "a block is allocated, waiting or free, once")
		if b.allocated || b.events > 0 {
			active++
			activeBytes += int64(b.size)
		}
		allocBytes += int64(b.size)
		if !b.reserved {
			segs++
			reserved += int64(len(b.mem))
		}
	}
	require.Len(t, onList, len(a.blocks)-int(active), "every free block is a block")
	if a.reserve != nil {
		segs++
		reserved += int64(len(a.reserve))
	}
	require.EqualValues(t, len(a.blocks), a.st.Allocations.Current)
	require.Equal(t, allocBytes, a.st.AllocatedBytes.Current)
	require.Equal(t, active, a.st.ActiveRequests.Current)
	require.Equal(t, activeBytes, a.st.ActiveBytes.Current)
	require.Equal(t, segs, a.st.Segments.Current)
	require.Equal(t, reserved, a.st.ReservedBytes.Current)
}

func newHostWith(t *testing.T, cfg Config, opts ...simtest.Option) (*Allocator, *sim.Device) {
	t.Helper()
	dev := simtest.New(t, opts...)
	a, err := New(dev, cfg)
	require.NoError(t, err)
	return a, dev
}

func TestConfigFromConfString(t *testing.T) {
	conf, err := allocator.ParseConf("pinned_use_cuda_host_register:True,pinned_num_register_threads:8," +
		"pinned_reserve_segment_size_mb:2,pinned_use_background_threads:True,pinned_free_catch_all:True")
	require.NoError(t, err)
	a, _ := newHostWith(t, Config{Pinned: conf.Pinned})
	t.Cleanup(func() { _ = a.Close() })
	assert.Equal(t, allocator.PinnedConfig{UseHostRegister: true, NumRegisterThreads: 8, ReserveSegmentSize: 2 << 20,
		UseBackgroundThreads: true, FreeCatchAll: true}, a.Config().Pinned)
}

func TestConfigRefused(t *testing.T) {
	dev := simtest.New(t)
	for _, c := range []struct {
		cfg  Config
		want []string
	}{
		{Config{Pinned: allocator.PinnedConfig{NumRegisterThreads: 3}}, []string{"NumRegisterThreads 3 must be a power of two up to 128"}},
		{Config{Pinned: allocator.PinnedConfig{NumRegisterThreads: 256}}, []string{"NumRegisterThreads 256"}},
		{Config{Pinned: allocator.PinnedConfig{ReserveSegmentSize: 1000}}, []string{"ReserveSegmentSize 1000 is not a multiple of 4 KiB"}},
		{Config{Pinned: allocator.PinnedConfig{ReserveSegmentSize: 1 << 61}}, []string{"is more than 1 EiB"}},
		{Config{Rounding: 7}, []string{"Rounding 7 is not RoundPowerOfTwo or RoundEighths"}},
		{Config{Rounding: 2, Pinned: allocator.PinnedConfig{NumRegisterThreads: 5, ReserveSegmentSize: 1}},
			[]string{"Rounding 2", "NumRegisterThreads 5", "ReserveSegmentSize 1 "}},
	} {
		a, err := New(dev, c.cfg)
		require.Error(t, err, "%+v", c.cfg)
		assert.Nil(t, a)
		for _, w := range c.want {
			assert.Contains(t, err.Error(), w)
		}
		assert.Contains(t, err.Error(), "host: invalid config")
	}
	assert.Zero(t, dev.Counters().HostAllocs, "a refused config touches nothing")
	assert.Equal(t, "RoundEighths", RoundEighths.String())
	assert.Equal(t, "Rounding(9)", Rounding(9).String())
}

func TestClasses(t *testing.T) {
	pow2, eighths := Config{}, Config{Rounding: RoundEighths}
	for _, c := range []struct {
		size, pow2, eighths uint64
	}{
		{1, 1, 1}, {1000, 1024, 1024}, {1 << 20, 1 << 20, 1 << 20},
		{1<<20 + 1, 2 << 20, 1<<20 + 128<<10},
		{65 << 20, 128 << 20, 72 << 20},
		{4096 * 11008 * 2, 128 << 20, 88 << 20}, // a LLaMA-7B MLP weight in float16
		{250 << 20, 256 << 20, 256 << 20},
		{1 << 62, 1 << 62, 1 << 62},
	} {
		n, i := pow2.class(c.size)
		assert.Equal(t, c.pow2, n, "power of two, %d", c.size)
		assert.Equal(t, n, classSize(i))
		n, i = eighths.class(c.size)
		assert.Equal(t, c.eighths, n, "eighths, %d", c.size)
		assert.Equal(t, n, classSize(i))
	}
	// Classes grow with sizes, and an eighths block is at most 1/8 more
	// than its request above 1 MiB.
	prev := 0
	for size := uint64(1 << 20); size < 1<<32; size += size/37 + 4093 {
		n, i := eighths.class(size)
		require.GreaterOrEqual(t, i, prev)
		require.GreaterOrEqual(t, n, size)
		require.LessOrEqual(t, n-size, size/8)
		prev = i
	}
}

func TestRoundEighthsReuse(t *testing.T) {
	a, dev := newHostWith(t, Config{Rounding: RoundEighths})
	p, err := a.Alloc(1<<20 + 600<<10) // 1.625 MiB: the 1.625 MiB step
	require.NoError(t, err)
	assert.Equal(t, 1<<20+640<<10, cap(p))
	require.NoError(t, a.Free(p))
	q, err := a.Alloc(1<<20 + 100<<10) // 1.125 MiB step: none free; 1.625 MiB is under twice the request
	require.NoError(t, err)
	assert.Same(t, &p[0], &q[0], "a free block of a step up is reused")
	require.NoError(t, a.Free(q))
	r, err := a.Alloc(600 << 10) // 1 MiB class; 1.625 MiB is more than twice 600 KiB
	require.NoError(t, err)
	assert.NotSame(t, &p[0], &r[0])
	assert.EqualValues(t, 2, dev.Counters().HostAllocs)
	checkInvariants(t, a)
	require.NoError(t, a.Free(r))
	require.NoError(t, a.Close())
	assert.Zero(t, dev.Counters().HostBytesInUse)
}

// pagedHost fills the memory it hands out with 0xff, so that a test sees
// which pages were touched (zeroed).
type pagedHost struct {
	device.HostMemory
	short bool // return one byte less than asked
	freed int
}

func (h *pagedHost) HostAlloc(n uint64) ([]byte, error) {
	b, err := h.HostMemory.HostAlloc(n)
	if err == nil {
		for i := range b {
			b[i] = 0xff
		}
		if h.short {
			b = b[:len(b)-1]
		}
	}
	return b, err
}

func (h *pagedHost) HostFree(b []byte) error { h.freed++; return h.HostMemory.HostFree(b) }

func everyPageTouched(mem []byte) bool {
	for p := 0; p < len(mem); p += pageSize {
		if bytes.IndexByte(mem[p:min(p+pageSize, len(mem))], 0) < 0 {
			return false
		}
	}
	return true
}

func TestHostRegisterTouchesPages(t *testing.T) {
	for _, c := range []struct {
		pinned  allocator.PinnedConfig
		size    uint64
		touched bool
		threads int
	}{
		{allocator.PinnedConfig{}, 1 << 20, false, 0},
		{allocator.PinnedConfig{NumRegisterThreads: 8}, 1 << 20, false, 0}, // no effect without register, as in PyTorch
		{allocator.PinnedConfig{UseHostRegister: true}, 1 << 20, true, 1},
		{allocator.PinnedConfig{UseHostRegister: true, NumRegisterThreads: 8}, 1 << 20, true, 8},
		{allocator.PinnedConfig{UseHostRegister: true, NumRegisterThreads: 8}, 16 << 10, true, 1}, // under 4 KiB a thread
		{allocator.PinnedConfig{UseHostRegister: true, NumRegisterThreads: 4}, 3<<20 + 5, true, 4},
	} {
		cfg := Config{Pinned: c.pinned}
		assert.Equal(t, c.threads, cfg.registerThreads(roundUp(c.size, 1)), "%+v", c.pinned)
		sd := simtest.New(t)
		h := &pagedHost{HostMemory: sd}
		a, err := New(device.Compose(sd, device.Capabilities{HostMemory: h, StreamChecker: sd}), cfg)
		require.NoError(t, err)
		p, err := a.Alloc(c.size)
		require.NoError(t, err)
		assert.Equal(t, c.touched, everyPageTouched(p[:cap(p)]), "%+v, %d bytes", c.pinned, c.size)
		assert.EqualValues(t, 1, a.Stats().NumHostAlloc, "one host allocation per block, register or not")
		require.NoError(t, a.Free(p))
		require.NoError(t, a.Close())
		assert.EqualValues(t, 1, a.Stats().NumHostFree)
	}
	// Every part of an odd length is touched, by any number of goroutines.
	for _, n := range []int{1, 4095, 4097, 3*pageSize + 17, 64 * pageSize} {
		for _, threads := range []int{1, 2, 4, 8, 128} {
			mem := bytes.Repeat([]byte{0xff}, n)
			touchPages(mem, threads)
			require.True(t, everyPageTouched(mem), "%d bytes, %d goroutines", n, threads)
		}
	}
}

func TestShortHostAllocIsReturned(t *testing.T) {
	sd := simtest.New(t)
	h := &pagedHost{HostMemory: sd, short: true}
	a, err := New(device.Compose(sd, device.Capabilities{HostMemory: h}), Config{})
	require.NoError(t, err)
	_, err = a.Alloc(4096)
	require.ErrorContains(t, err, "device returned 4095 bytes for 4096")
	assert.Equal(t, 1, h.freed, "the short allocation went back")
	assert.Zero(t, sd.Counters().HostBytesInUse)
	assert.Equal(t, Stats{}, a.Stats())
}

func TestReserveSegment(t *testing.T) {
	conf, err := allocator.ParseConf("pinned_reserve_segment_size_mb:1")
	require.NoError(t, err)
	a, dev := newHostWith(t, Config{Pinned: conf.Pinned})
	var ps [][]byte
	for range 256 { // 1024-byte blocks take 4 KiB each: 256 fill 1 MiB
		p, err := a.Alloc(1000)
		require.NoError(t, err)
		assert.Equal(t, 1024, cap(p))
		ps = append(ps, p)
	}
	st := a.Stats()
	assert.EqualValues(t, 1, dev.Counters().HostAllocs, "the reserve segment alone")
	assert.EqualValues(t, 1, st.NumHostAlloc)
	assert.EqualValues(t, 1<<20, st.ReservedBytes.Current)
	assert.EqualValues(t, 256, st.Allocations.Current)
	assert.EqualValues(t, 256*1024, st.AllocatedBytes.Current)
	big, err := a.Alloc(5000) // the reserve is full: a host allocation
	require.NoError(t, err)
	assert.EqualValues(t, 2, dev.Counters().HostAllocs)
	checkInvariants(t, a)

	for _, p := range ps[1:] {
		require.NoError(t, a.Free(p))
	}
	require.NoError(t, a.Free(big))
	require.NoError(t, a.EmptyCache())
	assert.EqualValues(t, 1, dev.Counters().HostFrees, "EmptyCache returns the 8 KiB block, keeps the carved ones")
	again, err := a.Alloc(900)
	require.NoError(t, err)
	assert.Same(t, &ps[len(ps)-1][0], &again[0], "a carved block is still cached")
	assert.EqualValues(t, 2, dev.Counters().HostAllocs)
	checkInvariants(t, a)

	require.NoError(t, a.Close())
	assert.EqualValues(t, 1<<20, a.Stats().ReservedBytes.Current, "two carved blocks are in use: the segment stays")
	_, err = a.Alloc(10)
	assert.ErrorIs(t, err, ErrClosed)
	require.NoError(t, a.Free(again))
	require.NoError(t, a.Free(ps[0]))
	require.NoError(t, a.Close())
	checkInvariants(t, a)
	st = a.Stats()
	assert.Zero(t, st.ReservedBytes.Current)
	assert.Zero(t, st.Allocations.Current)
	assert.Equal(t, st.NumHostAlloc, st.NumHostFree)
	assert.Zero(t, dev.Counters().HostBytesInUse, "nothing left on the device")
}

func TestHostAllocFailuresLeakNothing(t *testing.T) {
	for _, c := range []struct {
		name string
		cfg  Config
	}{
		{"plain", Config{}},
		{"reserve", Config{Pinned: allocator.PinnedConfig{ReserveSegmentSize: 64 << 10}}},
		{"register, background, eighths", Config{Rounding: RoundEighths, Pinned: allocator.PinnedConfig{
			UseHostRegister: true, NumRegisterThreads: 4, UseBackgroundThreads: true}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			sd := simtest.New(t, simtest.HostCapacity(8<<20))
			inj := faulty.New(sd)
			a, err := New(inj.Device(), c.cfg)
			require.NoError(t, err)
			s, _ := sd.NewStream()
			var held [][]byte
			// Every third host allocation fails; the sizes run into the
			// device's capacity too.
			_, err = inj.Add(faulty.Rule{Call: device.CallHostAlloc, Nth: 1, Count: 1, Err: device.ErrOutOfMemory})
			require.NoError(t, err)
			for i := range 60 {
				if i%3 == 0 {
					_, err = inj.Add(faulty.Rule{Call: device.CallHostAlloc, Nth: 3, Count: 1})
					require.NoError(t, err)
				}
				before := a.Stats()
				p, err := a.Alloc(uint64(1+i%7) * 300 << 10)
				if err != nil {
					after := a.Stats()
					assert.Equal(t, before.Allocations, after.Allocations, "a failed Alloc made no block")
					assert.Equal(t, before.ActiveRequests.Allocated, after.ActiveRequests.Allocated, "nothing handed out")
					checkInvariants(t, a)
					continue
				}
				held = append(held, p)
				if i%2 == 0 {
					require.NoError(t, a.RecordStream(p, s))
				}
				if len(held) > 4 {
					require.NoError(t, a.Free(held[0]))
					held = held[1:]
				}
			}
			assert.NotEmpty(t, inj.Fired())
			for _, p := range held {
				require.NoError(t, a.Free(p))
			}
			require.NoError(t, a.Close())
			checkInvariants(t, a)
			st := a.Stats()
			assert.Zero(t, st.ReservedBytes.Current)
			assert.Equal(t, st.NumHostAlloc, st.NumHostFree)
			cnt := sd.Counters()
			assert.Zero(t, cnt.HostBytesInUse, "no pinned memory left behind")
			assert.Equal(t, cnt.HostAllocs, cnt.HostFrees)
		})
	}
}

func TestBackgroundThreads(t *testing.T) {
	run := func(t *testing.T, background bool) (*Allocator, *sim.Device, device.Stream) {
		a, dev := newHostWith(t, Config{Pinned: allocator.PinnedConfig{UseBackgroundThreads: background}})
		s, _ := dev.NewStream()
		require.NoError(t, dev.SetStreamBusy(s, true))
		p, err := a.Alloc(1 << 16)
		require.NoError(t, err)
		require.NoError(t, a.RecordStream(p, s))
		require.NoError(t, a.Free(p))
		require.NoError(t, dev.CompleteStream(s))
		return a, dev, s
	}
	t.Run("off", func(t *testing.T) {
		a, _, _ := run(t, false)
		time.Sleep(5 * backgroundInterval)
		assert.EqualValues(t, 1, a.Stats().ActiveRequests.Current, "no one checks the event until the next Alloc")
		assert.Nil(t, a.bgStop)
		require.NoError(t, a.Close())
	})
	t.Run("on", func(t *testing.T) {
		a, _, _ := run(t, true)
		require.NotNil(t, a.bgStop, "started at the first miss")
		require.Eventually(t, func() bool { return a.Stats().ActiveRequests.Current == 0 },
			10*time.Second, backgroundInterval, "the goroutine completed the free without an Alloc")
		done := a.bgDone
		require.NoError(t, a.Close())
		select {
		case <-done:
		default:
			t.Fatal("Close returned before the goroutine stopped")
		}
		require.NoError(t, a.Close(), "Close twice")
		_, err := a.Alloc(1)
		assert.ErrorIs(t, err, ErrClosed)
		assert.Nil(t, a.bgStop, "not restarted")
	})
}

// TestBackgroundConcurrent runs Alloc, RecordStream and Free on several
// goroutines while the background goroutine checks events (run it with
// -race).
func TestBackgroundConcurrent(t *testing.T) {
	for _, r := range []Rounding{RoundPowerOfTwo, RoundEighths} {
		a, dev := newHostWith(t, Config{Rounding: r, Pinned: allocator.PinnedConfig{UseBackgroundThreads: true, ReserveSegmentSize: 256 << 10}})
		s, _ := dev.NewStream()
		var g errgroup.Group
		for w := range 4 {
			g.Go(func() error {
				for i := range 300 {
					p, err := a.Alloc(uint64(1+(i*(w+1))%3000) * 700)
					if err == nil && i%2 == 0 {
						err = a.RecordStream(p, s)
					}
					if err == nil {
						err = a.Free(p)
					}
					if err == nil && i%50 == 0 {
						err = a.EmptyCache()
					}
					if err != nil {
						return err
					}
				}
				return nil
			})
		}
		g.Go(func() error {
			for range 100 {
				if err := dev.CompleteStream(s); err != nil {
					return err
				}
				_ = a.Stats()
			}
			return nil
		})
		require.NoError(t, g.Wait())
		require.NoError(t, a.Close())
		checkInvariants(t, a)
		st := a.Stats()
		assert.Zero(t, st.ActiveRequests.Current)
		assert.Zero(t, st.ReservedBytes.Current)
		assert.Equal(t, st.NumHostAlloc, st.NumHostFree)
		assert.Zero(t, dev.Counters().HostBytesInUse)
	}
}

func TestFreeCatchAll(t *testing.T) {
	setup := func(t *testing.T, catchAll bool) (*Allocator, *faulty.Injector, []byte) {
		sd := simtest.New(t)
		inj := faulty.New(sd)
		a, err := New(inj.Device(), Config{Pinned: allocator.PinnedConfig{FreeCatchAll: catchAll}})
		require.NoError(t, err)
		s, _ := sd.NewStream()
		p, err := a.Alloc(4096)
		require.NoError(t, err)
		require.NoError(t, a.RecordStream(p, s))
		// No event can be recorded, and the stream cannot be synchronized
		// in its place.
		for _, c := range []device.Call{device.CallRecordEvent, device.CallSynchronizeStream} {
			_, err = inj.Add(faulty.Rule{Call: c, Count: 1})
			require.NoError(t, err)
		}
		return a, inj, p
	}
	t.Run("off", func(t *testing.T) {
		a, _, p := setup(t, false)
		before := a.Stats()
		err := a.Free(p)
		require.ErrorIs(t, err, faulty.ErrInjected)
		assert.Equal(t, before, a.Stats(), "the failed Free changed nothing")
		require.NoError(t, a.Free(p), "freed once the device works")
		require.NoError(t, a.Close())
		assert.Zero(t, a.Stats().ReservedBytes.Current)
	})
	t.Run("on", func(t *testing.T) {
		a, _, p := setup(t, true)
		require.NoError(t, a.Free(p), "the device error is caught")
		st := a.Stats()
		assert.EqualValues(t, 1, st.FreeErrorsCaught)
		assert.EqualValues(t, 1, st.ActiveRequests.Current, "the block stays out of the cache")
		q, err := a.Alloc(4096)
		require.NoError(t, err)
		assert.NotSame(t, &p[0], &q[0], "not reused: its copy may still run")
		require.NoError(t, a.Free(q))
		assert.ErrorIs(t, a.Free(make([]byte, 1)), device.ErrInvalidPointer, "a caller's mistake is still an error")
		assert.EqualValues(t, 1, a.Stats().FreeErrorsCaught)
		checkInvariants(t, a)
		require.NoError(t, a.Close())
	})
}

// TestCachedPathAllocatesNothing: an Alloc served by the cache and its
// Free make no Go allocation, whatever the configuration.
func TestCachedPathAllocatesNothing(t *testing.T) {
	for _, cfg := range []Config{
		{},
		{Rounding: RoundEighths},
		{Pinned: allocator.PinnedConfig{UseBackgroundThreads: true, ReserveSegmentSize: 1 << 20, UseHostRegister: true}},
	} {
		a, _ := newHostWith(t, cfg)
		for _, n := range []uint64{1000, 3 << 20} {
			p, err := a.Alloc(n)
			require.NoError(t, err)
			require.NoError(t, a.Free(p))
			allocs := testing.AllocsPerRun(100, func() {
				p, _ := a.Alloc(n)
				_ = a.Free(p)
			})
			assert.Zero(t, allocs, "%+v, %d bytes", cfg, n)
		}
		require.NoError(t, a.Close())
	}
}
