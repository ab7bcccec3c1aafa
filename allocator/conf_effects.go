// This file holds what the configuration keys added after PyTorch 2.6 do
// in the allocator, each acting only when set, so that the zero Config
// keeps PyTorch 2.6's decisions:
//
//   - large_segment_size_mb (Config.LargeSegmentSize) is the splitRule's
//     large segment size (sizes.go), the large pool's expandable page
//     (expandable.go) and the default of max_non_split_rounding_mb;
//   - expandable_segments_reserve (Config.ExpandableSegmentsReserve) sizes
//     the address range of a new expandable segment (expandableReserve);
//   - throw_on_cudamalloc_oom (Config.EarlyOOM) refuses a cache miss that
//     cannot fit before the device is asked (refusesEarlyLocked).

package allocator

import (
	"fmt"

	"github.com/gpumem/gpumem/device"
)

// errReserveTooSmall is the refusal of a request larger than the address
// range of a new expandable segment (ExpandableSegmentsReserve): no
// segment can hold it, which PyTorch reports as out of memory.
var errReserveTooSmall = fmt.Errorf("allocator: the request is larger than an expandable segment's reserved range (expandable_segments_reserve): %w", device.ErrOutOfMemory)

// expandableReserve returns the size of the address range of a new
// expandable segment with pages of page bytes: 9/8 of the device's memory
// as PyTorch 2.6 reserves it, or ExpandableSegmentsReserve when set (at
// most 9/8 of the device's memory, as current PyTorch caps it), rounded up
// to whole pages and at least one page.
func (a *Allocator) expandableReserve(page uint64) uint64 {
	full := a.total + a.total/8
	n := full
	if r := a.cfg.ExpandableSegmentsReserve; r != (Reserve{}) {
		n = max(min(r.bytes(a.total), full), 1)
	}
	return (n + page - 1) / page * page
}

// refusesEarlyLocked reports whether EarlyOOM refuses a cache miss that
// needs segSize more bytes from the device: reserved bytes would pass the
// cap (MemoryFraction or MemoryLimit), or the device's total memory when
// there is no cap. It counts segSize as the cap does (growLocked).
func (a *Allocator) refusesEarlyLocked(segSize uint64) bool {
	if !a.cfg.EarlyOOM {
		return false
	}
	limit := a.allowed
	if limit == 0 {
		limit = a.total
	}
	return a.reservedLocked()+segSize > limit
}
