// The reference model of the device, and a state-machine test of the
// whole device against it: memory and the address rule, reservations and
// their mappings, streams and events, every fault, and the exact counters
// and clock after each call.

package sim

import (
	"errors"
	"maps"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/gpumem/gpumem/device"
)

// refSpace is the reference model of the address rule, and the only one
// in the tests: a sorted list of free ranges {start, size}, searched from
// the lowest address. The treap (TestFreeSpaceAgainstReference) and the
// whole device (TestDeviceModel, TestDeterminism) are checked against it.
type refSpace struct{ free [][2]uint64 }

func newRefSpace(base, size uint64) *refSpace {
	return &refSpace{free: [][2]uint64{{base, size}}}
}

// take returns the lowest start of a free range of at least size bytes,
// and removes [start, start+size) from the free ranges.
func (r *refSpace) take(size uint64) (uint64, bool) {
	for i, f := range r.free {
		if f[1] >= size {
			if f[1] == size {
				r.free = slices.Delete(r.free, i, i+1)
			} else {
				r.free[i] = [2]uint64{f[0] + size, f[1] - size}
			}
			return f[0], true
		}
	}
	return 0, false
}

// give returns [start, start+size) to the free ranges, merging it with
// the ranges that touch it.
func (r *refSpace) give(start, size uint64) {
	i := 0
	for i < len(r.free) && r.free[i][0] < start {
		i++
	}
	r.free = slices.Insert(r.free, i, [2]uint64{start, size})
	// Merge with the next range, then with the previous one.
	if i+1 < len(r.free) && r.free[i][0]+r.free[i][1] == r.free[i+1][0] {
		r.free[i][1] += r.free[i+1][1]
		r.free = slices.Delete(r.free, i+1, i+2)
	}
	if i > 0 && r.free[i-1][0]+r.free[i-1][1] == r.free[i][0] {
		r.free[i-1][1] += r.free[i][1]
		r.free = slices.Delete(r.free, i, i+1)
	}
}

var errFault = errors.New("injected by the model test")

// checkCall checks err against the device's rule for a call that can
// fail: the sentinel invalid if the call is not valid (invalid nil: it
// is), else the error fault if failing (out of memory, an injected
// fault), counted in *failed, else no error. It reports whether the call
// went through.
func checkCall(t *rapid.T, err, invalid error, failing bool, fault error, failed *int64) bool {
	switch {
	case invalid != nil:
		require.ErrorIs(t, err, invalid)
	case failing:
		*failed++
		require.ErrorIs(t, err, fault)
	default:
		require.NoError(t, err)
		return true
	}
	return false
}

// unless returns nil if ok, else the sentinel.
func unless(ok bool, sentinel error) error {
	if ok {
		return nil
	}
	return sentinel
}

// faultIf returns errFault if on, else nil: the argument that turns a
// fault of the device on or off.
func faultIf(on bool) error {
	if on {
		return errFault
	}
	return nil
}

// modelStream is the model of one stream's queue.
type modelStream struct {
	busy              bool
	queued, completed uint64
	waits             []modelWait // every WaitEvent and WaitStream that had to wait, in order
}

// modelWait: unit k of a stream's work (the k-th event recorded on it)
// runs only after stream dep has run seq units, if k > pos.
type modelWait struct {
	pos, seq uint64
	dep      int
}

// runnable reports whether unit k of stream i may run now.
func (m *model) runnable(i int, k uint64) bool {
	for _, w := range m.streams[i].waits {
		if k > w.pos && m.streams[w.dep].completed < w.seq {
			return false
		}
	}
	return true
}

// run runs stream i's units up to upTo, one at a time, each after the
// units of other streams it waits for.
func (m *model) run(i int, upTo uint64) {
	for m.streams[i].completed < upTo {
		k := m.streams[i].completed + 1
		for _, w := range m.streams[i].waits {
			if k > w.pos {
				m.run(w.dep, w.seq)
			}
		}
		m.streams[i].completed = k
	}
	m.settle()
}

// settle lets every stream that is not busy run each unit it may, until
// none can.
func (m *model) settle() {
	for moved := true; moved; {
		moved = false
		for i := range m.streams {
			st := &m.streams[i]
			for !st.busy && st.completed < st.queued && m.runnable(i, st.completed+1) {
				st.completed++
				moved = true
			}
		}
	}
}

// modelResv is the model of one reservation.
type modelResv struct {
	pages  uint64
	mapped map[uint64]bool // page index in the reservation -> mapped
}

type modelEvent struct {
	stream int // index into model.streams
	seq    uint64
}

// model is what the device should be after each call, written the plain
// way: a list of free ranges, maps keyed by address, counters and clock
// kept by hand from the package documentation.
type model struct {
	d         *Device
	ordinal   int
	page      uint64
	capacity  uint64
	costs     Costs
	mem       *refSpace // free device-memory addresses
	vm        *refSpace // free virtual-memory addresses
	live      map[device.Ptr]Range
	freed     []device.Ptr // addresses freed once, for double frees
	resv      map[device.Ptr]*modelResv
	released  []device.Ptr // reservation bases released once
	used      uint64
	streams   []modelStream
	events    map[device.Event]modelEvent
	gone      []device.Event // released events
	nextEvent device.Event
	c         Counters
	clock     time.Duration

	countdown  int    // FailNthMalloc
	above      uint64 // FailMallocAbove
	when       uint64 // FailMallocWhen: fail sizes that are a multiple of this; 0 off
	failFrees  bool
	failEvents bool
}

// pay adds a cost to the clock; the device's clock saturates.
func (m *model) pay(c time.Duration) {
	if m.clock > math.MaxInt64-c {
		m.clock = math.MaxInt64
		return
	}
	m.clock += c
}

func (m *model) charge(n uint64) {
	m.used += n
	m.c.BytesInUse = m.used
	m.c.PeakBytesInUse = max(m.c.PeakBytesInUse, m.used)
}

func (m *model) uncharge(n uint64) {
	m.used -= n
	m.c.BytesInUse = m.used
}

// mallocCost is the cost of a Malloc charging the given bytes: testCosts
// charges 1 ns per KiB.
func (m *model) mallocCost(charged uint64) time.Duration {
	return m.costs.Malloc + time.Duration(charged/KiB)
}

// fault says whether the malloc faults fail an allocating call of size
// bytes, moving the FailNthMalloc countdown as the device does.
func (m *model) fault(size uint64) bool {
	fail := false
	if m.countdown > 0 {
		m.countdown--
		fail = m.countdown == 0
	}
	if m.above != 0 && size > m.above {
		fail = true
	}
	if m.when != 0 && size%m.when == 0 {
		fail = true
	}
	return fail
}

// outOfMemory says whether an allocating call of size bytes, charging
// charged bytes, fails for want of memory: a malloc fault fires (fault),
// or the charge is more than is free.
func (m *model) outOfMemory(size, charged uint64) bool {
	return m.fault(size) || charged > m.capacity-m.used
}

func (m *model) malloc(t *rapid.T) {
	free := m.capacity - m.used
	size := rapid.OneOf(
		rapid.Uint64Range(1, 3*m.page), // small, rarely a page multiple
		rapid.Map(rapid.Uint64Range(1, 4), func(n uint64) uint64 { return n * m.page }), // whole pages
		rapid.Uint64Range(free, free+2*m.page),                                          // around what is free
		rapid.Uint64Range(0, m.capacity+m.page),                                         // anything, zero included
		rapid.Just(^uint64(0)),                                                          // overflows when rounded
	).Draw(t, "size")
	p, err := m.d.Malloc(size)
	pages := (size + m.page - 1) / m.page * m.page
	valid := size != 0 && size <= ^uint64(0)-(m.page-1)
	if valid {
		m.pay(m.mallocCost(pages))
	} else {
		m.pay(m.mallocCost(size))
	}
	if !valid {
		m.c.FailedMallocs++ // an invalid size fails too
	}
	oom := valid && m.outOfMemory(size, pages)
	if !checkCall(t, err, unless(valid, device.ErrInvalidSize), oom, device.ErrOutOfMemory, &m.c.FailedMallocs) {
		require.Zero(t, p)
		return
	}
	want, ok := m.mem.take(pages)
	require.True(t, ok)
	require.Equal(t, device.Ptr(want), p, "first fit at the lowest address")
	m.live[p] = Range{Ptr: p, Size: size, Charged: pages}
	m.charge(pages)
	m.c.Mallocs++
}

func (m *model) livePtrs() []device.Ptr { return slices.Sorted(maps.Keys(m.live)) }

func (m *model) free(t *rapid.T) {
	candidates := []device.Ptr{0, m.d.MemoryBase() + device.Ptr(m.page)*1000}
	candidates = append(candidates, m.freed...)
	candidates = append(candidates, m.resvPtrs()...) // a reservation is not a Malloc
	for _, p := range m.livePtrs() {
		candidates = append(candidates, p, p, p, p+device.Ptr(m.page)) // live ones often
	}
	p := rapid.SampledFrom(candidates).Draw(t, "ptr")
	err := m.d.Free(p)
	m.pay(m.costs.Free)
	r, ok := m.live[p]
	if !ok {
		m.c.FailedFrees++ // a free of no allocation fails too
	}
	if !checkCall(t, err, unless(ok, device.ErrInvalidPointer), m.failFrees, errFault, &m.c.FailedFrees) {
		return
	}
	delete(m.live, p)
	m.freed = append(m.freed, p)
	m.mem.give(uint64(p), r.Charged)
	m.uncharge(r.Charged)
	m.c.Frees++
	m.c.Synchronizations++
	m.pay(m.costs.Synchronize)
}

func (m *model) resvPtrs() []device.Ptr { return slices.Sorted(maps.Keys(m.resv)) }

func (m *model) reserve(t *rapid.T) {
	if len(m.resv) >= 4 {
		t.Skip("enough reservations")
	}
	size := rapid.OneOf(
		rapid.Map(rapid.Uint64Range(1, 12), func(n uint64) uint64 { return n * m.page }),
		rapid.SampledFrom([]uint64{0, m.page / 2, m.page + 1, VirtualRegionSize + m.page}),
	).Draw(t, "reserve size")
	p, err := m.d.Reserve(size)
	m.pay(m.costs.Reserve)
	switch {
	case size == 0:
		require.ErrorIs(t, err, device.ErrInvalidSize)
	case size%m.page != 0:
		require.ErrorIs(t, err, device.ErrInvalidArgument)
	default:
		want, ok := m.vm.take(size)
		if !ok {
			require.ErrorIs(t, err, device.ErrOutOfMemory)
			break
		}
		require.NoError(t, err)
		require.Equal(t, device.Ptr(want), p, "reservations are first fit in their region")
		m.resv[p] = &modelResv{pages: size / m.page, mapped: map[uint64]bool{}}
		m.c.Reserves++
		return
	}
	require.Zero(t, p)
}

func (m *model) release(t *rapid.T) {
	candidates := []device.Ptr{0}
	candidates = append(candidates, m.released...)
	for _, p := range m.resvPtrs() {
		candidates = append(candidates, p, p, p+device.Ptr(m.page))
	}
	p := rapid.SampledFrom(candidates).Draw(t, "reservation")
	err := m.d.Release(p)
	m.pay(m.costs.Release)
	r, ok := m.resv[p]
	if !ok || len(r.mapped) > 0 {
		require.ErrorIs(t, err, device.ErrInvalidArgument)
		return
	}
	require.NoError(t, err)
	m.vm.give(uint64(p), r.pages*m.page)
	delete(m.resv, p)
	m.released = append(m.released, p)
	m.c.Releases++
}

// pageRange draws a run of pages of a reservation: the reservation's
// model, the run's address and size, and its first page and page count.
func (m *model) pageRange(t *rapid.T) (r *modelResv, p device.Ptr, size, first, n uint64) {
	ptrs := m.resvPtrs()
	if len(ptrs) == 0 {
		t.Skip("no reservation")
	}
	base := rapid.SampledFrom(ptrs).Draw(t, "reservation")
	r = m.resv[base]
	first = rapid.Uint64Range(0, r.pages-1).Draw(t, "first page")
	n = rapid.Uint64Range(1, r.pages-first).Draw(t, "pages")
	return r, base + device.Ptr(first*m.page), n * m.page, first, n
}

// mappedIn returns how many of the pages [first, first+n) are mapped.
func (r *modelResv) mappedIn(first, n uint64) uint64 {
	k := uint64(0)
	for i := first; i < first+n; i++ {
		if r.mapped[i] {
			k++
		}
	}
	return k
}

// setMapped marks the pages [first, first+n) mapped or not.
func (r *modelResv) setMapped(first, n uint64, mapped bool) {
	for i := first; i < first+n; i++ {
		if mapped {
			r.mapped[i] = true
		} else {
			delete(r.mapped, i)
		}
	}
}

func (m *model) mapPages(t *rapid.T) {
	r, p, size, first, n := m.pageRange(t)
	err := m.d.Map(p, size)
	m.pay(m.costs.Map * time.Duration(n))
	free := r.mappedIn(first, n) == 0
	oom := free && m.outOfMemory(size, size)
	if !checkCall(t, err, unless(free, device.ErrInvalidArgument), oom, device.ErrOutOfMemory, &m.c.FailedMaps) {
		return
	}
	r.setMapped(first, n, true)
	m.charge(size)
	m.c.MappedBytes += size
	m.c.Maps++
}

func (m *model) unmapPages(t *rapid.T) {
	r, p, size, first, n := m.pageRange(t)
	err := m.d.Unmap(p, size)
	m.pay(m.costs.Unmap * time.Duration(n))
	if !checkCall(t, err, unless(r.mappedIn(first, n) == n, device.ErrInvalidArgument), m.failFrees, errFault, &m.c.FailedUnmaps) {
		return
	}
	r.setMapped(first, n, false)
	m.uncharge(size)
	m.c.MappedBytes -= size
	m.c.Unmaps++
}

// handle is the documented handle of the stream with index i on a device
// of the given ordinal: 0 for the default stream, else ordinal<<32 | i.
func handle(ordinal, i int) device.Stream {
	if i == 0 {
		return device.DefaultStream
	}
	return device.Stream(uint64(ordinal)<<32 | uint64(i))
}

// stream draws a stream handle, now and then one that does not exist or
// belongs to a device of another ordinal.
func (m *model) stream(t *rapid.T) device.Stream {
	i := rapid.IntRange(0, len(m.streams)).Draw(t, "stream")
	if rapid.IntRange(0, 9).Draw(t, "foreign") == 0 {
		return handle((m.ordinal+1)%(MaxOrdinal+1), i)
	}
	return handle(m.ordinal, i)
}

// modelStream returns the index and model of the stream with handle s, or
// nil if the device has no such stream.
func (m *model) modelStream(s device.Stream) (int, *modelStream) {
	for i := range m.streams {
		if handle(m.ordinal, i) == s {
			return i, &m.streams[i]
		}
	}
	return -1, nil
}

// streamCall checks the error of a call on stream s: ErrInvalidStream if
// the device has no such stream (then st is nil), else none; it returns
// the stream's index and model.
func (m *model) streamCall(t *rapid.T, s device.Stream, err error) (int, *modelStream) {
	i, st := m.modelStream(s)
	if st == nil {
		require.ErrorIs(t, err, device.ErrInvalidStream)
		return -1, nil
	}
	require.NoError(t, err)
	return i, st
}

// event draws a live event, or now and then a released or unknown one.
func (m *model) event(t *rapid.T) device.Event {
	candidates := []device.Event{0, m.nextEvent + 1}
	candidates = append(candidates, m.gone...)
	for e := range m.events {
		candidates = append(candidates, e, e, e)
	}
	slices.Sort(candidates)
	return rapid.SampledFrom(candidates).Draw(t, "event")
}

// eventQuery checks the error of a query of event e (EventDone,
// SynchronizeEvent) with checkCall; it returns the event and whether the
// query went through.
func (m *model) eventQuery(t *rapid.T, e device.Event, err error) (modelEvent, bool) {
	ev, ok := m.events[e]
	return ev, checkCall(t, err, unless(ok, device.ErrInvalidEvent), m.failEvents, errFault, &m.c.FailedEventQueries)
}

// check compares everything observable with the model. It uses only
// methods that cost and count nothing.
func (m *model) check(t *rapid.T) {
	want := make([]Range, 0, len(m.live))
	for _, p := range m.livePtrs() {
		want = append(want, m.live[p])
	}
	got := m.d.Allocations()
	require.Equal(t, want, got, "live allocations")
	for i, r := range got {
		require.Zero(t, uint64(r.Ptr)%m.page, "page aligned")
		require.GreaterOrEqual(t, r.Ptr, m.d.MemoryBase())
		require.LessOrEqual(t, r.End(), m.d.MemoryBase()+MemoryRegionSize)
		if i > 0 {
			require.LessOrEqual(t, got[i-1].End(), r.Ptr, "live ranges overlap")
		}
	}
	require.Equal(t, m.used, m.d.BytesInUse())
	require.LessOrEqual(t, m.used, m.capacity)
	require.Equal(t, m.c, m.d.Counters(), "counters")
	require.Equal(t, m.clock, m.d.Clock(), "clock")
	require.Equal(t, len(m.streams), m.d.Streams())
	for s, st := range m.streams {
		require.True(t, m.d.HasStream(handle(m.ordinal, s)))
		n, err := m.d.PendingWork(handle(m.ordinal, s))
		require.NoError(t, err)
		require.Equal(t, st.queued-st.completed, n, "pending work of stream %d", s)
	}
	var resv []Reservation
	for _, base := range m.resvPtrs() {
		r := m.resv[base]
		resv = append(resv, Reservation{Ptr: base, Size: r.pages * m.page, Mapped: uint64(len(r.mapped)) * m.page})
		var mapped []Range
		for i := range r.pages {
			if !r.mapped[i] {
				continue
			}
			p := base + device.Ptr(i*m.page)
			if n := len(mapped); n > 0 && mapped[n-1].End() == p {
				mapped[n-1].Size += m.page
				mapped[n-1].Charged += m.page
				continue
			}
			mapped = append(mapped, Range{Ptr: p, Size: m.page, Charged: m.page})
		}
		require.Equal(t, mapped, nonNil(m.d.Mapped(base)), "mapped pages of %v", base)
	}
	require.Equal(t, resv, nonNil(m.d.Reservations()), "reservations")
	// The free address ranges of both regions, and the treaps that hold
	// them.
	m.d.mu.Lock()
	defer m.d.mu.Unlock()
	checkSpace(t, &m.d.mem)
	checkSpace(t, &m.d.vm)
	require.Equal(t, m.mem.free, m.d.mem.ranges(), "free device memory")
	require.Equal(t, m.vm.free, m.d.vm.ranges(), "free address space")
}

func nonNil[T any](s []T) []T {
	if len(s) == 0 {
		return nil
	}
	return s
}

// TestDeviceModel runs random call sequences against the model: by
// default 100 sequences of about 150 calls (-rapid.checks and -rapid.steps
// go further).
func TestDeviceModel(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		page := rapid.SampledFrom([]uint64{MinPageSize, 4 * KiB, 64 * KiB, 2 * MiB}).Draw(t, "page")
		capacity := rapid.Uint64Range(1, 40).Draw(t, "capacity pages")*page +
			rapid.SampledFrom([]uint64{0, 0, 1, page / 2, page - 1}).Draw(t, "extra bytes")
		ordinal := rapid.SampledFrom([]int{0, 1, MaxOrdinal}).Draw(t, "ordinal")
		d := mustNew(t, Config{Ordinal: ordinal, Capacity: capacity, PageSize: page, Costs: testCosts()})
		m := &model{
			d: d, ordinal: ordinal, page: page, capacity: capacity, costs: testCosts(),
			mem:     newRefSpace(uint64(d.MemoryBase()), MemoryRegionSize),
			vm:      newRefSpace(uint64(d.VirtualBase()), VirtualRegionSize),
			live:    map[device.Ptr]Range{},
			resv:    map[device.Ptr]*modelResv{},
			streams: []modelStream{{}},
			events:  map[device.Event]modelEvent{},
		}
		// One reservation to begin with, so that mapping starts at once.
		r, err := d.Reserve(8 * page)
		require.NoError(t, err)
		require.Equal(t, d.VirtualBase(), r)
		m.vm.take(8 * page)
		m.resv[r] = &modelResv{pages: 8, mapped: map[uint64]bool{}}
		m.c.Reserves = 1
		m.pay(m.costs.Reserve)
		// Several rounds of rapid's ~30 steps: holes, exact fits and
		// stream histories need longer sequences than one round gives.
		actions := m.actions()
		for range 5 {
			t.Repeat(actions)
		}
	})
}
