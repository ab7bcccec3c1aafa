// Package host is a caching allocator for pinned (page-locked) host
// memory, as PyTorch 2.6's CachingHostAllocator: what tensor.pin_memory()
// and a DataLoader's pin_memory=True use, so that host-to-device copies can
// run asynchronously without paying cudaHostAlloc and the synchronizing
// cudaFreeHost for every buffer.
//
// # Model
//
//   - A request is rounded up to a power of two; a block is one host
//     allocation of that size and is never split.
//   - Free blocks wait in one LIFO list per power of two, so a block freed
//     last is handed out first.
//   - A block used by work on device streams (RecordStream, typically the
//     stream of an asynchronous copy) is not reusable when freed: an event
//     is recorded on each of those streams, and the block joins its free
//     list once all of them are done. Pending events are checked, oldest
//     first on each stream, at the start of every Alloc and by EmptyCache,
//     which also waits for the rest. The queue is the device allocator's
//     (allocator/internal/deferred), with its policy on device failures: an
//     event that cannot be recorded is replaced by synchronizing the streams.
//   - EmptyCache returns every free block to the device.
//
// Alloc returns a slice of the requested length whose capacity is the
// block's; Free and RecordStream take a slice that starts at a block's
// first byte. Stats counts what PyTorch's host_memory_stats counts.
//
// An Allocator is safe for concurrent use; one mutex guards its state and
// device calls on the slow paths are made with it held.
package host

import (
	"errors"
	"fmt"
	"math/bits"
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
	NumHostAlloc   int64      // host allocations made (cudaHostAlloc)
	NumHostFree    int64      // host allocations returned (cudaFreeHost)
}

// Map returns the stats under PyTorch's host_memory_stats key names.
func (s Stats) Map() map[string]int64 {
	m := map[string]int64{"num_host_alloc": s.NumHostAlloc, "num_host_free": s.NumHostFree}
	for name, st := range map[string]stats.Stat{
		"allocations": s.Allocations, "allocated_bytes": s.AllocatedBytes,
		"active_requests": s.ActiveRequests, "active_bytes": s.ActiveBytes,
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
	size      uint64 // len(mem), a power of two
	allocated bool
	events    int             // outstanding events
	streams   []device.Stream // streams used on, recorded before the free
}

// Allocator caches pinned host memory of one device.
type Allocator struct {
	dev  device.Device
	host device.HostMemory

	mu     sync.Mutex              // guards everything below
	blocks map[*byte]*block        // every block, by its first byte
	free   [64][]*block            // free blocks by log2 of their size, LIFO
	events *deferred.Queue[*block] // frees waiting for stream work
	st     Stats
}

// New returns a host allocator for dev, which must have the
// device.HostMemory capability.
func New(dev device.Device) (*Allocator, error) {
	if dev == nil {
		return nil, errors.New("host: nil device")
	}
	h, ok := dev.(device.HostMemory)
	if !ok {
		return nil, fmt.Errorf("host: device %s has no pinned host memory: %w", dev.Name(), device.ErrNotSupported)
	}
	return &Allocator{dev: dev, host: h, blocks: make(map[*byte]*block), events: deferred.New[*block](dev)}, nil
}

// roundPow2 rounds n (> 0) up to a power of two.
func roundPow2(n uint64) uint64 {
	if n&(n-1) == 0 {
		return n
	}
	return 1 << bits.Len64(n)
}

// Alloc returns size bytes of pinned host memory: a slice of length size
// whose capacity is its block's (size rounded up to a power of two). Size
// 0 returns nil.
func (a *Allocator) Alloc(size uint64) ([]byte, error) {
	if size == 0 {
		return nil, nil
	}
	if size > 1<<62 {
		return nil, fmt.Errorf("host: cannot allocate %d bytes: %w", size, device.ErrInvalidSize)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.events.Len() > 0 {
		a.events.Poll(a.completeLocked)
	}
	n := roundPow2(size)
	i := bits.Len64(n) - 1
	var b *block
	if l := a.free[i]; len(l) > 0 {
		b = l[len(l)-1]
		l[len(l)-1] = nil
		a.free[i] = l[:len(l)-1]
	} else {
		mem, err := a.host.HostAlloc(n)
		if err != nil {
			return nil, fmt.Errorf("host: allocating %d bytes of pinned memory: %w", n, err)
		}
		if uint64(len(mem)) != n {
			return nil, fmt.Errorf("host: device returned %d bytes for %d", len(mem), n)
		}
		b = &block{mem: mem, size: n}
		a.blocks[&mem[0]] = b
		a.st.NumHostAlloc++
		a.st.Allocations.Increase(1)
		a.st.AllocatedBytes.Increase(int64(n))
	}
	b.allocated = true
	a.st.ActiveRequests.Increase(1)
	a.st.ActiveBytes.Increase(int64(n))
	return b.mem[:size:n], nil
}

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
// error that changes nothing.
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
	i := bits.Len64(b.size) - 1
	a.free[i] = append(a.free[i], b)
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
// to the device. A device error leaves the blocks it concerns cached.
func (a *Allocator) EmptyCache() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	var errs []error
	if err := a.events.Drain(a.completeLocked); err != nil {
		errs = append(errs, fmt.Errorf("host: %w", err))
	}
	for i, l := range a.free {
		kept := l[:0]
		for _, b := range l {
			if err := a.host.HostFree(b.mem); err != nil {
				errs = append(errs, fmt.Errorf("host: freeing %d bytes of pinned memory: %w", b.size, err))
				kept = append(kept, b)
				continue
			}
			delete(a.blocks, &b.mem[0])
			a.st.NumHostFree++
			a.st.Allocations.Decrease(1)
			a.st.AllocatedBytes.Decrease(int64(b.size))
		}
		clear(l[len(kept):])
		a.free[i] = kept
	}
	return errors.Join(errs...)
}

// Stats returns a copy of the statistics.
func (a *Allocator) Stats() Stats {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.st
}
