// This file holds Passthrough, the baseline that caches nothing.

package allocator

import (
	"errors"
	"fmt"
	"sync"

	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/stats"
)

// Passthrough is the baseline that replays compare the caching allocator
// with: every Alloc is a device malloc of the rounded size and every Free a
// device free, as PyTorch does with PYTORCH_NO_CUDA_MEMORY_CACHING=1. It
// keeps the same statistics as Allocator (each allocation is its own
// segment, so reserved equals allocated) and is safe for concurrent use.
//
// A block recorded on other streams (RecordStream) is freed only after
// synchronizing those streams: without a cache there is nothing to defer
// to.
type Passthrough struct {
	dev     device.Device
	ordinal int

	mu   sync.Mutex // guards everything below
	live map[device.Ptr]*ptBlock
	st   stats.DeviceStats
}

type ptBlock struct {
	size, requested uint64
	stream          device.Stream
	uses            []device.Stream
	pool            stats.Pool
}

// NewPassthrough returns the baseline allocator for dev.
func NewPassthrough(dev device.Device) (*Passthrough, error) {
	if dev == nil {
		return nil, errors.New("allocator: nil device")
	}
	return &Passthrough{dev: dev, ordinal: dev.Ordinal(), live: make(map[device.Ptr]*ptBlock),
		st: stats.DeviceStats{MaxSplitSize: -1}}, nil
}

// Alloc allocates size bytes (rounded as Allocator rounds them) straight
// from the device. Size 0 returns the zero Ptr.
func (p *Passthrough) Alloc(size uint64, s device.Stream) (device.Ptr, error) {
	if size == 0 {
		return 0, nil
	}
	if size >= maxRequestSize {
		return 0, fmt.Errorf("allocator: cannot allocate %d bytes (more than 1 EiB): %w (%w)", size, device.ErrInvalidSize, device.ErrOutOfMemory)
	}
	rounded := roundSize(size, nil)
	pool := stats.LargePool
	if isSmall(rounded) {
		pool = stats.SmallPool
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	ptr, err := p.dev.Malloc(rounded)
	if err != nil {
		if errors.Is(err, device.ErrOutOfMemory) {
			p.st.NumOOMs++
			free, total, _ := p.dev.MemInfo()
			allocated := uint64(p.st.AllocatedBytes[stats.All].Current)
			return 0, &OutOfMemoryError{Device: p.ordinal, Stream: s, Requested: size, AllocSize: rounded,
				DeviceTotal: total, DeviceFree: free, Allocated: allocated, Reserved: allocated, Err: err, Hint: hintUncached}
		}
		return 0, err
	}
	p.live[ptr] = &ptBlock{size: rounded, requested: size, stream: s, pool: pool}
	n := int64(rounded)
	p.st.NumDeviceAlloc++
	p.st.Segment.Increase(pool, 1)
	p.st.ReservedBytes.Increase(pool, n)
	p.st.Allocation.Increase(pool, 1)
	p.st.AllocatedBytes.Increase(pool, n)
	p.st.Active.Increase(pool, 1)
	p.st.ActiveBytes.Increase(pool, n)
	p.st.RequestedBytes.Increase(pool, int64(size))
	return ptr, nil
}

// Free returns the block to the device, first synchronizing any other
// streams it was recorded on.
func (p *Passthrough) Free(ptr device.Ptr) error {
	if ptr == 0 {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	b, ok := p.live[ptr]
	if !ok {
		return fmt.Errorf("allocator: free %v on device %d: not allocated by this allocator: %w", ptr, p.ordinal, device.ErrInvalidPointer)
	}
	for _, s := range b.uses {
		if err := p.dev.SynchronizeStream(s); err != nil {
			return fmt.Errorf("allocator: free %v: synchronizing stream %d: %w", ptr, s, err)
		}
	}
	if err := p.dev.Free(ptr); err != nil {
		return fmt.Errorf("allocator: free %v: %w", ptr, err)
	}
	delete(p.live, ptr)
	n := int64(b.size)
	p.st.NumDeviceFree++
	p.st.Segment.Decrease(b.pool, 1)
	p.st.ReservedBytes.Decrease(b.pool, n)
	p.st.Allocation.Decrease(b.pool, 1)
	p.st.AllocatedBytes.Decrease(b.pool, n)
	p.st.Active.Decrease(b.pool, 1)
	p.st.ActiveBytes.Decrease(b.pool, n)
	p.st.RequestedBytes.Decrease(b.pool, int64(b.requested))
	return nil
}

// RecordStream notes that the block at ptr is used on stream s too.
func (p *Passthrough) RecordStream(ptr device.Ptr, s device.Stream) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	b, ok := p.live[ptr]
	if !ok {
		return fmt.Errorf("allocator: record stream for %v on device %d: not allocated by this allocator: %w", ptr, p.ordinal, device.ErrInvalidPointer)
	}
	if s != b.stream {
		b.uses = append(b.uses, s)
	}
	return nil
}

// EmptyCache does nothing: there is no cache.
func (p *Passthrough) EmptyCache() error { return nil }

// Stats returns a copy of the statistics.
func (p *Passthrough) Stats() stats.DeviceStats {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.st
}
