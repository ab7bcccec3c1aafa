// This file holds Async, backend:cudaMallocAsync: allocations served by
// the device's stream-ordered pool, as PyTorch's CUDAMallocAsyncAllocator
// serves them.

package allocator

import (
	"errors"
	"fmt"
	"math"
	"sync"

	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/stats"
)

// Async is the allocator of backend:cudaMallocAsync: every Alloc is a
// MallocAsync from the device's stream-ordered pool on the request's
// stream and every Free a FreeAsync, so the caching is the driver's (the
// device.StreamOrderedMemory capability), as with PyTorch's
// PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync. It follows PyTorch's
// backend (c10/cuda/CUDAMallocAsyncAllocator.cpp):
//
//   - NewAsync sets the pool's release threshold to the maximum, so that
//     the pool keeps what it reserves across synchronizations;
//   - Free of a block used only on its stream frees it on that stream. A
//     block recorded on other streams (RecordStream) is freed on a stream
//     of the allocator's own, made to wait (device.StreamWaiter's
//     WaitStream) for the block's stream and each recorded stream, so
//     that the pool reuses it only after all of them ran (PyTorch's
//     "unifying free stream"). On a device without StreamWaiter, Free
//     synchronizes the recorded streams and frees on the block's stream
//     instead;
//   - EmptyCache synchronizes the device and trims the pool to 0;
//   - a cap (Config.MemoryFraction of the device's memory, and
//     Config.MemoryLimit) bounds the sum of the sizes allocated and not
//     freed, as PyTorch's set_per_process_memory_fraction does for this
//     backend; the other keys of Config are checked and change nothing;
//   - Stats fills what PyTorch's backend fills, from the pool's figures:
//     allocated_bytes.all and active_bytes.all (current and peak) are the
//     pool's used bytes, reserved_bytes.all (current and peak) its reserved
//     bytes. Every other key reads 0, as in PyTorch: the per-pool
//     (small_pool, large_pool) figures, the allocated and freed sums of
//     every stat, the counts (allocation, segment, active,
//     inactive_split), inactive_split_bytes, requested_bytes, the oversize
//     stats, num_alloc_retries, num_ooms, num_sync_all_streams,
//     num_device_alloc, num_device_free and max_split_size.
//     ResetPeakStats resets the pool's peaks; accumulated stats have
//     nothing to reset.
//
// The figures are the pool's, which every user of the device's pool
// shares (two Asyncs on one device report the same). Async is safe for
// concurrent use.
type Async struct {
	dev     device.Device
	pool    device.StreamOrderedMemory
	waiter  device.StreamWaiter // nil: Free synchronizes recorded streams
	unifier device.Stream       // the stream blocks used on several streams are freed on
	ordinal int
	limit   uint64 // cap on used bytes; 0 none

	mu   sync.Mutex // guards everything below
	live map[device.Ptr]*asyncBlock
	used uint64 // sum of the live blocks' sizes (PyTorch's pytorch_used_bytes)
	last device.PoolUsage
}

type asyncBlock struct {
	size   uint64
	stream device.Stream
	uses   []device.Stream // other streams it was recorded on
}

// NewAsync returns the allocator of backend:cudaMallocAsync for dev, which
// must offer device.StreamOrderedMemory. cfg's keys are checked as
// ParseConf checks them; its Backend is not read (New refuses
// BackendCudaMallocAsync and points here).
func NewAsync(dev device.Device, cfg Config) (*Async, error) {
	if dev == nil {
		return nil, errors.New("allocator: nil device")
	}
	if err := cfg.validateKeys(); err != nil {
		return nil, err
	}
	pool, ok := dev.(device.StreamOrderedMemory)
	if !ok {
		return nil, fmt.Errorf("allocator: backend:cudaMallocAsync needs a device with a stream-ordered memory pool (device.StreamOrderedMemory); device %d (%s) has none: %w",
			dev.Ordinal(), dev.Name(), device.ErrNotSupported)
	}
	if err := pool.SetReleaseThreshold(math.MaxUint64); err != nil {
		return nil, fmt.Errorf("allocator: backend:cudaMallocAsync: setting the release threshold of device %d's pool: %w", dev.Ordinal(), err)
	}
	a := &Async{dev: dev, pool: pool, ordinal: dev.Ordinal(), live: make(map[device.Ptr]*asyncBlock), limit: cfg.MemoryLimit}
	if cfg.MemoryFraction != 0 {
		_, total, err := dev.MemInfo()
		if err != nil {
			return nil, fmt.Errorf("allocator: backend:cudaMallocAsync: reading device %d's memory for the memory fraction: %w", a.ordinal, err)
		}
		byFraction := uint64(cfg.MemoryFraction * float64(total))
		if a.limit == 0 || byFraction < a.limit {
			a.limit = byFraction
		}
	}
	if w, ok := dev.(device.StreamWaiter); ok {
		s, err := dev.NewStream()
		if err != nil {
			return nil, fmt.Errorf("allocator: backend:cudaMallocAsync: making the free stream of device %d: %w", a.ordinal, err)
		}
		a.waiter, a.unifier = w, s
	}
	return a, nil
}

// Alloc allocates size bytes on stream s from the device's pool. Size 0
// returns the zero Ptr, as PyTorch does. When the device is out of memory,
// or the allocation would pass the cap, the error is an *OutOfMemoryError
// (it matches device.ErrOutOfMemory).
func (a *Async) Alloc(size uint64, s device.Stream) (device.Ptr, error) {
	if size == 0 {
		return 0, nil
	}
	if size >= maxRequestSize {
		return 0, fmt.Errorf("allocator: cannot allocate %d bytes (more than 1 EiB): %w (%w)", size, device.ErrInvalidSize, device.ErrOutOfMemory)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.limit != 0 && a.used+size > a.limit {
		return 0, a.oomLocked(size, s, fmt.Errorf("backend:cudaMallocAsync: %d bytes allocated and %d requested would pass the cap of %d: %w",
			a.used, size, a.limit, device.ErrOutOfMemory))
	}
	p, err := a.pool.MallocAsync(size, s)
	if err != nil {
		if errors.Is(err, device.ErrOutOfMemory) {
			return 0, a.oomLocked(size, s, err)
		}
		return 0, fmt.Errorf("allocator: backend:cudaMallocAsync: alloc of %d bytes on stream %d: %w", size, s, err)
	}
	a.live[p] = &asyncBlock{size: size, stream: s}
	a.used += size
	return p, nil
}

// oomLocked builds the out-of-memory error of a request of size bytes.
func (a *Async) oomLocked(size uint64, s device.Stream, err error) error {
	e := &OutOfMemoryError{Device: a.ordinal, Stream: s, Requested: size, AllocSize: size, Allowed: a.limit,
		Allocated: a.used, Err: err}
	if u, uerr := a.pool.PoolUsage(); uerr == nil {
		e.Reserved = u.Reserved
		if u.Reserved > u.Used {
			e.ReservedUnallocated = u.Reserved - u.Used
		}
	}
	capped := false
	if free, total, merr := a.dev.MemInfo(); merr == nil {
		e.DeviceFree, e.DeviceTotal = free, total
		if held := total - free; held > e.Reserved {
			e.HeldElsewhere = held - e.Reserved
		}
		capped = a.limit != 0 && a.used+size > a.limit && free >= size
	}
	e.Hint = hintAsync
	if capped {
		e.Hint = hintCap + hintAsync
	}
	return e
}

// Free returns the block at p to the pool (see Async for the stream it is
// freed on). The zero Ptr is a no-op. An address this allocator did not
// hand out, or one freed already, fails with device.ErrInvalidPointer. A
// failed Free leaves the block allocated.
func (a *Async) Free(p device.Ptr) error {
	if p == 0 {
		return nil
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	b, ok := a.live[p]
	if !ok {
		return fmt.Errorf("allocator: free %v on device %d: not allocated by this allocator: %w", p, a.ordinal, device.ErrInvalidPointer)
	}
	on := b.stream
	if len(b.uses) > 0 {
		var err error
		if on, err = a.joinLocked(b); err != nil {
			return fmt.Errorf("allocator: free %v: %w", p, err)
		}
	}
	if err := a.pool.FreeAsync(p, on); err != nil {
		return fmt.Errorf("allocator: free %v: %w", p, err)
	}
	delete(a.live, p)
	a.used -= b.size
	return nil
}

// joinLocked orders the free of a block used on several streams after the
// work of each, and returns the stream to free it on: the free stream,
// made to wait for each (WaitStream), or, without StreamWaiter, the
// block's own stream once the others are synchronized.
func (a *Async) joinLocked(b *asyncBlock) (device.Stream, error) {
	if a.waiter == nil {
		for _, s := range b.uses {
			if err := a.dev.SynchronizeStream(s); err != nil {
				return 0, fmt.Errorf("synchronizing stream %d: %w", s, err)
			}
		}
		return b.stream, nil
	}
	for _, s := range append([]device.Stream{b.stream}, b.uses...) {
		if err := a.waiter.WaitStream(a.unifier, s); err != nil {
			return 0, fmt.Errorf("making the free stream wait for stream %d: %w", s, err)
		}
	}
	return a.unifier, nil
}

// RecordStream notes that the block at ptr is used on stream s too; its
// Free then waits for s's work. Recording the block's own stream, or a
// stream twice, changes nothing.
func (a *Async) RecordStream(ptr device.Ptr, s device.Stream) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	b, ok := a.live[ptr]
	if !ok {
		return fmt.Errorf("allocator: record stream for %v on device %d: not allocated by this allocator: %w", ptr, a.ordinal, device.ErrInvalidPointer)
	}
	if s == b.stream {
		return nil
	}
	for _, u := range b.uses {
		if u == s {
			return nil
		}
	}
	if c, ok := a.dev.(device.StreamChecker); ok && !c.HasStream(s) {
		return fmt.Errorf("allocator: record stream for %v: stream %d is not a stream of device %d: %w", ptr, s, a.ordinal, device.ErrInvalidStream)
	}
	b.uses = append(b.uses, s)
	return nil
}

// EmptyCache synchronizes the device and returns every byte of the pool
// that no block uses to the device (TrimPool(0)), as PyTorch's backend
// does.
func (a *Async) EmptyCache() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if err := a.dev.Synchronize(); err != nil {
		return fmt.Errorf("allocator: empty cache: %w", err)
	}
	if err := a.pool.TrimPool(0); err != nil {
		return fmt.Errorf("allocator: empty cache: %w", err)
	}
	return nil
}

// Stats returns the statistics PyTorch's backend reports (see Async),
// read from the pool now; if the pool cannot be read, the figures of the
// last successful read.
func (a *Async) Stats() stats.DeviceStats {
	a.mu.Lock()
	defer a.mu.Unlock()
	if u, err := a.pool.PoolUsage(); err == nil {
		a.last = u
	}
	var st stats.DeviceStats
	used, usedPeak := clampInt64(a.last.Used), clampInt64(a.last.UsedPeak)
	st.AllocatedBytes[stats.All] = stats.Stat{Current: used, Peak: usedPeak}
	st.ActiveBytes[stats.All] = stats.Stat{Current: used, Peak: usedPeak}
	st.ReservedBytes[stats.All] = stats.Stat{Current: clampInt64(a.last.Reserved), Peak: clampInt64(a.last.ReservedPeak)}
	return st
}

// ResetPeakStats sets the pool's peaks to their current values.
func (a *Async) ResetPeakStats() error {
	if err := a.pool.ResetPoolPeaks(); err != nil {
		return fmt.Errorf("allocator: reset peak stats: %w", err)
	}
	return nil
}

// Summary returns PyTorch's memory_summary table of Stats: the rows
// PyTorch's backend does not fill read 0.
func (a *Async) Summary(abbreviated bool) string {
	st := a.Stats()
	return stats.Summary(&st, stats.SummaryOptions{Device: a.ordinal, Name: a.dev.Name(), Abbreviated: abbreviated})
}

// Allocated returns the bytes allocated through this allocator and not
// freed (the sizes asked for), which the cap bounds.
func (a *Async) Allocated() uint64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.used
}

func clampInt64(v uint64) int64 {
	if v > math.MaxInt64 {
		return math.MaxInt64
	}
	return int64(v)
}
