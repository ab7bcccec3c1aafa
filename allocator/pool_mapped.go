// This file holds the mapped segments of named pools: without expandable
// segments, a named pool's segment is still one range of the size PyTorch
// would allocate, but on a device with virtual memory it is reserved and
// mapped (VirtualMemory.Reserve, then Map of the whole range) rather than
// allocated (Malloc), so that PausePool can unmap its pages and keep its
// address. Everything else about it is a plain segment's: its size, its
// splits, its one device call per allocation and per free in the counts.
// The default pool's segments are untouched, so the faithful decisions
// and figures are those of PyTorch.

package allocator

import (
	"errors"
	"fmt"

	"github.com/gpumem/gpumem/allocator/internal/freeindex"
	"github.com/gpumem/gpumem/device"
)

// pagingVM returns dev's virtual memory when it can page every segment
// (its granularity divides 2 MiB, of which every segment size is a
// multiple), else nil. Named pools' plain segments use it, and so does
// the low_fragmentation policy, which works on plain segments without it.
func pagingVM(dev device.Device) device.VirtualMemory {
	vm, ok := dev.(device.VirtualMemory)
	if !ok {
		return nil
	}
	if g := vm.Granularity(); g == 0 || kSmallBuffer%g != 0 {
		return nil
	}
	return vm
}

// segmentMemoryLocked obtains the memory of a new plain segment of size
// bytes for the free index x: reserved and mapped (mapped is true) for a
// named pool's segment on a device that pages, else allocated. A refusal
// for lack of memory wraps device.ErrOutOfMemory. On an error the device
// holds nothing of it (a reservation the device would not release is
// released by EmptyCache).
func (a *Allocator) segmentMemoryLocked(x *freeindex.Index, size uint64) (ptr device.Ptr, mapped bool, err error) {
	if a.pvm == nil || a.shardOf(x).pool == nil || size%a.pvm.Granularity() != 0 {
		ptr, err = a.dev.Malloc(size)
		return ptr, false, err
	}
	if ptr, err = a.pvm.Reserve(size); err != nil {
		return 0, false, err
	}
	if err = a.pvm.Map(ptr, size); err != nil {
		if rerr := a.pvm.Release(ptr); rerr != nil {
			a.strayRes = append(a.strayRes, ptr)
		}
		return 0, false, err
	}
	if a.mappedSegs == nil {
		a.mappedSegs = make(map[*freeindex.Segment]bool)
	}
	return ptr, true, nil
}

// unmapSegmentLocked returns the mapped segment seg to the device: it
// finishes the segment's stream (unmapping does not wait for the device,
// as cudaFree does), unmaps its pages and releases its address range. On
// an error before the pages are unmapped nothing changes; a release the
// device refuses after that leaves the range to EmptyCache (the segment
// is gone either way).
func (a *Allocator) unmapSegmentLocked(seg *freeindex.Segment) error {
	if err := a.dev.SynchronizeStream(seg.Stream()); err != nil {
		return fmt.Errorf("allocator: device %d: synchronizing stream %d before unmapping segment %v: %w", a.ordinal, seg.Stream(), seg.Ptr(), err)
	}
	if err := a.pvm.Unmap(seg.Ptr(), seg.Size()); err != nil {
		return fmt.Errorf("allocator: device %d: unmapping segment %v: %w", a.ordinal, seg.Ptr(), err)
	}
	if err := a.pvm.Release(seg.Ptr()); err != nil {
		a.strayRes = append(a.strayRes, seg.Ptr())
	}
	delete(a.mappedSegs, seg)
	return nil
}

// releaseStrayLocked releases the address ranges a failed Release left;
// those the device still refuses stay for the next call.
func (a *Allocator) releaseStrayLocked() error {
	var errs []error
	left := a.strayRes[:0]
	for _, p := range a.strayRes {
		if err := a.pvm.Release(p); err != nil {
			left = append(left, p)
			errs = append(errs, fmt.Errorf("allocator: device %d: releasing the address range %v of a freed segment: %w", a.ordinal, p, err))
		}
	}
	clear(a.strayRes[len(left):])
	a.strayRes = left
	return errors.Join(errs...)
}

// pageable reports whether the pages of segment seg can be unmapped and
// mapped again at the same addresses: an expandable segment, or a named
// pool's mapped one.
func (a *Allocator) pageable(seg *freeindex.Segment) bool {
	return seg.Expandable() || a.mappedSegs[seg]
}
