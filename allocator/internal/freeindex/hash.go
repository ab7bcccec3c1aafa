// This file holds the hash of the open-addressing tables: PtrTable
// (address to allocated block), largeBuckets' table of size classes and
// routeTab (address chunk to shard).

package freeindex

import "math/bits"

// FibHash returns the slot of key x in a table of 1<<(64-shift) slots:
// Fibonacci hashing, a multiplication by 2^64 divided by the golden ratio
// whose top bits are the slot, which spreads keys that differ in their low
// bits (consecutive chunks, size classes, addresses) over the table.
func FibHash(x uint64, shift uint8) uint64 { return (x * 0x9E3779B97F4A7C15) >> shift }

// TableShift returns FibHash's shift for a table of size slots, a power of
// two.
func TableShift(size int) uint8 { return uint8(64 - bits.Len64(uint64(size-1))) }
