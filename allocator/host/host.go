// Package host is a caching allocator for pinned (page-locked) host
// memory, as PyTorch's CachingHostAllocator: what tensor.pin_memory()
// and a DataLoader's pin_memory=True use, so that host-to-device copies can
// run asynchronously without paying cudaHostAlloc and the synchronizing
// cudaFreeHost for every buffer.
//
// # Model
//
//   - A request is rounded up to a power of two, as PyTorch does (or, with
//     Config.Rounding RoundEighths, gpumem's own, to one of eight steps
//     per power of two above 1 MiB); a block is never split.
//   - Free blocks wait in one LIFO list per size class, so a block freed
//     last is handed out first.
//   - A new block is one host allocation (device.HostMemory.HostAlloc),
//     or a piece of the reserve segment when Config.Pinned asks for one.
//   - A block used by work on device streams (RecordStream, typically the
//     stream of an asynchronous copy) is not reusable when freed: an event
//     is recorded on each of those streams, and the block joins its free
//     list once all of them are done. Pending events are checked, oldest
//     first on each stream, at the start of every Alloc (or, with
//     UseBackgroundThreads, by a goroutine and on a cache miss) and by
//     EmptyCache, which also waits for the rest. The queue is the device
//     allocator's (allocator/internal/deferred), with its policy on device
//     failures: an event that cannot be recorded is replaced by
//     synchronizing the streams.
//   - EmptyCache returns every free block to the device (but those of the
//     reserve segment); Close also stops the background goroutine and
//     returns the reserve segment.
//
// Config says what PyTorch's pinned_* keys do here. Alloc returns a slice
// of the requested length whose capacity is the block's; Free and
// RecordStream take a slice that starts at a block's first byte. Stats
// counts what PyTorch's host_memory_stats counts; ReservedBytes is the
// pinned host memory held.
//
// # Invariants
//
// Every block is in blocks, by its first byte; a block is allocated, or
// waits for events (events > 0), or is on the free list of its class,
// exactly one of the three. Allocations and AllocatedBytes count blocks;
// Segments and ReservedBytes count host allocations (blocks not carved
// from the reserve, and the reserve segment itself), so that after Close
// with nothing in use both are zero and every host allocation was freed.
//
// An Allocator is safe for concurrent use; one mutex guards its state and
// device calls on the slow paths are made with it held.
package host

import (
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/gpumem/gpumem/allocator/internal/deferred"
	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/stats"
)

// Stats are the host allocator's statistics, named after PyTorch's
// host_memory_stats.
type Stats struct {
	Allocations    stats.Stat // blocks the allocator owns, cached or in use
	AllocatedBytes stats.Stat // their bytes (rounded sizes)
	ActiveRequests stats.Stat // blocks handed out (or freed but waiting for events)
	ActiveBytes    stats.Stat // their bytes
	Segments       stats.Stat // host allocations held (blocks, and the reserve segment)
	ReservedBytes  stats.Stat // their bytes: the pinned host memory held
	NumHostAlloc   int64      // host allocations made (cudaHostAlloc)
	NumHostFree    int64      // host allocations returned (cudaFreeHost)

	// FreeErrorsCaught counts the device errors of Free that FreeCatchAll
	// kept from the caller. gpumem's own; not in Map.
	FreeErrorsCaught int64
}

// Map returns the stats under PyTorch's host_memory_stats key names.
func (s Stats) Map() map[string]int64 {
	m := map[string]int64{"num_host_alloc": s.NumHostAlloc, "num_host_free": s.NumHostFree}
	for name, st := range map[string]stats.Stat{
		"allocations": s.Allocations, "allocated_bytes": s.AllocatedBytes,
		"active_requests": s.ActiveRequests, "active_bytes": s.ActiveBytes,
		"segment": s.Segments, "reserved_bytes": s.ReservedBytes,
	} {
		m[name+".current"] = st.Current
		m[name+".peak"] = st.Peak
		m[name+".allocated"] = st.Allocated
		m[name+".freed"] = st.Freed
	}
	return m
}

type block struct {
	mem       []byte // the whole block
	size      uint64 // len(mem), the block size of its class
	class     int    // index of its free list
	reserved  bool   // carved from the reserve segment: never freed alone
	allocated bool
	events    int             // outstanding events
	streams   []device.Stream // streams used on, recorded before the free
}

// Allocator caches pinned host memory of one device.
type Allocator struct {
	dev  device.Device
	host device.HostMemory
	cfg  Config

	mu      sync.Mutex              // guards everything below
	blocks  map[*byte]*block        // every block, by its first byte
	free    [numClasses][]*block    // free blocks by size class, LIFO
	events  *deferred.Queue[*block] // frees waiting for stream work
	reserve []byte                  // the reserve segment, once made
	carved  uint64                  // bytes of reserve handed to blocks
	bgStop  chan struct{}           // closed to stop the background goroutine
	bgDone  chan struct{}           // closed when it has stopped
	closed  bool                    // Close was called
	st      Stats
}

// ErrClosed is returned by Alloc after Close.
var ErrClosed = errors.New("host: allocator closed")

// New returns a host allocator for dev, which must have the
// device.HostMemory capability, configured by cfg (the zero Config is
// PyTorch's defaults). An invalid cfg is an error naming every problem.
func New(dev device.Device, cfg Config) (*Allocator, error) {
	if dev == nil {
		return nil, errors.New("host: nil device")
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	h, ok := dev.(device.HostMemory)
	if !ok {
		return nil, fmt.Errorf("host: device %s has no pinned host memory: %w", dev.Name(), device.ErrNotSupported)
	}
	return &Allocator{dev: dev, host: h, cfg: cfg, blocks: make(map[*byte]*block), events: deferred.New[*block](dev)}, nil
}

// Config returns the allocator's configuration.
func (a *Allocator) Config() Config { return a.cfg }

// Alloc returns size bytes of pinned host memory: a slice of length size
// whose capacity is its block's (size rounded up by the configured
// Rounding: a power of two by default). Size 0 returns nil.
func (a *Allocator) Alloc(size uint64) ([]byte, error) {
	if size == 0 {
		return nil, nil
	}
	if size > maxRequest {
		return nil, fmt.Errorf("host: cannot allocate %d bytes: %w", size, device.ErrInvalidSize)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return nil, ErrClosed
	}
	bg := a.cfg.Pinned.UseBackgroundThreads
	if !bg && a.events.Len() > 0 {
		a.events.Poll(a.completeLocked)
	}
	n, idx := a.cfg.class(size)
	b := a.takeLocked(idx, size)
	if b == nil && bg {
		// The goroutine may not have seen the latest events yet.
		if a.events.Len() > 0 {
			a.events.Poll(a.completeLocked)
			b = a.takeLocked(idx, size)
		}
		a.startBackgroundLocked()
	}
	if b == nil {
		var err error
		if b, err = a.newBlockLocked(n, idx); err != nil {
			return nil, err
		}
	}
	b.allocated = true
	a.st.ActiveRequests.Increase(1)
	a.st.ActiveBytes.Increase(int64(b.size))
	return b.mem[:size:b.size], nil
}

// takeLocked removes and returns the free block to serve a request of
// size bytes in class idx: the last freed of that class; under
// RoundEighths, else the last freed of the smallest class of the next
// nextClassesUsed whose blocks are less than twice the request. Nil when
// there is none.
func (a *Allocator) takeLocked(idx int, size uint64) *block {
	if b := a.popLocked(idx); b != nil || a.cfg.Rounding != RoundEighths {
		return b
	}
	for i := idx + 1; i <= idx+nextClassesUsed && i < numClasses && classSize(i)/2 < size; i++ {
		if b := a.popLocked(i); b != nil {
			return b
		}
	}
	return nil
}

// popLocked removes and returns the last freed block of class i, or nil.
func (a *Allocator) popLocked(i int) *block {
	l := a.free[i]
	if len(l) == 0 {
		return nil
	}
	b := l[len(l)-1]
	l[len(l)-1] = nil
	a.free[i] = l[:len(l)-1]
	return b
}

// newBlockLocked makes a block of n bytes in class idx: carved from the
// reserve segment (made now if configured and not made yet) when it has
// room, else from a new host allocation. On an error nothing changed.
func (a *Allocator) newBlockLocked(n uint64, idx int) (*block, error) {
	if r := a.cfg.Pinned.ReserveSegmentSize; r > 0 {
		if a.reserve == nil {
			mem, err := a.hostAllocLocked(r)
			if err != nil {
				return nil, fmt.Errorf("host: making the reserve segment: %w", err)
			}
			a.reserve = mem
		}
		if take := roundUp(n, pageSize); take <= uint64(len(a.reserve))-a.carved {
			b := &block{mem: a.reserve[a.carved : a.carved+n : a.carved+n], size: n, class: idx, reserved: true}
			a.carved += take
			a.addLocked(b)
			return b, nil
		}
	}
	mem, err := a.hostAllocLocked(n)
	if err != nil {
		return nil, err
	}
	b := &block{mem: mem, size: n, class: idx}
	a.addLocked(b)
	return b, nil
}

// addLocked files a new block.
func (a *Allocator) addLocked(b *block) {
	a.blocks[&b.mem[0]] = b
	a.st.Allocations.Increase(1)
	a.st.AllocatedBytes.Increase(int64(b.size))
}

// hostAllocLocked makes one host allocation of n bytes, touches its pages
// when UseHostRegister asks, and counts it. On an error nothing is held.
func (a *Allocator) hostAllocLocked(n uint64) ([]byte, error) {
	mem, err := a.host.HostAlloc(n)
	if err != nil {
		return nil, fmt.Errorf("host: allocating %d bytes of pinned memory: %w", n, err)
	}
	if uint64(len(mem)) != n {
		err := fmt.Errorf("host: device returned %d bytes for %d", len(mem), n)
		if len(mem) > 0 {
			if ferr := a.host.HostFree(mem); ferr != nil {
				err = fmt.Errorf("%w (and returning them failed: %v)", err, ferr)
			}
		}
		return nil, err
	}
	if t := a.cfg.registerThreads(n); t > 0 {
		touchPages(mem, t)
	}
	a.st.NumHostAlloc++
	a.st.Segments.Increase(1)
	a.st.ReservedBytes.Increase(int64(n))
	return mem, nil
}

// hostFreeLocked returns one host allocation and counts it.
func (a *Allocator) hostFreeLocked(mem []byte) error {
	if err := a.host.HostFree(mem); err != nil {
		return fmt.Errorf("host: freeing %d bytes of pinned memory: %w", len(mem), err)
	}
	a.st.NumHostFree++
	a.st.Segments.Decrease(1)
	a.st.ReservedBytes.Decrease(int64(len(mem)))
	return nil
}

func roundUp(n, m uint64) uint64 { return (n + m - 1) / m * m }

func (a *Allocator) blockLocked(op string, p []byte) (*block, error) {
	if len(p) == 0 {
		return nil, fmt.Errorf("host: %s: empty slice: %w", op, device.ErrInvalidPointer)
	}
	b, ok := a.blocks[&p[0]]
	if !ok || !b.allocated {
		return nil, fmt.Errorf("host: %s: memory not allocated by this allocator, or already freed: %w", op, device.ErrInvalidPointer)
	}
	return b, nil
}

// RecordStream notes that the block starting at p[0] is used by work on
// stream s (an asynchronous copy): when freed, it is reused only after
// that work has finished. A stream that is not the device's is refused
// and changes nothing: the device says so (device.StreamChecker), or,
// when it cannot tell, an event recorded on s and released at once.
func (a *Allocator) RecordStream(p []byte, s device.Stream) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	b, err := a.blockLocked("record stream", p)
	if err != nil {
		return err
	}
	if slices.Contains(b.streams, s) {
		return nil
	}
	if err := a.checkStreamLocked(s); err != nil {
		return err
	}
	b.streams = append(b.streams, s)
	return nil
}

// checkStreamLocked returns an error wrapping device.ErrInvalidStream
// when s is not a stream of the device, so that a block is never recorded
// on a stream whose event its free could not record.
func (a *Allocator) checkStreamLocked(s device.Stream) error {
	if c, ok := a.dev.(device.StreamChecker); ok {
		if !c.HasStream(s) {
			return fmt.Errorf("host: record stream: stream %d is not a stream of device %d: %w", s, a.dev.Ordinal(), device.ErrInvalidStream)
		}
		return nil
	}
	ev, err := a.dev.RecordEvent(s)
	if err != nil {
		return fmt.Errorf("host: record stream: stream %d of device %d: %w", s, a.dev.Ordinal(), err)
	}
	a.events.Release(ev) // a refused release is retried by the queue
	return nil
}

// Free returns the block starting at p[0]. Freeing nil does nothing;
// freeing memory this allocator did not hand out, or freeing twice, is an
// error that changes nothing. A device error (no event could be recorded
// on a stream the block was used on, nor the stream synchronized) leaves
// the block out of the cache; it is returned unless FreeCatchAll is set,
// which counts it in Stats.FreeErrorsCaught instead.
func (a *Allocator) Free(p []byte) error {
	if p == nil {
		return nil
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	b, err := a.blockLocked("free", p)
	if err != nil {
		return err
	}
	n, err := a.events.Record(b, b.streams)
	if err != nil {
		if a.cfg.Pinned.FreeCatchAll {
			a.st.FreeErrorsCaught++
			return nil
		}
		return fmt.Errorf("host: free: %w", err)
	}
	b.allocated = false
	b.streams = b.streams[:0]
	if n == 0 {
		a.releaseLocked(b)
		return nil
	}
	b.events = n
	return nil
}

// releaseLocked puts a block whose work is done on its free list.
func (a *Allocator) releaseLocked(b *block) {
	a.st.ActiveRequests.Decrease(1)
	a.st.ActiveBytes.Decrease(int64(b.size))
	a.free[b.class] = append(a.free[b.class], b)
}

// completeLocked counts one finished event of b's pending free, and
// finishes the free after the last.
func (a *Allocator) completeLocked(b *block) {
	b.events--
	if b.events == 0 {
		a.releaseLocked(b)
	}
}

// EmptyCache waits for every pending event, then returns every free block
// to the device, except blocks carved from the reserve segment, which stay
// cached. A device error leaves the blocks it concerns cached.
func (a *Allocator) EmptyCache() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.emptyCacheLocked()
}

func (a *Allocator) emptyCacheLocked() error {
	var errs []error
	if err := a.events.Drain(a.completeLocked); err != nil {
		errs = append(errs, fmt.Errorf("host: %w", err))
	}
	for i, l := range a.free {
		kept := l[:0]
		for _, b := range l {
			if b.reserved {
				kept = append(kept, b)
				continue
			}
			if err := a.hostFreeLocked(b.mem); err != nil {
				errs = append(errs, err)
				kept = append(kept, b)
				continue
			}
			a.dropLocked(b)
		}
		clear(l[len(kept):])
		a.free[i] = kept
	}
	return errors.Join(errs...)
}

// dropLocked forgets a free block whose memory is gone.
func (a *Allocator) dropLocked(b *block) {
	delete(a.blocks, &b.mem[0])
	a.st.Allocations.Decrease(1)
	a.st.AllocatedBytes.Decrease(int64(b.size))
}

// Close stops the background goroutine (UseBackgroundThreads), empties
// the cache, and returns the reserve segment once none of its blocks is in
// use. Alloc then returns ErrClosed; Free, RecordStream, EmptyCache and
// Close still work, so that blocks handed out before are returned (a
// later Close returns the reserve segment once they are). Close reports
// the errors of emptying the cache.
func (a *Allocator) Close() error {
	a.mu.Lock()
	a.closed = true
	stop, done := a.bgStop, a.bgDone
	a.bgStop = nil
	a.mu.Unlock()
	if stop != nil {
		close(stop)
		<-done
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	err := a.emptyCacheLocked()
	if a.reserve != nil && a.reserveIdleLocked() {
		if ferr := a.hostFreeLocked(a.reserve); ferr != nil {
			return errors.Join(err, ferr)
		}
		for i, l := range a.free {
			a.free[i] = slices.DeleteFunc(l, func(b *block) bool {
				if b.reserved {
					a.dropLocked(b)
					return true
				}
				return false
			})
		}
		a.reserve, a.carved = nil, 0
	}
	return err
}

// reserveIdleLocked reports whether every block carved from the reserve
// segment is free and cached.
func (a *Allocator) reserveIdleLocked() bool {
	for _, b := range a.blocks {
		if b.reserved && (b.allocated || b.events > 0) {
			return false
		}
	}
	return true
}

// Stats returns a copy of the statistics.
func (a *Allocator) Stats() Stats {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.st
}
