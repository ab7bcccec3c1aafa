// This file holds the rounding of request sizes.

package allocator

import "math/bits"

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
