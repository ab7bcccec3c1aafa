// This file holds Block, Plan, Lifetimes and Bound: a trace's blocks with
// their lifetimes, and the peak of their rounded live bytes.

package offline

import (
	"fmt"
	"math"
	"slices"

	"github.com/gpumem/gpumem/trace"
)

// Granule is the rounding of block sizes: 512 bytes, as the caching
// allocator rounds every request (a size of 0 stays 0).
const Granule = 512

// RoundSize returns size rounded up to a multiple of Granule, and false if
// that overflows a uint64.
func RoundSize(size uint64) (uint64, bool) {
	if size > math.MaxUint64-(Granule-1) {
		return 0, false
	}
	return (size + Granule - 1) / Granule * Granule, true
}

// Block is one allocation of a trace and the memory a plan gives it.
type Block struct {
	// ID is the block's ID in the trace.
	ID uint64
	// Stream is the stream it is allocated on.
	Stream uint64
	// Size is the bytes requested; Bytes is Size rounded up to a multiple
	// of Granule, the memory it occupies.
	Size, Bytes uint64
	// Start is the index in the ops of its a line; End is the index of
	// the op from which its memory is free again (its f line, or the
	// synchronization that ends work on other streams), or len(ops) if it
	// is never freed. It is in use during [Start, End).
	Start, End int
	// Offset is its address in a plan, from 0; Pack sets it.
	Offset uint64
}

// overlapsTime reports whether a and b are in use at the same time.
func overlapsTime(a, b *Block) bool {
	return a.Start < b.End && b.Start < a.End
}

// overlapsAddress reports whether a and b share a byte of memory.
func overlapsAddress(a, b *Block) bool {
	return a.Bytes > 0 && b.Bytes > 0 && a.Offset < b.Offset+b.Bytes && b.Offset < a.Offset+a.Bytes
}

// Lifetimes returns the trace's blocks in the order of their a lines, with
// Start, End and the rounded size set (Offset is 0). See the package
// documentation for the rules. A trace that breaks the format's rules, or
// whose rounded sizes sum past 2^64 - 1 bytes, is an error.
func Lifetimes(ops []trace.Op) ([]Block, error) {
	if len(ops) >= math.MaxInt32 {
		return nil, fmt.Errorf("offline: %d ops: at most %d", len(ops), math.MaxInt32-1)
	}
	var blocks []Block
	live := map[uint64]int32{}      // ID -> index in blocks
	used := map[int32][]uint64{}    // live block -> other streams it was recorded on
	waiting := map[uint64][]int32{} // stream -> freed blocks waiting for its sync
	pending := map[int32]int{}      // freed block -> streams it still waits for
	var total uint64
	for i := range ops {
		op := &ops[i]
		switch op.Kind {
		case trace.Alloc:
			if _, ok := live[op.ID]; ok {
				return nil, opError(i, op, "block %d is already live", op.ID)
			}
			n, ok := RoundSize(op.Size)
			if !ok || total+n < total {
				return nil, opError(i, op, "the trace's sizes sum past 2^64 - 1 bytes")
			}
			total += n
			live[op.ID] = int32(len(blocks))
			blocks = append(blocks, Block{ID: op.ID, Stream: op.Stream, Size: op.Size, Bytes: n, Start: i, End: len(ops)})
		case trace.Free:
			b, ok := live[op.ID]
			if !ok {
				return nil, opError(i, op, "block %d is not live", op.ID)
			}
			delete(live, op.ID)
			streams := used[b]
			if len(streams) == 0 {
				blocks[b].End = i
				continue
			}
			delete(used, b)
			pending[b] = len(streams)
			for _, s := range streams {
				waiting[s] = append(waiting[s], b)
			}
		case trace.RecordStream:
			b, ok := live[op.ID]
			if !ok {
				return nil, opError(i, op, "block %d is not live", op.ID)
			}
			if op.Stream != 0 && op.Stream != blocks[b].Stream && !slices.Contains(used[b], op.Stream) {
				used[b] = append(used[b], op.Stream)
			}
		case trace.SyncStream:
			for _, b := range waiting[op.Stream] {
				if pending[b]--; pending[b] == 0 {
					delete(pending, b)
					blocks[b].End = i
				}
			}
			delete(waiting, op.Stream)
		case trace.SyncDevice:
			for b := range pending {
				blocks[b].End = i
			}
			clear(pending)
			clear(waiting)
		}
	}
	return blocks, nil
}

func opError(i int, op *trace.Op, format string, args ...any) error {
	return fmt.Errorf("offline: op %d (%s): %s", i+1, op, fmt.Sprintf(format, args...))
}

// Bound returns the peak of the rounded bytes of the blocks in use at
// once, and the index of the op at which it is first reached (0 when no
// block takes memory). Blocks ending at an op are released before blocks
// starting there are counted. The blocks' rounded sizes must sum to at
// most 2^64 - 1, as Lifetimes ensures.
func Bound(blocks []Block) (peak uint64, at int) {
	type event struct {
		t     int
		bytes uint64
		start bool
	}
	ev := make([]event, 0, 2*len(blocks))
	for i := range blocks {
		b := &blocks[i]
		if b.Bytes == 0 {
			continue
		}
		ev = append(ev, event{b.Start, b.Bytes, true}, event{b.End, b.Bytes, false})
	}
	slices.SortFunc(ev, func(x, y event) int {
		if x.t != y.t {
			return x.t - y.t
		}
		switch {
		case x.start == y.start:
			return 0
		case !x.start:
			return -1
		}
		return 1
	})
	var cur uint64
	for _, e := range ev {
		if !e.start {
			cur -= e.bytes
			continue
		}
		cur += e.bytes
		if cur > peak {
			peak, at = cur, e.t
		}
	}
	return peak, at
}
