// This file holds the simulated device: configuration, memory, streams and
// events.

package sim

import (
	"fmt"
	"sync"
	"time"

	"github.com/google/btree"

	"github.com/gpumem/gpumem/device"
)

// Defaults of Config.
const (
	DefaultName     = "gpumem simulated device"
	DefaultCapacity = 80 << 30 // 80 GiB
	DefaultPageSize = 2 << 20  // 2 MiB
	MaxCapacity     = 8 << 40  // 8 TiB: the size of a device's address window
	MaxOrdinal      = 63
)

// Config describes a simulated device. The zero Config is an 80 GiB
// device with 2 MiB pages, ordinal 0, default costs.
type Config struct {
	Ordinal  int    // device ordinal, 0..63
	Name     string // default DefaultName
	Capacity uint64 // bytes; default 80 GiB; at most 8 TiB
	PageSize uint64 // allocation page and virtual-memory granularity; default 2 MiB; a power of two
	Costs    Costs  // simulated cost of each call; the zero value means DefaultCosts
	// Sleep makes every call really sleep for its simulated cost (outside
	// the device's lock), for demos.
	Sleep bool
}

// Counters count what the device has been asked to do.
type Counters struct {
	Mallocs, Frees                 int64 // successful calls
	FailedMallocs, FailedFrees     int64
	BytesInUse, PeakBytesInUse     uint64 // charged bytes (whole pages), Malloc and Map together
	Synchronizations               int64 // Synchronize, SynchronizeStream and the implicit ones of Free
	EventsRecorded, EventsReleased int64
	EventQueries                   int64
	StreamsCreated                 int64
	Maps, Unmaps                   int64
	Reserves, Releases             int64
	HostAllocs, HostFrees          int64
}

// Range is one live allocation.
type Range struct {
	Ptr   device.Ptr
	Size  uint64 // bytes asked for
	Pages uint64 // bytes charged: Size rounded up to whole pages
}

// Device is a simulated GPU. It implements device.Device,
// device.VirtualMemory and device.HostMemory, and is safe for concurrent
// use.
type Device struct {
	ordinal  int
	name     string
	capacity uint64
	page     uint64
	costs    Costs
	sleep    bool

	mu       sync.Mutex // guards everything below
	mem      space      // device memory addresses
	vm       space      // virtual-memory reservations
	live     map[device.Ptr]Range
	reserved map[device.Ptr]*reservation
	host     map[*byte]int
	used     uint64
	c        Counters
	clock    time.Duration

	streams    []streamState // index = stream id; 0 is the default stream
	events     map[device.Event]eventState
	nextEvent  device.Event
	faults     faults
	mallocCall int64 // Malloc and Map calls so far, for FailNthMalloc
}

type streamState struct {
	busy      bool
	queued    uint64 // work items recorded so far
	completed uint64 // work items finished
}

type eventState struct {
	stream device.Stream
	seq    uint64 // the event is done once the stream's completed >= seq
}

// New returns a simulated device.
func New(cfg Config) (*Device, error) {
	if cfg.Ordinal < 0 || cfg.Ordinal > MaxOrdinal {
		return nil, fmt.Errorf("sim: ordinal %d out of range 0..%d: %w", cfg.Ordinal, MaxOrdinal, device.ErrInvalidArgument)
	}
	if cfg.Name == "" {
		cfg.Name = DefaultName
	}
	if cfg.Capacity == 0 {
		cfg.Capacity = DefaultCapacity
	}
	if cfg.Capacity > MaxCapacity {
		return nil, fmt.Errorf("sim: capacity %d is more than %d: %w", cfg.Capacity, uint64(MaxCapacity), device.ErrInvalidArgument)
	}
	if cfg.PageSize == 0 {
		cfg.PageSize = DefaultPageSize
	}
	if cfg.PageSize&(cfg.PageSize-1) != 0 || cfg.PageSize > MaxCapacity/2 {
		return nil, fmt.Errorf("sim: page size %d is not a power of two: %w", cfg.PageSize, device.ErrInvalidArgument)
	}
	if cfg.Costs == (Costs{}) {
		cfg.Costs = DefaultCosts()
	}
	base := device.Ptr(cfg.Ordinal+1) << 44
	d := &Device{
		ordinal:  cfg.Ordinal,
		name:     cfg.Name,
		capacity: cfg.Capacity,
		page:     cfg.PageSize,
		costs:    cfg.Costs.normalized(),
		sleep:    cfg.Sleep,
		mem:      newSpace(base, 1<<43),
		vm:       newSpace(base+1<<43, 1<<43),
		live:     make(map[device.Ptr]Range),
		reserved: make(map[device.Ptr]*reservation),
		host:     make(map[*byte]int),
		streams:  make([]streamState, 1),
		events:   make(map[device.Event]eventState),
	}
	return d, nil
}

// Ordinal returns the device's ordinal.
func (d *Device) Ordinal() int { return d.ordinal }

// Name returns the device's name.
func (d *Device) Name() string { return d.name }

// Capacity returns the device's total memory.
func (d *Device) Capacity() uint64 { return d.capacity }

// PageSize returns the allocation page size.
func (d *Device) PageSize() uint64 { return d.page }

// String describes the device.
func (d *Device) String() string {
	return fmt.Sprintf("%s %d (%s, %s pages)", d.name, d.ordinal, fmtBytes(d.capacity), fmtBytes(d.page))
}

// charge returns size rounded up to whole pages, or false on overflow.
func (d *Device) charge(size uint64) (uint64, bool) {
	n := (size + d.page - 1) / d.page * d.page
	return n, n >= size
}

// pay adds a cost to the clock and returns how long the caller should
// sleep after unlocking.
func (d *Device) pay(c time.Duration) time.Duration {
	d.clock += c
	if d.sleep {
		return c
	}
	return 0
}

func nap(t time.Duration) {
	if t > 0 {
		time.Sleep(t)
	}
}

func (d *Device) errorf(op string, sentinel error, format string, args ...any) error {
	return &device.Error{Op: op, Device: d.ordinal, Err: sentinel, Message: fmt.Sprintf(format, args...)}
}

// Malloc reserves size bytes, charged in whole pages against capacity, at
// the lowest free page-aligned address where they fit (first fit).
func (d *Device) Malloc(size uint64) (device.Ptr, error) {
	d.mu.Lock()
	p, t, err := d.mallocLocked(size)
	d.mu.Unlock()
	nap(t)
	return p, err
}

func (d *Device) mallocLocked(size uint64) (device.Ptr, time.Duration, error) {
	if size == 0 {
		return 0, 0, d.errorf("malloc", device.ErrInvalidSize, "size 0")
	}
	pages, ok := d.charge(size)
	if !ok || pages > d.capacity {
		d.c.FailedMallocs++
		return 0, 0, d.errorf("malloc", device.ErrOutOfMemory, "%d bytes is more than the device's %d", size, d.capacity)
	}
	d.mallocCall++
	if err := d.faults.mallocFault(d.mallocCall, size); err != nil {
		d.c.FailedMallocs++
		return 0, 0, d.errorf("malloc", device.ErrOutOfMemory, "%v", err)
	}
	if d.used+pages > d.capacity {
		d.c.FailedMallocs++
		return 0, 0, d.errorf("malloc", device.ErrOutOfMemory, "%d bytes requested, %d free", size, d.capacity-d.used)
	}
	p, ok := d.mem.take(pages)
	if !ok {
		d.c.FailedMallocs++
		return 0, 0, d.errorf("malloc", device.ErrOutOfMemory, "address space exhausted")
	}
	d.live[p] = Range{Ptr: p, Size: size, Pages: pages}
	d.useLocked(int64(pages))
	d.c.Mallocs++
	return p, d.pay(d.costs.mallocCost(pages)), nil
}

func (d *Device) useLocked(delta int64) {
	d.used = uint64(int64(d.used) + delta)
	d.c.BytesInUse = d.used
	d.c.PeakBytesInUse = max(d.c.PeakBytesInUse, d.used)
}

// Free returns an allocation. Like cudaFree it implies a device
// synchronization, which it charges to the clock and counts; it does not
// complete work on busy streams (see the package doc).
func (d *Device) Free(p device.Ptr) error {
	d.mu.Lock()
	t, err := d.freeLocked(p)
	d.mu.Unlock()
	nap(t)
	return err
}

func (d *Device) freeLocked(p device.Ptr) (time.Duration, error) {
	r, ok := d.live[p]
	if !ok {
		d.c.FailedFrees++
		return 0, d.errorf("free", device.ErrInvalidPointer, "%v was not returned by Malloc or was already freed", p)
	}
	if err := d.faults.freeErr; err != nil {
		d.c.FailedFrees++
		return 0, fmt.Errorf("sim: device %d: free %v: %w", d.ordinal, p, err)
	}
	delete(d.live, p)
	d.mem.give(p, r.Pages)
	d.useLocked(-int64(r.Pages))
	d.c.Frees++
	d.c.Synchronizations++
	return d.pay(d.costs.Free + d.costs.Synchronize), nil
}

// MemInfo returns the free and total memory: capacity less the charged
// pages, and capacity.
func (d *Device) MemInfo() (free, total uint64, err error) {
	d.mu.Lock()
	free, total = d.capacity-d.used, d.capacity
	t := d.pay(d.costs.MemInfo)
	d.mu.Unlock()
	nap(t)
	return free, total, nil
}

// BytesInUse returns the bytes charged against capacity.
func (d *Device) BytesInUse() uint64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.used
}

// Counters returns a copy of the device's counters.
func (d *Device) Counters() Counters {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.c
}

// Clock returns the simulated device time that all calls so far have
// cost.
func (d *Device) Clock() time.Duration {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.clock
}

// Allocations returns the live Malloc ranges in address order.
func (d *Device) Allocations() []Range {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make([]Range, 0, len(d.live))
	for _, r := range d.live {
		out = append(out, r)
	}
	sortRanges(out)
	return out
}

// Synchronize finishes the work of every stream.
func (d *Device) Synchronize() error {
	d.mu.Lock()
	for i := range d.streams {
		d.streams[i].completed = d.streams[i].queued
	}
	d.c.Synchronizations++
	t := d.pay(d.costs.Synchronize)
	d.mu.Unlock()
	nap(t)
	return nil
}

// NewStream creates a stream. Streams are numbered 1, 2, 3, ... in
// creation order on every device.
func (d *Device) NewStream() (device.Stream, error) {
	d.mu.Lock()
	d.streams = append(d.streams, streamState{})
	s := device.Stream(len(d.streams) - 1)
	d.c.StreamsCreated++
	t := d.pay(d.costs.StreamCreate)
	d.mu.Unlock()
	nap(t)
	return s, nil
}

// HasStream reports whether s is a stream of this device.
func (d *Device) HasStream(s device.Stream) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return s < device.Stream(len(d.streams))
}

func (d *Device) streamLocked(op string, s device.Stream) (*streamState, error) {
	if s >= device.Stream(len(d.streams)) {
		return nil, d.errorf(op, device.ErrInvalidStream, "stream %d does not exist", s)
	}
	return &d.streams[s], nil
}

// SynchronizeStream finishes the work queued on s so far.
func (d *Device) SynchronizeStream(s device.Stream) error {
	d.mu.Lock()
	st, err := d.streamLocked("synchronize stream", s)
	var t time.Duration
	if err == nil {
		st.completed = st.queued
		d.c.Synchronizations++
		t = d.pay(d.costs.Synchronize)
	}
	d.mu.Unlock()
	nap(t)
	return err
}

// SetStreamBusy makes work queued on s stay pending (busy) or finish at
// once (not busy: pending work finishes now).
func (d *Device) SetStreamBusy(s device.Stream, busy bool) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	st, err := d.streamLocked("set stream busy", s)
	if err != nil {
		return err
	}
	st.busy = busy
	if !busy {
		st.completed = st.queued
	}
	return nil
}

// CompleteStream finishes the work queued on s so far; s stays busy for
// later work if it was.
func (d *Device) CompleteStream(s device.Stream) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	st, err := d.streamLocked("complete stream", s)
	if err != nil {
		return err
	}
	st.completed = st.queued
	return nil
}

// RecordEvent records an event on s. On a stream that is not busy it is
// done at once.
func (d *Device) RecordEvent(s device.Stream) (device.Event, error) {
	d.mu.Lock()
	st, err := d.streamLocked("record event", s)
	if err != nil {
		d.mu.Unlock()
		return 0, err
	}
	st.queued++
	if !st.busy {
		st.completed = st.queued
	}
	d.nextEvent++
	e := d.nextEvent
	d.events[e] = eventState{stream: s, seq: st.queued}
	d.c.EventsRecorded++
	t := d.pay(d.costs.EventRecord)
	d.mu.Unlock()
	nap(t)
	return e, nil
}

func (d *Device) eventLocked(op string, e device.Event) (eventState, error) {
	ev, ok := d.events[e]
	if !ok {
		return ev, d.errorf(op, device.ErrInvalidEvent, "event %d does not exist or was released", e)
	}
	if err := d.faults.eventErr; err != nil {
		return ev, fmt.Errorf("sim: device %d: %s %d: %w", d.ordinal, op, e, err)
	}
	return ev, nil
}

// EventDone reports whether the work before e has finished.
func (d *Device) EventDone(e device.Event) (bool, error) {
	d.mu.Lock()
	ev, err := d.eventLocked("query event", e)
	var done bool
	var t time.Duration
	if err == nil {
		done = d.streams[ev.stream].completed >= ev.seq
		d.c.EventQueries++
		t = d.pay(d.costs.EventQuery)
	}
	d.mu.Unlock()
	nap(t)
	return done, err
}

// SynchronizeEvent waits for e: the work of its stream up to and including
// e finishes.
func (d *Device) SynchronizeEvent(e device.Event) error {
	d.mu.Lock()
	ev, err := d.eventLocked("synchronize event", e)
	var t time.Duration
	if err == nil {
		st := &d.streams[ev.stream]
		st.completed = max(st.completed, ev.seq)
		t = d.pay(d.costs.EventSynchronize)
	}
	d.mu.Unlock()
	nap(t)
	return err
}

// ReleaseEvent destroys e.
func (d *Device) ReleaseEvent(e device.Event) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, ok := d.events[e]; !ok {
		return d.errorf("release event", device.ErrInvalidEvent, "event %d does not exist or was released", e)
	}
	delete(d.events, e)
	d.c.EventsReleased++
	d.pay(d.costs.EventRelease)
	return nil
}

// space is a sparse address range handed out first fit, lowest address
// first, in whole pages. Free holes are kept in a B-tree by address; the
// region above the highest allocation is always free.
type space struct {
	base, limit device.Ptr
	top         device.Ptr // lowest address above every allocation
	holes       *btree.BTreeG[hole]
}

type hole struct {
	ptr  device.Ptr
	size uint64
}

func newSpace(base device.Ptr, size uint64) space {
	return space{base: base, limit: base + device.Ptr(size), top: base,
		holes: btree.NewG(8, func(a, b hole) bool { return a.ptr < b.ptr })}
}

// take returns the lowest address of a hole of at least size bytes.
func (s *space) take(size uint64) (device.Ptr, bool) {
	var found hole
	ok := false
	s.holes.Ascend(func(h hole) bool {
		if h.size >= size {
			found, ok = h, true
			return false
		}
		return true
	})
	if ok {
		s.holes.Delete(found)
		if found.size > size {
			s.holes.ReplaceOrInsert(hole{ptr: found.ptr + device.Ptr(size), size: found.size - size})
		}
		return found.ptr, true
	}
	if uint64(s.limit-s.top) < size {
		return 0, false
	}
	p := s.top
	s.top += device.Ptr(size)
	return p, true
}

// give returns [p, p+size) to the space, merging it with free neighbours.
func (s *space) give(p device.Ptr, size uint64) {
	h := hole{ptr: p, size: size}
	var below, above hole
	hasBelow, hasAbove := false, false
	s.holes.DescendLessOrEqual(hole{ptr: p}, func(x hole) bool { below, hasBelow = x, true; return false })
	s.holes.AscendGreaterOrEqual(hole{ptr: p}, func(x hole) bool { above, hasAbove = x, true; return false })
	if hasBelow && below.ptr+device.Ptr(below.size) == h.ptr {
		s.holes.Delete(below)
		h = hole{ptr: below.ptr, size: below.size + h.size}
	}
	if hasAbove && h.ptr+device.Ptr(h.size) == above.ptr {
		s.holes.Delete(above)
		h.size += above.size
	}
	if h.ptr+device.Ptr(h.size) == s.top {
		s.top = h.ptr
		return
	}
	s.holes.ReplaceOrInsert(h)
}
