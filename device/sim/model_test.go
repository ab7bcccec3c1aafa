// A state-machine test of the whole device against a reference model:
// memory and the address rule, one reservation's mappings, streams and
// events, every fault, and the exact counters and clock after each call.

package sim_test

import (
	"errors"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/device/sim"
)

var errFault = errors.New("injected by the model test")

// modelStream is the model of one stream's queue.
type modelStream struct {
	busy              bool
	queued, completed uint64
}

type modelEvent struct {
	stream int // index into model.streams
	seq    uint64
}

// model is what the device should be after each call, written the plain
// way: a list of free ranges, maps keyed by address, counters and clock
// kept by hand from the package documentation.
type model struct {
	d         *sim.Device
	ordinal   int
	page      uint64
	capacity  uint64
	costs     sim.Costs
	mem       *refSpace
	live      map[device.Ptr]sim.Range
	freed     []device.Ptr // addresses freed once, for double frees
	resv      device.Ptr   // one reservation of resvPages pages
	resvPages uint64
	mapped    map[uint64]bool // page index in the reservation -> mapped
	used      uint64
	streams   []modelStream
	events    map[device.Event]modelEvent
	released  []device.Event
	nextEvent device.Event
	c         sim.Counters
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
	return m.costs.Malloc + time.Duration(charged/kib)
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
	switch {
	case !valid:
		m.c.FailedMallocs++
		require.ErrorIs(t, err, device.ErrInvalidSize)
	case m.fault(size), pages > m.capacity-m.used:
		m.c.FailedMallocs++
		require.ErrorIs(t, err, device.ErrOutOfMemory)
	default:
		require.NoError(t, err)
		want, ok := m.mem.take(pages)
		require.True(t, ok)
		require.Equal(t, device.Ptr(want), p, "first fit at the lowest address")
		m.live[p] = sim.Range{Ptr: p, Size: size, Pages: pages}
		m.charge(pages)
		m.c.Mallocs++
		return
	}
	require.Zero(t, p)
}

func (m *model) livePtrs() []device.Ptr {
	ps := make([]device.Ptr, 0, len(m.live))
	for p := range m.live {
		ps = append(ps, p)
	}
	slices.Sort(ps)
	return ps
}

func (m *model) free(t *rapid.T) {
	candidates := []device.Ptr{0, m.d.MemoryBase() + device.Ptr(m.page)*1000, m.resv}
	candidates = append(candidates, m.freed...)
	for _, p := range m.livePtrs() {
		candidates = append(candidates, p, p, p, p+device.Ptr(m.page)) // live ones often
	}
	p := rapid.SampledFrom(candidates).Draw(t, "ptr")
	err := m.d.Free(p)
	m.pay(m.costs.Free)
	r, ok := m.live[p]
	switch {
	case !ok:
		m.c.FailedFrees++
		require.ErrorIs(t, err, device.ErrInvalidPointer)
	case m.failFrees:
		m.c.FailedFrees++
		require.ErrorIs(t, err, errFault)
	default:
		require.NoError(t, err)
		delete(m.live, p)
		m.freed = append(m.freed, p)
		m.mem.give(uint64(p), r.Pages)
		m.uncharge(r.Pages)
		m.c.Frees++
		m.c.Synchronizations++
		m.pay(m.costs.Synchronize)
	}
}

// pageRange draws a run of pages of the reservation.
func (m *model) pageRange(t *rapid.T) (first, n uint64) {
	first = rapid.Uint64Range(0, m.resvPages-1).Draw(t, "first page")
	n = rapid.Uint64Range(1, m.resvPages-first).Draw(t, "pages")
	return first, n
}

func (m *model) mapPages(t *rapid.T) {
	first, n := m.pageRange(t)
	size := n * m.page
	err := m.d.Map(m.resv+device.Ptr(first*m.page), size)
	m.pay(m.costs.Map * time.Duration(n))
	overlap := false
	for i := first; i < first+n; i++ {
		overlap = overlap || m.mapped[i]
	}
	switch {
	case overlap:
		require.ErrorIs(t, err, device.ErrInvalidArgument)
	case m.fault(size), size > m.capacity-m.used:
		m.c.FailedMaps++
		require.ErrorIs(t, err, device.ErrOutOfMemory)
	default:
		require.NoError(t, err)
		for i := first; i < first+n; i++ {
			m.mapped[i] = true
		}
		m.charge(size)
		m.c.MappedBytes += size
		m.c.Maps++
	}
}

func (m *model) unmapPages(t *rapid.T) {
	first, n := m.pageRange(t)
	size := n * m.page
	err := m.d.Unmap(m.resv+device.Ptr(first*m.page), size)
	m.pay(m.costs.Unmap * time.Duration(n))
	all := true
	for i := first; i < first+n; i++ {
		all = all && m.mapped[i]
	}
	switch {
	case !all:
		require.ErrorIs(t, err, device.ErrInvalidArgument)
	case m.failFrees:
		m.c.FailedUnmaps++
		require.ErrorIs(t, err, errFault)
	default:
		require.NoError(t, err)
		for i := first; i < first+n; i++ {
			delete(m.mapped, i)
		}
		m.uncharge(size)
		m.c.MappedBytes -= size
		m.c.Unmaps++
	}
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
		return handle((m.ordinal+1)%(sim.MaxOrdinal+1), i)
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

// event draws a live event, or now and then a released or unknown one.
func (m *model) event(t *rapid.T) device.Event {
	candidates := []device.Event{0, m.nextEvent + 1}
	candidates = append(candidates, m.released...)
	for e := range m.events {
		candidates = append(candidates, e, e, e)
	}
	slices.Sort(candidates)
	return rapid.SampledFrom(candidates).Draw(t, "event")
}

func (m *model) actions() map[string]func(*rapid.T) {
	return map[string]func(*rapid.T){
		"Malloc": m.malloc,
		"Free":   m.free,
		"Map":    m.mapPages,
		"Unmap":  m.unmapPages,
		"MemInfo": func(t *rapid.T) {
			free, total, err := m.d.MemInfo()
			require.NoError(t, err)
			m.c.MemInfos++
			m.pay(m.costs.MemInfo)
			require.Equal(t, m.capacity, total)
			require.Equal(t, m.capacity-m.used, free)
		},
		"NewStream": func(t *rapid.T) {
			if len(m.streams) >= 6 {
				t.Skip("enough streams")
			}
			s, err := m.d.NewStream()
			require.NoError(t, err)
			require.Equal(t, handle(m.ordinal, len(m.streams)), s)
			m.streams = append(m.streams, modelStream{})
			m.c.StreamsCreated++
			m.pay(m.costs.StreamCreate)
		},
		"SetStreamBusy": func(t *rapid.T) {
			s := m.stream(t)
			busy := rapid.Bool().Draw(t, "busy")
			err := m.d.SetStreamBusy(s, busy)
			_, st := m.modelStream(s)
			if st == nil {
				require.ErrorIs(t, err, device.ErrInvalidStream)
				return
			}
			require.NoError(t, err)
			st.busy = busy
			if !busy {
				st.completed = st.queued
			}
		},
		"CompleteStream": func(t *rapid.T) {
			s := m.stream(t)
			err := m.d.CompleteStream(s)
			_, st := m.modelStream(s)
			if st == nil {
				require.ErrorIs(t, err, device.ErrInvalidStream)
				return
			}
			require.NoError(t, err)
			st.completed = st.queued
		},
		"SynchronizeStream": func(t *rapid.T) {
			s := m.stream(t)
			err := m.d.SynchronizeStream(s)
			m.pay(m.costs.StreamSynchronize)
			_, st := m.modelStream(s)
			if st == nil {
				require.ErrorIs(t, err, device.ErrInvalidStream)
				return
			}
			require.NoError(t, err)
			st.completed = st.queued
			m.c.StreamSynchronizations++
		},
		"Synchronize": func(t *rapid.T) {
			require.NoError(t, m.d.Synchronize())
			for i := range m.streams {
				m.streams[i].completed = m.streams[i].queued
			}
			m.c.Synchronizations++
			m.pay(m.costs.Synchronize)
		},
		"RecordEvent": func(t *rapid.T) {
			s := m.stream(t)
			e, err := m.d.RecordEvent(s)
			m.pay(m.costs.EventRecord)
			i, st := m.modelStream(s)
			if st == nil {
				require.ErrorIs(t, err, device.ErrInvalidStream)
				require.Zero(t, e)
				return
			}
			require.NoError(t, err)
			m.nextEvent++
			require.Equal(t, m.nextEvent, e, "events are numbered in order")
			st.queued++
			if !st.busy {
				st.completed = st.queued
			}
			m.events[e] = modelEvent{stream: i, seq: st.queued}
			m.c.EventsRecorded++
		},
		"EventDone": func(t *rapid.T) {
			e := m.event(t)
			done, err := m.d.EventDone(e)
			m.pay(m.costs.EventQuery)
			ev, ok := m.events[e]
			switch {
			case !ok:
				require.ErrorIs(t, err, device.ErrInvalidEvent)
			case m.failEvents:
				m.c.FailedEventQueries++
				require.ErrorIs(t, err, errFault)
			default:
				require.NoError(t, err)
				m.c.EventQueries++
				require.Equal(t, m.streams[ev.stream].completed >= ev.seq, done)
				return
			}
			require.False(t, done)
		},
		"SynchronizeEvent": func(t *rapid.T) {
			e := m.event(t)
			err := m.d.SynchronizeEvent(e)
			m.pay(m.costs.EventSynchronize)
			ev, ok := m.events[e]
			switch {
			case !ok:
				require.ErrorIs(t, err, device.ErrInvalidEvent)
			case m.failEvents:
				m.c.FailedEventQueries++
				require.ErrorIs(t, err, errFault)
			default:
				require.NoError(t, err)
				st := &m.streams[ev.stream]
				st.completed = max(st.completed, ev.seq)
				m.c.EventSynchronizations++
			}
		},
		"ReleaseEvent": func(t *rapid.T) {
			e := m.event(t)
			err := m.d.ReleaseEvent(e)
			m.pay(m.costs.EventRelease)
			if _, ok := m.events[e]; !ok {
				require.ErrorIs(t, err, device.ErrInvalidEvent)
				return
			}
			require.NoError(t, err)
			delete(m.events, e)
			m.released = append(m.released, e)
			m.c.EventsReleased++
		},
		"FailNthMalloc": func(t *rapid.T) {
			n := rapid.IntRange(-1, 4).Draw(t, "n")
			m.d.FailNthMalloc(n)
			m.countdown = max(n, 0)
		},
		"FailMallocAbove": func(t *rapid.T) {
			size := rapid.SampledFrom([]uint64{0, 0, m.page, 2*m.page + 1, m.capacity / 2}).Draw(t, "above")
			m.d.FailMallocAbove(size)
			m.above = size
		},
		"FailMallocWhen": func(t *rapid.T) {
			k := rapid.SampledFrom([]uint64{0, 0, 3, m.page, 2 * m.page}).Draw(t, "multiple")
			if k == 0 {
				m.d.FailMallocWhen(nil)
			} else {
				m.d.FailMallocWhen(func(size uint64) bool { return size%k == 0 })
			}
			m.when = k
		},
		"FailFrees": func(t *rapid.T) {
			m.failFrees = rapid.Bool().Draw(t, "fail frees")
			if m.failFrees {
				m.d.FailFrees(errFault)
			} else {
				m.d.FailFrees(nil)
			}
		},
		"FailEventQueries": func(t *rapid.T) {
			m.failEvents = rapid.Bool().Draw(t, "fail event queries")
			if m.failEvents {
				m.d.FailEventQueries(errFault)
			} else {
				m.d.FailEventQueries(nil)
			}
		},
		"": m.check,
	}
}

// check compares everything observable with the model. It uses only
// methods that cost and count nothing.
func (m *model) check(t *rapid.T) {
	want := make([]sim.Range, 0, len(m.live))
	for _, p := range m.livePtrs() {
		want = append(want, m.live[p])
	}
	got := m.d.Allocations()
	require.Equal(t, want, got, "live allocations")
	for i, r := range got {
		require.Zero(t, uint64(r.Ptr)%m.page, "page aligned")
		require.GreaterOrEqual(t, r.Ptr, m.d.MemoryBase())
		require.LessOrEqual(t, r.End(), m.d.MemoryBase()+sim.MemoryRegionSize)
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
	var mapped []sim.Range
	for i := uint64(0); i < m.resvPages; i++ {
		if !m.mapped[i] {
			continue
		}
		p := m.resv + device.Ptr(i*m.page)
		if n := len(mapped); n > 0 && mapped[n-1].End() == p {
			mapped[n-1].Size += m.page
			mapped[n-1].Pages += m.page
			continue
		}
		mapped = append(mapped, sim.Range{Ptr: p, Size: m.page, Pages: m.page})
	}
	require.Equal(t, mapped, nonNil(m.d.Mapped(m.resv)), "mapped pages")
}

func nonNil(r []sim.Range) []sim.Range {
	if len(r) == 0 {
		return nil
	}
	return r
}

// TestDeviceModel runs random call sequences against the model: by
// default 100 sequences of about 150 calls (-rapid.checks and -rapid.steps
// go further).
func TestDeviceModel(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		page := rapid.SampledFrom([]uint64{sim.MinPageSize, 4 * kib, 64 * kib, 2 * mib}).Draw(t, "page")
		capacity := rapid.Uint64Range(1, 40).Draw(t, "capacity pages")*page +
			rapid.SampledFrom([]uint64{0, 0, 1, page / 2, page - 1}).Draw(t, "extra bytes")
		ordinal := rapid.SampledFrom([]int{0, 1, sim.MaxOrdinal}).Draw(t, "ordinal")
		d := newDevice(t, sim.Config{Ordinal: ordinal, Capacity: capacity, PageSize: page, Costs: testCosts()})
		m := &model{
			d: d, ordinal: ordinal, page: page, capacity: capacity, costs: testCosts(),
			mem:       newRefSpace(uint64(d.MemoryBase()), sim.MemoryRegionSize),
			live:      map[device.Ptr]sim.Range{},
			resvPages: 8,
			mapped:    map[uint64]bool{},
			streams:   []modelStream{{}},
			events:    map[device.Event]modelEvent{},
		}
		var err error
		m.resv, err = d.Reserve(m.resvPages * page)
		require.NoError(t, err)
		require.Equal(t, d.MemoryBase()+sim.MemoryRegionSize, m.resv)
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
