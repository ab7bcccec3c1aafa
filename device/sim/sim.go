// Simulated device: configuration, construction, device memory and the
// clock. See doc.go for the model.

package sim

import (
	"cmp"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gpumem/gpumem/device"
)

// Limits and defaults of Config.
const (
	DefaultName         = "gpumem simulated device"
	DefaultCapacity     = 80 << 30 // 80 GiB
	DefaultPageSize     = 2 << 20  // 2 MiB
	DefaultHostCapacity = 4 << 30  // 4 GiB of pinned host memory
	MaxCapacity         = 8 << 40  // 8 TiB: the size of a device's address region
	MaxHostCapacity     = 1 << 40  // 1 TiB
	MinPageSize         = 512
	MaxPageSize         = 1 << 30
	MaxOrdinal          = 63
)

// Address layout: device memory of ordinal o is [(o+1)<<44, (o+1)<<44 +
// 8 TiB); its virtual-memory reservations are [1<<56 + o<<50, 1<<56 +
// (o+1)<<50), 1 PiB: room for the ranges of expandable segments (9/8 of
// the device's memory per stream and pool) even on the largest device.
const (
	regionShift   = 44
	regionSize    = 1 << 43
	vmRegionBase  = 1 << 56
	vmRegionShift = 50
	vmRegionSize  = 1 << vmRegionShift
)

// Config describes a simulated device. The zero Config is an 80 GiB device
// with 2 MiB pages, ordinal 0 and the default costs.
type Config struct {
	Ordinal  int    // device ordinal, 0..63
	Name     string // default DefaultName
	Capacity uint64 // bytes; default 80 GiB; at most 8 TiB
	PageSize uint64 // allocation page and virtual-memory granularity; default 2 MiB; a power of two, 512 B to 1 GiB
	// Costs is the simulated time of each call. A zero field takes its
	// default (DefaultCosts), a negative one costs nothing.
	Costs Costs
	// Sleep makes every call really sleep for its simulated cost, outside
	// the device's lock, for demos.
	Sleep bool
	// HostCapacity bounds the pinned host memory live at once (HostAlloc
	// hands out real Go memory); default 4 GiB, at most 1 TiB.
	HostCapacity uint64
}

// Counters count what the device has been asked to do. Counts of calls
// count successful calls; the Failed counts count calls that returned an
// error (see the package doc for which errors count where).
type Counters struct {
	Mallocs, Frees             int64
	FailedMallocs, FailedFrees int64
	// BytesInUse is what is charged against capacity: Malloc ranges
	// rounded up to whole pages, mapped pages and the stream-ordered
	// pool's chunks. PeakBytesInUse is its
	// highest value.
	BytesInUse, PeakBytesInUse uint64
	// Synchronizations counts device-wide synchronizations: Synchronize
	// calls and the one each successful Free implies.
	Synchronizations int64
	EventsRecorded   int64
	EventsReleased   int64
	EventQueries     int64
	EventWaits       int64 // successful WaitEvent calls
	// StreamWaits counts successful WaitStream calls: each a record on
	// the awaited stream and a wait, without an event to release.
	StreamWaits    int64
	StreamsCreated int64
	Maps, Unmaps   int64
	Reserves       int64
	Releases       int64

	MemInfos               int64
	StreamSynchronizations int64
	EventSynchronizations  int64
	FailedMaps             int64 // Map calls that failed with ErrOutOfMemory
	FailedUnmaps           int64 // Unmap calls that failed by FailFrees
	FailedEventQueries     int64 // EventDone and SynchronizeEvent calls failed by FailEventQueries
	MappedBytes            uint64
	HostAllocs, HostFrees  int64
	HostBytesInUse         uint64
	// StreamVisits counts the streams Synchronize visited to finish
	// their work: those left with work pending since the last
	// Synchronize, or every stream while a stream waits on another's
	// event. It is the simulator's own work, not a call: a test bounds it
	// to show that a synchronization costs no more with streams that hold
	// nothing.
	StreamVisits int64

	Copies, FailedCopies int64  // CopyToHost and CopyFromHost calls
	CopiedBytes          uint64 // bytes the successful copies moved
	// The stream-ordered pool: MallocAsync and FreeAsync calls, chunks it
	// took from the device and gave back, and TrimPool calls.
	AsyncMallocs, FailedAsyncMallocs int64
	AsyncFrees, FailedAsyncFrees     int64
	PoolGrowths, PoolReleases        int64
	PoolTrims                        int64
}

// Range is one live Malloc allocation.
type Range struct {
	Ptr     device.Ptr
	Size    uint64 // bytes asked for
	Charged uint64 // bytes charged against capacity: Size rounded up to whole pages
}

// End returns the address just past the charged bytes.
func (r Range) End() device.Ptr { return r.Ptr + device.Ptr(r.Charged) }

// Device is a simulated GPU. It implements device.Device and every
// optional capability (device.VirtualMemory, device.HostMemory,
// device.StreamChecker, device.UsageReporter, device.StreamWaiter,
// device.ProgressReporter, device.Copier, device.StreamOrderedMemory), and
// is safe for concurrent use.
type Device struct {
	// Fixed at construction; read without the lock.
	ordinal  int
	name     string
	capacity uint64
	page     uint64
	hostCap  uint64
	costs    Costs
	sleep    bool
	memBase  device.Ptr
	vmBase   device.Ptr

	// when is FailMallocWhen's predicate. It is read without mu so that it
	// is never called with the lock held.
	when atomic.Pointer[func(size uint64) bool]

	mu      sync.Mutex // guards everything below
	mem     freeSpace  // free device-memory addresses
	vm      freeSpace  // free virtual-memory addresses
	live    map[device.Ptr]Range
	resv    []*reservation // by base address
	host    map[*byte]uint64
	used    uint64 // charged bytes: live pages plus mapped pages
	c       Counters
	clock   time.Duration
	streams []streamState   // index: stream id; 0 is the default stream
	waits   int             // waits of all streams not yet passed (WaitEvent)
	events  eventTable      // live events by id (events.go)
	adopted map[uintptr]int // adopted streams by external name (AdoptStreamHandle), to their index
	faults  faults
	content contents  // bytes copied to the device (copy.go)
	pool    asyncPool // the stream-ordered pool (pool.go)

	// unfinished lists the streams that may hold unfinished work (see
	// streamState.listed), so that Synchronize visits only those.
	unfinished []int
	// progress logs the streams that finished more of their work, by the
	// index of each stream, the first at mark progressBase (Progressed).
	progress     []int32
	progressBase uint64
	// progressAsked is the newest mark Progressed returned: no caller
	// holds a later one (see progressedLocked).
	progressAsked uint64
}

// New returns a simulated device, or an error wrapping
// device.ErrInvalidArgument that says which field of cfg is wrong.
func New(cfg Config) (*Device, error) {
	bad := func(format string, args ...any) (*Device, error) {
		return nil, fmt.Errorf("sim: %s: %w", fmt.Sprintf(format, args...), device.ErrInvalidArgument)
	}
	if cfg.Ordinal < 0 || cfg.Ordinal > MaxOrdinal {
		return bad("ordinal %d is outside 0..%d", cfg.Ordinal, MaxOrdinal)
	}
	if cfg.Name == "" {
		cfg.Name = DefaultName
	}
	if cfg.PageSize == 0 {
		cfg.PageSize = DefaultPageSize
	}
	if cfg.PageSize&(cfg.PageSize-1) != 0 || cfg.PageSize < MinPageSize || cfg.PageSize > MaxPageSize {
		return bad("page size %d is not a power of two between %d and %d", cfg.PageSize, MinPageSize, MaxPageSize)
	}
	if cfg.Capacity == 0 {
		cfg.Capacity = DefaultCapacity
	}
	if cfg.Capacity > MaxCapacity {
		return bad("capacity %d is more than %d (8 TiB)", cfg.Capacity, uint64(MaxCapacity))
	}
	if cfg.Capacity < cfg.PageSize {
		return bad("capacity %d is less than one page of %d bytes", cfg.Capacity, cfg.PageSize)
	}
	if cfg.HostCapacity == 0 {
		cfg.HostCapacity = DefaultHostCapacity
	}
	if cfg.HostCapacity > MaxHostCapacity {
		return bad("host capacity %d is more than %d (1 TiB)", cfg.HostCapacity, uint64(MaxHostCapacity))
	}
	memBase := device.Ptr(cfg.Ordinal+1) << regionShift
	vmBase := device.Ptr(vmRegionBase) + device.Ptr(cfg.Ordinal)<<vmRegionShift
	return &Device{
		ordinal:  cfg.Ordinal,
		name:     cfg.Name,
		capacity: cfg.Capacity,
		page:     cfg.PageSize,
		hostCap:  cfg.HostCapacity,
		costs:    cfg.Costs.resolve(),
		sleep:    cfg.Sleep,
		memBase:  memBase,
		vmBase:   vmBase,
		mem:      newFreeSpace(uint64(memBase), regionSize),
		vm:       newFreeSpace(uint64(vmBase), vmRegionSize),
		live:     make(map[device.Ptr]Range),
		host:     make(map[*byte]uint64),
		streams:  make([]streamState, 1),
		adopted:  make(map[uintptr]int),
	}, nil
}

// Ordinal returns the device's ordinal.
func (d *Device) Ordinal() int { return d.ordinal }

// Name returns the device's name.
func (d *Device) Name() string { return d.name }

// Capacity returns the device's total memory in bytes.
func (d *Device) Capacity() uint64 { return d.capacity }

// PageSize returns the allocation page size in bytes.
func (d *Device) PageSize() uint64 { return d.page }

// Costs returns the cost model in use, defaults filled in and negative
// fields turned to zero.
func (d *Device) Costs() Costs { return d.costs }

// MemoryBase returns the lowest address Malloc can return.
func (d *Device) MemoryBase() device.Ptr { return d.memBase }

// VirtualBase returns the lowest address Reserve can return.
func (d *Device) VirtualBase() device.Ptr { return d.vmBase }

// MemoryRegionSize is the size of a device's address region for Malloc:
// 8 TiB. VirtualRegionSize is the size of its region for Reserve: 1 PiB.
const (
	MemoryRegionSize  = regionSize
	VirtualRegionSize = vmRegionSize
)

// String describes the device and how much of it is in use.
func (d *Device) String() string {
	d.mu.Lock()
	used := d.used
	d.mu.Unlock()
	return fmt.Sprintf("sim device %d (%s): %s of %s in use, %s pages",
		d.ordinal, d.name, formatBytes(used), formatBytes(d.capacity), formatBytes(d.page))
}

// pagesFor returns size rounded up to whole pages, or false when that does
// not fit in a uint64.
func (d *Device) pagesFor(size uint64) (uint64, bool) {
	if size > ^uint64(0)-(d.page-1) {
		return 0, false
	}
	return (size + d.page - 1) &^ (d.page - 1), true
}

// payLocked adds a call's cost to the clock and returns how long the
// caller must sleep once it has unlocked (zero unless Config.Sleep).
func (d *Device) payLocked(c time.Duration) time.Duration {
	d.clock = plus(d.clock, c)
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

func (d *Device) fail(op string, err error, format string, args ...any) error {
	return &device.Error{Op: op, Device: d.ordinal, Err: err, Message: fmt.Sprintf(format, args...)}
}

// chargeLocked adds n bytes to the charged total.
func (d *Device) chargeLocked(n uint64) {
	d.used += n
	d.c.BytesInUse = d.used
	d.c.PeakBytesInUse = max(d.c.PeakBytesInUse, d.used)
}

// unchargeLocked removes n bytes from the charged total.
func (d *Device) unchargeLocked(n uint64) {
	d.used -= n
	d.c.BytesInUse = d.used
}

// Malloc reserves size bytes at the lowest free page-aligned address where
// whole pages fit (first fit), charging those pages against capacity. It
// fails with device.ErrInvalidSize for size 0 or a size whose page
// rounding overflows, and with device.ErrOutOfMemory when fewer bytes are
// free than it would charge (or a fault injected by FailNthMalloc,
// FailMallocAbove or FailMallocWhen says so).
func (d *Device) Malloc(size uint64) (device.Ptr, error) {
	injected := d.predicateSays(size)
	d.mu.Lock()
	p, t, err := d.mallocLocked(size, injected)
	d.mu.Unlock()
	nap(t)
	return p, err
}

func (d *Device) mallocLocked(size uint64, injected bool) (device.Ptr, time.Duration, error) {
	const op = "malloc"
	pages, ok := d.pagesFor(size)
	charged := pages // MallocPerGiB applies to whole pages, as a real card maps them
	if !ok {
		charged = size
	}
	t := d.payLocked(d.costs.malloc(charged))
	if size == 0 || !ok {
		d.c.FailedMallocs++
		return 0, t, d.fail(op, device.ErrInvalidSize, "size %d", size)
	}
	if why := d.faults.mallocFault(size, injected); why != "" {
		d.c.FailedMallocs++
		return 0, t, d.fail(op, device.ErrOutOfMemory, "%s requested; injected fault: %s", formatBytes(size), why)
	}
	if pages > d.capacity-d.used {
		d.c.FailedMallocs++
		return 0, t, d.fail(op, device.ErrOutOfMemory, "%s requested (%s in pages), %s free of %s",
			formatBytes(size), formatBytes(pages), formatBytes(d.capacity-d.used), formatBytes(d.capacity))
	}
	a, ok := d.mem.take(pages)
	if !ok {
		d.c.FailedMallocs++
		return 0, t, d.fail(op, device.ErrOutOfMemory, "%s requested: the 8 TiB address region is too fragmented", formatBytes(size))
	}
	p := device.Ptr(a)
	d.live[p] = Range{Ptr: p, Size: size, Charged: pages}
	d.chargeLocked(pages)
	d.c.Mallocs++
	return p, t, nil
}

// Free returns an allocation that Malloc made. Like cudaFree it implies a
// device synchronization, which it charges to the clock and counts; it does
// not finish work held on busy streams (see the package doc). An address
// that is not a live allocation's start fails with device.ErrInvalidPointer
// and changes nothing.
func (d *Device) Free(p device.Ptr) error {
	d.mu.Lock()
	t, err := d.freeLocked(p)
	d.mu.Unlock()
	nap(t)
	return err
}

func (d *Device) freeLocked(p device.Ptr) (time.Duration, error) {
	const op = "free"
	t := d.payLocked(d.costs.Free)
	r, ok := d.live[p]
	if !ok {
		d.c.FailedFrees++
		return t, d.fail(op, device.ErrInvalidPointer, "%v is not an address Malloc returned, or it was freed already", p)
	}
	if err := d.faults.freeErr; err != nil {
		d.c.FailedFrees++
		return t, d.fail(op, err, "%v: injected fault", p)
	}
	delete(d.live, p)
	d.dropLocked(uint64(p), uint64(p)+r.Charged)
	d.mem.give(uint64(p), r.Charged)
	d.unchargeLocked(r.Charged)
	d.c.Frees++
	d.c.Synchronizations++
	t += d.payLocked(d.costs.Synchronize)
	return t, nil
}

// MemInfo returns the free memory (capacity less the charged pages) and the
// capacity, as cudaMemGetInfo does.
func (d *Device) MemInfo() (free, total uint64, err error) {
	d.mu.Lock()
	free, total = d.capacity-d.used, d.capacity
	d.c.MemInfos++
	t := d.payLocked(d.costs.MemInfo)
	d.mu.Unlock()
	nap(t)
	return free, total, nil
}

// BytesInUse returns the bytes charged against capacity (Malloc pages,
// mapped pages and the stream-ordered pool's chunks): the device.UsageReporter capability. Unlike MemInfo it
// costs nothing and counts nothing.
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

// Clock returns the simulated device time that all calls so far have cost.
func (d *Device) Clock() time.Duration {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.clock
}

// Allocations returns the live Malloc ranges in address order.
func (d *Device) Allocations() []Range {
	d.mu.Lock()
	out := make([]Range, 0, len(d.live))
	for _, r := range d.live {
		out = append(out, r)
	}
	d.mu.Unlock()
	slices.SortFunc(out, func(a, b Range) int { return cmp.Compare(a.Ptr, b.Ptr) })
	return out
}

// formatBytes prints a byte count exactly when it is a whole number of a
// binary unit, else with two decimals.
func formatBytes(n uint64) string {
	units := []struct {
		shift uint
		name  string
	}{{40, "TiB"}, {30, "GiB"}, {20, "MiB"}, {10, "KiB"}}
	for _, u := range units {
		if n >= 1<<u.shift {
			if n%(1<<u.shift) == 0 {
				return fmt.Sprintf("%d %s", n>>u.shift, u.name)
			}
			return fmt.Sprintf("%.2f %s", float64(n)/float64(uint64(1)<<u.shift), u.name)
		}
	}
	return fmt.Sprintf("%d B", n)
}
