// This file holds the hash of the open-addressing tables: PtrTable
// (address to allocated block) and largeBuckets' table of size classes.

package freeindex

import "math/bits"

// fibHash returns the slot of key x in a table of 1<<(64-shift) slots:
// Fibonacci hashing, a multiplication by 2^64 divided by the golden ratio
// whose top bits are the slot, which spreads keys that differ in their low
// bits (consecutive chunks, size classes, addresses) over the table.
func fibHash(x uint64, shift uint8) uint64 { return (x * 0x9E3779B97F4A7C15) >> shift }

// tableShift returns fibHash's shift for a table of size slots, a power of
// two.
func tableShift(size int) uint8 { return uint8(64 - bits.Len64(uint64(size-1))) }
