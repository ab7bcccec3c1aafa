// This file holds the sizes: PyTorch's constants, the rounding of
// requests (round) and the pool a rounded size goes to (indexFor), the
// size of the segment a request gets from the device, and
// the rules for splitting a block and for oversize blocks.

package allocator

import (
	"math"
	"math/bits"

	"github.com/gpumem/gpumem/allocator/internal/freeindex"
)

const (
	kMinBlockSize  = freeindex.MinBlockSize // every block is a multiple of this
	kSmallSize     = 1 << 20                // largest request served by the small pool
	kSmallBuffer   = freeindex.SmallBuffer  // segment size of the small pool
	kMinLargeAlloc = 10 << 20               // requests below this share a large segment
	kRoundLarge    = 2 << 20                // larger requests are rounded up to this for the device
	kLargeBuffer   = 20 << 20               // the default large segment size: segments for 1-10 MiB requests
	maxRequestSize = 1 << 60                // larger requests are refused outright (PyTorch's 1 EB guard)
	mib            = 1 << 20                // one MiB
	maxSplitNone   = math.MaxUint64
)

// roundSize rounds a request up to the size of the block that serves it:
// at least 512 bytes and a multiple of 512, or up to the next power-of-two
// division when divisions (the RoundupPower2Divisions setting; nil when no
// entry is set) says so for the size's interval.
func roundSize(size uint64, divisions *[NumRoundupIntervals]uint64) uint64 {
	if size < kMinBlockSize {
		return kMinBlockSize
	}
	if divisions != nil {
		d := divisions[roundupIndex(size)]
		if d > 1 && size > kMinBlockSize*d {
			return roundupPower2NextDivision(size, d)
		}
	}
	return (size + kMinBlockSize - 1) / kMinBlockSize * kMinBlockSize
}

// isSmall reports whether a block of the given rounded size belongs to the
// small pool.
func isSmall(rounded uint64) bool { return rounded <= kSmallSize }

// segmentSize is the size of the segment that a request of the given
// rounded size gets from the device: 2 MiB for the small pool, the large
// segment size (20 MiB by default) for requests below 10 MiB, otherwise
// the request rounded up to 2 MiB.
func (r *splitRule) segmentSize(rounded uint64) uint64 {
	switch {
	case isSmall(rounded):
		return kSmallBuffer
	case rounded < kMinLargeAlloc:
		return r.large
	default:
		return (rounded + kRoundLarge - 1) / kRoundLarge * kRoundLarge
	}
}

// roundupIndex returns the RoundupPower2Divisions entry that governs size:
// max(0, floor(log2(size)) - 20), at most NumRoundupIntervals-1.
func roundupIndex(size uint64) int {
	i := bits.Len64(size) - 1 - 20
	if i < 0 {
		return 0
	}
	return min(i, NumRoundupIntervals-1)
}

// roundupPower2NextDivision rounds size up to the next of d equal steps
// between the powers of two around it; a power of two stays as it is. For
// example 1200 with d = 4 lies between 1024 and 2048, whose steps are 1024,
// 1280, 1536 and 1792, so it becomes 1280.
func roundupPower2NextDivision(size, d uint64) uint64 {
	if size&(size-1) == 0 {
		return size
	}
	floor := uint64(1) << (bits.Len64(size) - 1)
	step := floor >> (bits.Len64(d) - 1)
	if step == 0 {
		return floor << 1
	}
	rounded := size &^ (step - 1)
	if rounded == size {
		return size
	}
	return rounded + step
}

// splitRule decides whether serving a request from a larger block leaves a
// remainder worth keeping as a free block. Its fields are read-only after
// New.
type splitRule struct {
	maxSplit            uint64 // max_split_size in bytes, or maxSplitNone
	maxNonSplitRounding uint64 // waste allowed when an oversize block serves an oversize request
	expandable          bool   // expandable_segments is on (PyTorch 2.6 tests the global setting)
	large               uint64 // the large segment size (Config.LargeSegmentSize, or 20 MiB)

	// anyServes lets a free block of any size serve any request: the
	// low_fragmentation and planned policies with expandable segments,
	// whose free pages merge into ranges that max_split_size would keep
	// every smaller request out of (PyTorch 2.6 does so, and maps more
	// while they stay free), and which split a range at any size. There
	// max_split_size still counts oversize blocks in the stats and lets
	// the out-of-memory path release cached oversize blocks first.
	anyServes bool
}

// shouldSplit reports whether serving size bytes from a block of
// blockSize bytes of the given pool keeps the rest as a free block: in the
// small pool (or with expandable segments) when the rest is at least 512
// bytes; in the large pool when the request is not oversize and the rest is
// more than 1 MiB.
func (r *splitRule) shouldSplit(small bool, blockSize, size uint64) bool {
	rest := blockSize - size
	if small || r.expandable {
		return rest >= kMinBlockSize
	}
	return size < r.maxSplit && rest > kSmallSize
}

// mayServe reports whether a free block of blockSize bytes may serve a
// request of size bytes under max_split_size: an oversize block (at least
// max_split_size) never serves a smaller request, and serves an oversize
// request only if it is less than max_non_split_rounding bytes larger;
// with anyServes, every block serves.
func (r *splitRule) mayServe(blockSize, size uint64) bool {
	// anyServes is read last: without max_split_size (the default) the
	// first comparison decides, as it did before the policies had it.
	if size < r.maxSplit {
		return blockSize < r.maxSplit || r.anyServes
	}
	return blockSize < size+r.maxNonSplitRounding || r.anyServes
}

// servesBelow returns the size below which a free block may serve a
// request of size (rounded) bytes: mayServe(b, size) is b < servesBelow(size).
func (r *splitRule) servesBelow(size uint64) uint64 {
	if r.anyServes {
		return maxSplitNone
	}
	if size < r.maxSplit {
		return r.maxSplit
	}
	return size + r.maxNonSplitRounding
}

// oversize reports whether a block or segment of n bytes counts as
// oversize in the stats.
func (r *splitRule) oversize(n uint64) bool { return n >= r.maxSplit }

// round is step 2 of the allocation ladder: the size of the block for a
// request of size bytes (at least 1).
func (a *Allocator) round(size uint64) uint64 {
	if a.divisions == nil {
		return (size + kMinBlockSize - 1) &^ (kMinBlockSize - 1) // roundSize without divisions
	}
	return roundSize(size, a.divisions)
}

// indexFor is step 3: the free index, among a stream's xs, of the pool of
// a block of rounded bytes (the large pool's for every size under the
// planned policy, which merges the small one into it).
func indexFor(xs *[2]freeindex.Index, rounded uint64) *freeindex.Index {
	if isSmall(rounded) && !xs[qSmall].Merged {
		return &xs[qSmall]
	}
	return &xs[qLarge]
}
