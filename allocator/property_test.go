package allocator

import (
	"errors"
	"fmt"
	"slices"
	"testing"

	"pgregory.net/rapid"

	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/device/sim"
	"github.com/gpumem/gpumem/internal/simtest"
	"github.com/gpumem/gpumem/stats"
)

// machine is a rapid state machine driving one allocator on a small
// simulated device with random requests on three streams, RecordStream,
// stream completion, EmptyCache, injected device failures and stat
// resets. After every action it runs the invariant checker and checks the
// model's own properties:
//
//   - live blocks never overlap and each lies in a segment of its stream,
//     or, under the low_fragmentation policy, in one of another stream
//     that lent it after the borrowing stream was made to wait on the
//     device for the lender's work;
//   - a block freed after RecordStream is not handed out again while the
//     work of a recorded stream is still pending;
//   - every stat keeps Current <= Peak, and counters never go down between
//     resets.
type machine struct {
	a       *Allocator
	dev     *sim.Device
	streams []device.Stream
	live    map[device.Ptr]liveBlock
	// held are ranges freed while recorded on a busy stream, by stream:
	// they must not be reused until that stream's work completes.
	held map[device.Stream][]span
	busy map[device.Stream]bool
	prev stats.DeviceStats

	// An independent count of what the stats must say: allocations and
	// frees since the last accumulated reset, out-of-memory errors, and the
	// peak number of live blocks since the last peak reset.
	nAllocs, nFrees, nOOMs int64
	peakLive               int64
	// device calls before the last accumulated reset
	devAllocBase, devFreeBase int64

	// Lending (the low_fragmentation policy): ops counts Alloc and Free
	// calls; freed lists the ranges freed, with the op that freed them;
	// lastWait is, per (borrower, lender), the op of the last Alloc whose
	// lend made the borrower wait on the device.
	ops      int
	freed    []freedSpan
	lastWait map[[2]device.Stream]int

	// pattern is the sizes of the step that Step repeats, drawn once;
	// loop those of the loop that Loop runs, unmarked.
	pattern, loop []uint64
	// side is where SideStep allocates on a side stream, drawn once.
	side int
	// cache is the block CacheStep keeps past its boundary, 0 when none,
	// and cacheSize its size, which grows by a token each CacheStep.
	cache     device.Ptr
	cacheSize uint64
}

type freedSpan struct {
	span
	op int
}

type liveBlock struct {
	size   uint64
	stream device.Stream
	uses   []device.Stream
}

type span struct {
	lo, hi device.Ptr
}

func newMachine(t *rapid.T) *machine {
	capacity := rapid.SampledFrom([]uint64{64 * mib, 200 * mib, gib}).Draw(t, "capacity")
	dev := simtest.New(t, simtest.Capacity(capacity))
	var cfg Config
	cfg.ExpandableSegments = rapid.Bool().Draw(t, "expandable")
	if rapid.Bool().Draw(t, "maxSplit") {
		cfg.MaxSplitSize = 32 * mib
	}
	if rapid.Bool().Draw(t, "gc") {
		cfg.GarbageCollectionThreshold = 0.5
		cfg.MemoryFraction = 0.8
	}
	if rapid.Bool().Draw(t, "roundup") {
		for i := range cfg.RoundupPower2Divisions {
			cfg.RoundupPower2Divisions[i] = 4
		}
	}
	if pol := rapid.IntRange(0, 2).Draw(t, "policy"); pol > 0 {
		cfg.Policy = PolicyLowFragmentation
		if pol == 2 {
			cfg.Policy = PolicyPlanned
		}
		cfg.LowFrag = LowFragConfig{
			LargePage:     rapid.SampledFrom([]uint64{0, 4 * mib, 20 * mib}).Draw(t, "large page"),
			MapAhead:      rapid.SampledFrom([]uint64{0, mib, 64 * mib}).Draw(t, "map ahead"),
			Slack:         rapid.SampledFrom([]float64{0, 0.001, 0.2}).Draw(t, "slack"),
			Victims:       rapid.IntRange(0, 3).Draw(t, "victims"),
			MinAge:        rapid.IntRange(0, 3).Draw(t, "min age"),
			FitWindow:     rapid.IntRange(0, 3).Draw(t, "fit window"),
			NoReclaim:     rapid.Bool().Draw(t, "no reclaim"),
			NoCrossStream: rapid.Bool().Draw(t, "no cross stream"),
		}
	}
	var d device.Device = dev
	if rapid.Bool().Draw(t, "unaligned") {
		d = offsetDevice{dev} // segments share 2 MiB chunks of addresses
	}
	a := onDevice(t, d, cfg)
	m := &machine{a: a, dev: dev, live: map[device.Ptr]liveBlock{},
		held: map[device.Stream][]span{}, busy: map[device.Stream]bool{}, lastWait: map[[2]device.Stream]int{}}
	m.streams = simtest.Streams(t, dev, 2)
	return m
}

func (m *machine) size(t *rapid.T) uint64 {
	switch rapid.IntRange(0, 3).Draw(t, "sizeClass") {
	case 0:
		return rapid.Uint64Range(0, 4096).Draw(t, "tiny")
	case 1:
		return rapid.Uint64Range(4097, mib).Draw(t, "small")
	case 2:
		return rapid.Uint64Range(mib+1, 12*mib).Draw(t, "medium")
	}
	return rapid.Uint64Range(12*mib, 80*mib).Draw(t, "large")
}

func (m *machine) Alloc(t *rapid.T) {
	size := m.size(t)
	s := rapid.SampledFrom(m.streams).Draw(t, "stream")
	m.alloc(t, size, s, rapid.IntRange(0, 9).Draw(t, "fail") == 0)
}

// alloc allocates size bytes on stream s, the device failing its next
// malloc when fail is set, checks the model's properties and returns
// the address (0 when the allocator is out of memory).
func (m *machine) alloc(t *rapid.T, size uint64, s device.Stream, fail bool) device.Ptr {
	if fail {
		m.dev.FailNthMalloc(1)
	}
	syncs := m.a.Stats().NumSyncAllStreams
	waits := m.deviceWaits()
	p, err := m.a.Alloc(size, s)
	m.dev.FailNthMalloc(0)
	if m.a.Stats().NumSyncAllStreams != syncs {
		// The out-of-memory path waited for every event: held memory
		// became reusable.
		clear(m.held)
	}
	if err != nil {
		var oom *OutOfMemoryError
		if !errors.As(err, &oom) || !errors.Is(err, device.ErrOutOfMemory) {
			t.Fatalf("Alloc(%d): unexpected error %v", size, err)
		}
		m.nOOMs++
		return 0
	}
	if size == 0 {
		if p != 0 {
			t.Fatalf("Alloc(0) = %v", p)
		}
		return 0
	}
	if _, dup := m.live[p]; dup {
		t.Fatalf("Alloc returned live address %v", p)
	}
	lo, hi := p, p+device.Ptr(size)
	for q, b := range m.live {
		if lo < q+device.Ptr(b.size) && q < hi {
			t.Fatalf("block %v+%d overlaps live %v+%d", p, size, q, b.size)
		}
	}
	for hs, spans := range m.held {
		if n, err := m.dev.PendingWork(hs); err == nil && n == 0 {
			// Every event recorded on hs has finished, whatever finished
			// it (a host synchronization of hs that the allocator made,
			// for example before unmapping pages): its held memory is
			// safe to reuse.
			delete(m.held, hs)
			continue
		}
		for _, sp := range spans {
			if lo < sp.hi && sp.lo < hi {
				t.Fatalf("block %v+%d reuses memory freed while stream %d still had work", p, size, hs)
			}
		}
	}
	m.live[p] = liveBlock{size: size, stream: s}
	m.ops++
	if seg := m.segmentOf(p); seg.Stream != s {
		if m.a.Config().Policy == PolicyFaithful {
			t.Fatalf("block %v for stream %d lies in a segment of stream %d", p, s, seg.Stream)
		}
		key := [2]device.Stream{s, seg.Stream}
		if m.deviceWaits() > waits {
			m.lastWait[key] = m.ops
		}
		last := -1
		for _, f := range m.freed {
			if lo < f.hi && f.lo < hi {
				last = max(last, f.op)
			}
		}
		if w, ok := m.lastWait[key]; last >= 0 && (!ok || w <= last) {
			t.Fatalf("block %v of stream %d was lent to stream %d without a device wait since its free", p, seg.Stream, s)
		}
	}
	m.nAllocs++
	m.peakLive = max(m.peakLive, int64(len(m.live)))
	return p
}

// Step marks a step boundary and runs the machine's step: its pattern of
// sizes allocated on the default stream, each freed once the next is
// allocated. Under the planned policy, steps that repeat the one before
// are served from its arena; Alloc and Free between two Steps make the
// next one depart from the plan, or give a step of their own to plan.
func (m *machine) Step(t *rapid.T) {
	if m.pattern == nil {
		m.pattern = rapid.SliceOfN(rapid.SampledFrom([]uint64{512, 3000, 300 << 10, 3 * mib, 9 * mib, 21 * mib}), 1, 8).Draw(t, "step")
	}
	m.a.MarkStep("step")
	m.run(t, m.pattern)
}

// SmallerStep marks a step boundary and runs the machine's step with some
// of its sizes made smaller, as a last batch that is smaller makes them:
// under the planned policy, a step that fits the plan is served from the
// arena all the same and keeps the plan.
func (m *machine) SmallerStep(t *rapid.T) {
	if m.pattern == nil {
		return // no step drawn yet
	}
	div := rapid.Uint64Range(2, 5).Draw(t, "div")
	sizes := slices.Clone(m.pattern)
	for k := range sizes {
		if rapid.Bool().Draw(t, "smaller") {
			sizes[k] = max(1, sizes[k]/div)
		}
	}
	m.a.MarkStep("step")
	m.run(t, sizes)
}

// VariedStep marks a step boundary and runs the machine's step with some
// of its sizes made larger, others smaller, as batches of varying length
// make them: under the planned policy, a larger request departs from the
// plan, the step grows the envelope of the steps seen, and the next step
// that fits the envelope is planned with its sizes.
func (m *machine) VariedStep(t *rapid.T) {
	if m.pattern == nil {
		return // no step drawn yet
	}
	sizes := slices.Clone(m.pattern)
	for k := range sizes {
		switch rapid.IntRange(0, 2).Draw(t, "way") {
		case 1:
			sizes[k] *= rapid.Uint64Range(2, 3).Draw(t, "mul")
		case 2:
			sizes[k] = max(1, sizes[k]/rapid.Uint64Range(2, 5).Draw(t, "div"))
		}
	}
	m.a.MarkStep("step")
	m.run(t, sizes)
}

// ShorterStep marks a step boundary and runs the first half of the
// machine's step: a step of another shape, as an evaluation's forward
// pass is. Under the planned policy one such step spares the plan, a
// second ends it and the plan is kept; a step of the machine's step
// after them takes the kept plan up again.
func (m *machine) ShorterStep(t *rapid.T) {
	if len(m.pattern) < 2 {
		return // no step drawn yet, or one too short to halve
	}
	m.a.MarkStep("step")
	m.run(t, m.pattern[:len(m.pattern)/2])
}

// SideStep marks a step boundary and runs the machine's step with one
// more allocation, on a side stream (an input copied on a stream of its
// own), at a position drawn once, recorded on the default stream and
// freed at the step's end. Under the planned policy the step is planned
// on the default stream, the side allocation served online; a Step
// after SideSteps does not fit their plan, nor a SideStep a Step's.
func (m *machine) SideStep(t *rapid.T) {
	if m.pattern == nil {
		return // no step drawn yet
	}
	if m.side == 0 {
		m.side = 1 + rapid.IntRange(0, len(m.pattern)).Draw(t, "side")
	}
	m.a.MarkStep("step")
	var prev, input device.Ptr
	side := func() {
		if input = m.alloc(t, 1<<20, m.streams[1], false); input == 0 {
			return // out of memory
		}
		if err := m.a.RecordStream(input, device.DefaultStream); err != nil {
			t.Fatalf("RecordStream: %v", err)
		}
		b := m.live[input]
		b.uses = append(b.uses, device.DefaultStream)
		m.live[input] = b
	}
	for k, size := range m.pattern {
		if k == m.side-1 {
			side()
		}
		p := m.alloc(t, size, device.DefaultStream, false)
		if prev != 0 {
			m.free(t, prev)
		}
		prev = p
	}
	if m.side-1 == len(m.pattern) {
		side() // the side allocation comes last
	}
	if prev != 0 {
		m.free(t, prev)
	}
	if input != 0 {
		m.free(t, input)
	}
}

// CacheStep marks a step boundary and runs the machine's step as a
// generation step with a KV cache runs it: after the step's first
// allocation, a cache a token larger than the last replaces it (the last
// one is freed), and the new one lives on past the next boundary. Under
// the planned policy the steps repeat while rounding keeps the cache's
// size; the caches land in the plan's places, and a plan that skips more
// than it serves is dropped, quiet steps following.
func (m *machine) CacheStep(t *rapid.T) {
	if m.pattern == nil {
		return // no step drawn yet
	}
	m.a.MarkStep("step")
	var prev device.Ptr
	for k, size := range m.pattern {
		p := m.alloc(t, size, device.DefaultStream, false)
		if prev != 0 {
			m.free(t, prev)
		}
		prev = p
		if k == 0 {
			if m.cacheSize == 0 {
				m.cacheSize = rapid.SampledFrom([]uint64{3 * mib, 9 * mib}).Draw(t, "cache")
			}
			m.cacheSize += 4096 // a token
			old := m.cache      // live, or 0 (free forgets it)
			c := m.alloc(t, m.cacheSize, device.DefaultStream, false)
			if old != 0 {
				m.free(t, old)
			}
			m.cache = c
		}
	}
	if prev != 0 {
		m.free(t, prev)
	}
}

// Loop runs the machine's loop three times, unmarked: its sizes (drawn
// once, autoMinPeriod to autoMinPeriod+4 of them) allocated on the
// default stream, each freed once the next is allocated. Under the
// planned policy of a program that has marked no step, the period is
// found and its steps planned and served (autoSteps); Alloc and Free
// between Loops shift the boundaries or break the repeat.
func (m *machine) Loop(t *rapid.T) {
	if m.loop == nil {
		m.loop = rapid.SliceOfN(rapid.SampledFrom([]uint64{512, 3000, 300 << 10, 3 * mib, 9 * mib, 21 * mib}), autoMinPeriod, autoMinPeriod+4).Draw(t, "loop")
	}
	for range 3 {
		m.run(t, m.loop)
	}
}

// run allocates sizes on the default stream in order, each freed once
// the next is allocated, the last at the end.
func (m *machine) run(t *rapid.T, sizes []uint64) {
	var prev device.Ptr
	for _, size := range sizes {
		p := m.alloc(t, size, device.DefaultStream, false)
		if prev != 0 {
			m.free(t, prev)
		}
		prev = p
	}
	if prev != 0 {
		m.free(t, prev)
	}
}

// segmentOf returns the segment holding p.
func (m *machine) segmentOf(p device.Ptr) SegmentInfo {
	for _, seg := range m.a.Snapshot() {
		if p >= seg.Ptr && uint64(p-seg.Ptr) < seg.Size {
			return seg
		}
	}
	return SegmentInfo{}
}

func (m *machine) pick(t *rapid.T) (device.Ptr, bool) {
	if len(m.live) == 0 {
		return 0, false
	}
	keys := make([]device.Ptr, 0, len(m.live))
	for p := range m.live {
		keys = append(keys, p)
	}
	slices.Sort(keys)
	return rapid.SampledFrom(keys).Draw(t, "ptr"), true
}

func (m *machine) Free(t *rapid.T) {
	p, ok := m.pick(t)
	if !ok {
		t.Skip("nothing live")
	}
	m.free(t, p)
}

// deviceWaits counts the waits of one stream for another made on the
// device so far, on events or on streams.
func (m *machine) deviceWaits() int64 {
	c := m.dev.Counters()
	return c.EventWaits + c.StreamWaits
}

// free frees the live block at p and checks the model's properties.
func (m *machine) free(t *rapid.T, p device.Ptr) {
	b := m.live[p]
	lent := m.segmentOf(p).Stream != b.stream
	waits, active := m.deviceWaits(), m.a.Stats().Active[stats.All].Current
	if err := m.a.Free(p); err != nil {
		t.Fatalf("Free(%v): %v", p, err)
	}
	if lent && m.deviceWaits() == waits && m.a.Stats().Active[stats.All].Current != active {
		t.Fatalf("lent block %v returned to its lender without a wait for the borrower, on the device or the host", p)
	}
	m.ops++
	m.freed = append(m.freed, freedSpan{span{p, p + device.Ptr(b.size)}, m.ops})
	delete(m.live, p)
	if p == m.cache {
		m.cache = 0 // CacheStep's cache, freed
	}
	m.nFrees++
	for _, s := range b.uses {
		if m.busy[s] {
			m.held[s] = append(m.held[s], span{p, p + device.Ptr(b.size)})
		}
	}
	if err := m.a.Free(p); !errors.Is(err, device.ErrInvalidPointer) {
		t.Fatalf("double Free(%v) = %v", p, err)
	}
}

func (m *machine) RecordStream(t *rapid.T) {
	p, ok := m.pick(t)
	if !ok {
		t.Skip("nothing live")
	}
	s := rapid.SampledFrom(m.streams).Draw(t, "stream")
	if err := m.a.RecordStream(p, s); err != nil {
		t.Fatalf("RecordStream: %v", err)
	}
	b := m.live[p]
	if s != b.stream && !slices.Contains(b.uses, s) {
		b.uses = append(b.uses, s)
		m.live[p] = b
	}
}

func (m *machine) SetBusy(t *rapid.T) {
	s := rapid.SampledFrom(m.streams[1:]).Draw(t, "stream")
	busy := rapid.Bool().Draw(t, "busy")
	if err := m.dev.SetStreamBusy(s, busy); err != nil {
		t.Fatal(err)
	}
	m.busy[s] = busy
	if !busy {
		delete(m.held, s)
	}
}

func (m *machine) CompleteStream(t *rapid.T) {
	s := rapid.SampledFrom(m.streams[1:]).Draw(t, "stream")
	if err := m.dev.CompleteStream(s); err != nil {
		t.Fatal(err)
	}
	delete(m.held, s)
}

func (m *machine) EmptyCache(t *rapid.T) {
	if rapid.IntRange(0, 4).Draw(t, "failFree") == 0 {
		m.dev.FailFrees(errors.New("injected"))
		defer m.dev.FailFrees(nil)
	}
	_ = m.a.EmptyCache() // may fail with the injected error; invariants still hold
	// EmptyCache waits for every event: held memory is safe to reuse.
	clear(m.held)
}

func (m *machine) Reset(t *rapid.T) {
	if rapid.Bool().Draw(t, "peak") {
		m.a.ResetPeakStats()
		m.peakLive = int64(len(m.live))
	} else {
		m.a.ResetAccumulatedStats()
		m.nAllocs, m.nFrees, m.nOOMs = 0, 0, 0
		dc := m.dev.Counters()
		m.devAllocBase, m.devFreeBase = dc.Mallocs+dc.Maps, dc.Frees+dc.Unmaps
	}
	m.prev = m.a.Stats()
}

func (m *machine) Check(t *rapid.T) {
	if err := m.a.CheckInvariants(); err != nil {
		t.Fatal(err)
	}
	st := m.a.Stats()
	dc := m.dev.Counters()
	for _, c := range []struct {
		key  string
		want int64
	}{
		{"num_device_alloc", dc.Mallocs + dc.Maps - m.devAllocBase},
		{"num_device_free", dc.Frees + dc.Unmaps - m.devFreeBase},
		{"allocation.all.current", int64(len(m.live))},
		{"allocation.all.peak", m.peakLive},
		{"allocation.all.allocated", m.nAllocs},
		{"allocation.all.freed", m.nFrees},
		{"num_ooms", m.nOOMs},
	} {
		if got, _ := st.Get(c.key); got != c.want {
			t.Fatalf("%s = %d, the model counts %d", c.key, got, c.want)
		}
	}
	for _, e := range []struct {
		name string
		now  int64
		then int64
	}{
		{"num_device_alloc", st.NumDeviceAlloc, m.prev.NumDeviceAlloc},
		{"num_device_free", st.NumDeviceFree, m.prev.NumDeviceFree},
		{"num_ooms", st.NumOOMs, m.prev.NumOOMs},
		{"num_alloc_retries", st.NumAllocRetries, m.prev.NumAllocRetries},
		{"num_sync_all_streams", st.NumSyncAllStreams, m.prev.NumSyncAllStreams},
	} {
		if e.now < e.then {
			t.Fatalf("%s went down: %d -> %d", e.name, e.then, e.now)
		}
	}
	m.prev = st
	for _, seg := range m.a.Snapshot() {
		for _, b := range seg.Blocks {
			if lb, ok := m.live[b.Ptr]; ok {
				lent := lb.stream != seg.Stream && m.a.Config().Policy != PolicyFaithful
				if b.State != BlockAllocated || lb.stream != seg.Stream && !lent || b.Size < lb.size {
					t.Fatalf("live block %v: state %v, size %d for %d, segment stream %d for %d",
						b.Ptr, b.State, b.Size, lb.size, seg.Stream, lb.stream)
				}
			}
		}
	}
}

func TestAllocatorStateMachine(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		m := newMachine(t)
		t.Repeat(rapid.StateMachineActions(m))
		// Drain: free everything, complete all work, empty the cache: the
		// device must be back to zero.
		for p := range m.live {
			if err := m.a.Free(p); err != nil {
				t.Fatal(err)
			}
		}
		if err := m.a.EmptyCache(); err != nil {
			t.Fatal(err)
		}
		if err := m.a.CheckInvariants(); err != nil {
			t.Fatal(err)
		}
		if u := m.dev.BytesInUse(); u != 0 {
			t.Fatalf("after freeing everything and emptying the cache, %d bytes are in use", u)
		}
		st := m.a.Stats()
		for _, k := range []string{"allocation.all.current", "active.all.current", "segment.all.current", "reserved_bytes.all.current", "requested_bytes.all.current", "inactive_split.all.current"} {
			if v, _ := st.Get(k); v != 0 {
				t.Fatalf("%s = %d after draining", k, v)
			}
		}
	})
}

// FuzzAllocator drives the allocator from bytes: each op is 4 bytes (kind,
// stream, size class, size), with the invariant checker after every op.
// The length of the input picks the configuration: PyTorch's default,
// expandable segments, the low_fragmentation policy (with tight knobs,
// or with its defaults) or the planned policy. Op 7 marks a step; op 8
// repeats the allocations and frees since the last mark, as a training
// loop's next step would, marked or not (the planned policy then serves
// them from its arena).
func FuzzAllocator(f *testing.F) {
	f.Add([]byte{0, 0, 1, 10, 0, 0, 2, 200, 1, 0, 0, 0, 2, 1, 0, 0, 1, 0, 0, 0, 4, 0, 0, 0})
	f.Add([]byte{0, 1, 3, 255, 3, 1, 0, 0, 0, 2, 3, 7, 1, 0, 0, 0, 5, 1, 0, 0})
	// The planned policy (27 bytes): two allocations, then the step they
	// make repeated four times, served from the arena from the third.
	f.Add([]byte{0, 0, 3, 10, 0, 0, 2, 5, 8, 0, 0, 0, 8, 0, 0, 0, 8, 0, 0, 0, 8, 0, 0, 0, 0, 0, 0})
	// The planned policy (51 bytes): two allocations, then their step
	// repeated, larger, smaller, both ways, and with a third allocation
	// between repeats (a step of another shape, which spares the plan).
	f.Add([]byte{0, 0, 3, 10, 0, 0, 2, 5, 8, 0, 0, 0, 8, 0, 0, 4, 8, 0, 0, 0, 8, 0, 0, 2, 8, 0, 0, 6, 8, 0, 0, 0,
		0, 0, 1, 3, 8, 0, 0, 0, 8, 0, 0, 0, 8, 0, 0, 4, 0, 0, 0})
	// The planned policy (83 bytes): 16 allocations, then their step
	// repeated four times unmarked, whose repeats the policy finds.
	unmarked := make([]byte, 0, 83)
	for k := range 16 {
		unmarked = append(unmarked, 0, 0, 1, byte(k+1))
	}
	for range 4 {
		unmarked = append(unmarked, 8, 0, 0, 1)
	}
	f.Add(append(unmarked, 0, 0, 0))
	// The planned policy (99 bytes): 8 allocations, then their step
	// marked three times, its first half three times (the plan ends and
	// is kept), the whole step three times (the kept plan taken up), and
	// its half again.
	phases := make([]byte, 0, 99)
	for k := range 8 {
		phases = append(phases, 0, 0, 1, byte(k+1))
	}
	for _, n := range []byte{0, 0, 0, 8, 8, 8, 0, 0, 0, 8, 8, 8, 0, 0, 0, 8} {
		phases = append(phases, 8, 0, 0, n)
	}
	f.Add(append(phases, 0, 0, 0))
	// The planned policy (35 bytes): two allocations, then their step
	// marked six times, each begun with an input on stream 1 (a side
	// allocation): planned on stream 0, served from the third.
	side := []byte{0, 0, 3, 10, 0, 0, 2, 5}
	for range 6 {
		side = append(side, 8, 1, 0, 16)
	}
	f.Add(append(side, 0, 0, 0))
	f.Fuzz(func(t *testing.T, data []byte) {
		dev := simtest.New(t, simtest.Capacity(256*mib))
		cfg := Config{MaxSplitSize: 64 * mib}
		switch len(data) % 4 {
		case 1, 3:
			cfg.ExpandableSegments = true
		case 2:
			cfg.Policy = PolicyLowFragmentation
			cfg.LowFrag = LowFragConfig{Victims: 1, MinAge: 1, Slack: 0.001, MapAhead: mib}
		}
		switch len(data) % 8 {
		case 7:
			cfg.Policy = PolicyLowFragmentation // with the defaults
		case 3:
			cfg.ExpandableSegments, cfg.Policy = false, PolicyPlanned
		}
		a := onDevice(t, dev, cfg)
		streams := []device.Stream{0}
		for range 2 {
			s, _ := dev.NewStream()
			streams = append(streams, s)
		}
		var live []device.Ptr
		var stepSizes []uint64 // the sizes allocated since the last mark
		for len(data) >= 4 {
			op, sb, class, n := data[0], data[1], data[2], data[3]
			data = data[4:]
			s := streams[int(sb)%len(streams)]
			switch op % 9 {
			case 0:
				size := uint64(n) * []uint64{1, 512, 64 << 10, mib}[class%4]
				p, err := a.Alloc(size, s)
				if err != nil && !errors.Is(err, device.ErrOutOfMemory) {
					t.Fatalf("Alloc(%d): %v", size, err)
				}
				if err == nil && p != 0 {
					live = append(live, p)
				}
			case 1:
				if len(live) > 0 {
					i := int(n) % len(live)
					if err := a.Free(live[i]); err != nil {
						t.Fatalf("Free: %v", err)
					}
					live = slices.Delete(live, i, i+1)
				}
			case 2:
				if len(live) > 0 {
					if err := a.RecordStream(live[int(n)%len(live)], s); err != nil {
						t.Fatalf("RecordStream: %v", err)
					}
				}
			case 3:
				_ = dev.SetStreamBusy(s, n%2 == 0)
			case 4:
				if err := a.EmptyCache(); err != nil {
					t.Fatalf("EmptyCache: %v", err)
				}
			case 5:
				_ = dev.CompleteStream(s)
			case 6:
				if err := a.Free(device.Ptr(n)<<20 + 1); err == nil {
					t.Fatal("Free of a made-up pointer succeeded")
				}
			case 7:
				a.MarkStep("step")
				stepSizes = stepSizes[:0]
			case 8:
				// The step again: its sizes allocated on stream 0, each
				// freed after the next, the last at the end; marked for
				// an even n (else the planned policy finds the repeats
				// itself, until the first mark); each size halved, plus a
				// byte, where n has bit 1 set (a smaller batch: the plan
				// serves it still), doubled where it has bit 2 set (a
				// larger one: the plan's envelope grows), and with both,
				// the sizes at odd positions doubled, the others halved;
				// only its first half where n has bit 3 set (a step of
				// another shape: two in a row end the plan, which is
				// kept, and the whole step after them takes it up);
				// begun with a 4 KiB input on the op's stream, freed at
				// the step's end, where n has bit 4 set and that stream
				// is not the default one (a side allocation: the plan is
				// the default stream's).
				if n%2 == 0 {
					a.MarkStep("step")
				}
				var input device.Ptr
				if n&16 != 0 && s != 0 {
					p, err := a.Alloc(4096, s)
					if err != nil && !errors.Is(err, device.ErrOutOfMemory) {
						t.Fatalf("Alloc(4096) on stream %d: %v", s, err)
					}
					input = p
				}
				sizes := stepSizes
				if n&8 != 0 {
					sizes = sizes[:len(sizes)/2]
				}
				var prev device.Ptr
				for k, size := range sizes {
					switch {
					case n&6 == 6 && k%2 == 1, n&6 == 4:
						size *= 2
					case n&2 != 0:
						size = size/2 + 1
					}
					p, err := a.Alloc(size, 0)
					if err != nil && !errors.Is(err, device.ErrOutOfMemory) {
						t.Fatalf("Alloc(%d): %v", size, err)
					}
					if prev != 0 {
						if err := a.Free(prev); err != nil {
							t.Fatalf("Free: %v", err)
						}
					}
					prev = p
					if err := a.CheckInvariants(); err != nil {
						t.Fatal(fmt.Errorf("in a repeated step: %w", err))
					}
				}
				if prev != 0 {
					if err := a.Free(prev); err != nil {
						t.Fatalf("Free: %v", err)
					}
				}
				if input != 0 {
					if err := a.Free(input); err != nil {
						t.Fatalf("Free: %v", err)
					}
				}
			}
			if op%9 == 0 && len(stepSizes) < 64 {
				stepSizes = append(stepSizes, uint64(n)*[]uint64{1, 512, 64 << 10, mib}[class%4])
			}
			if err := a.CheckInvariants(); err != nil {
				t.Fatal(fmt.Errorf("after op %d: %w", op%9, err))
			}
		}
	})
}
