// This file holds Pack: greedy offset assignment by size over an index of
// time buckets (internal/pack).

package offline

import (
	"context"
	"fmt"

	"github.com/gpumem/gpumem/internal/pack"
	"github.com/gpumem/gpumem/trace"
)

// Plan is a trace's packing and its bound.
type Plan struct {
	// Blocks are the trace's blocks in the order of their a lines, each
	// with its offset.
	Blocks []Block
	// Ops is the number of ops in the trace.
	Ops int
	// Bound is the lower bound: the peak of rounded live bytes, reached
	// first at op BoundAt (an index in the ops).
	Bound   uint64
	BoundAt int
	// Footprint is the packing's memory: the highest end of a block.
	Footprint uint64
	// Order names the order of the greedy pass that gave the packing
	// ("size", ...; see internal/pack's Orders).
	Order string
}

// Pack computes the lifetimes of the trace's blocks, their bound, and a
// packing (see the package documentation). Its errors are Lifetimes'.
func Pack(ops []trace.Op) (*Plan, error) {
	return PackContext(context.Background(), ops)
}

// PackContext is Pack, stopped when ctx is done: the packing checks ctx
// every 1024 blocks placed, and then returns an error that wraps
// ctx.Err().
func PackContext(ctx context.Context, ops []trace.Op) (*Plan, error) {
	stopped := func() error {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("offline packing stopped: %w", err)
		}
		return nil
	}
	if err := stopped(); err != nil {
		return nil, err
	}
	blocks, err := Lifetimes(ops)
	if err != nil {
		return nil, err
	}
	if err := stopped(); err != nil {
		return nil, err
	}
	p := &Plan{Blocks: blocks, Ops: len(ops)}
	p.Bound, p.BoundAt = Bound(blocks)
	p.Footprint, p.Order = packBlocks(ctx, blocks, len(ops), p.Bound)
	if err := stopped(); err != nil {
		return nil, err
	}
	return p, nil
}

// packBlocks sets the Offset of every block, whose Start, End and Bytes
// are set with 0 <= Start < End <= ops, and returns the footprint and the
// name of the order that gave it (internal/pack's Best, its passes in
// parallel). The blocks' Bytes must sum to at most 2^64 - 1, so that no
// offset overflows. A done ctx stops every pass early; the caller then
// discards the result.
func packBlocks(ctx context.Context, blocks []Block, ops int, bound uint64) (uint64, string) {
	if len(blocks) == 0 {
		return 0, pack.Orders[0].Name
	}
	items := make([]pack.Item, len(blocks))
	for i := range blocks {
		b := &blocks[i]
		items[i] = pack.Item{Start: b.Start, End: b.End, Bytes: b.Bytes}
	}
	offsets, footprint, order := pack.Best(ctx, items, ops, bound, true)
	if ctx.Err() != nil {
		return 0, pack.Orders[0].Name // stopped: a pass may have placed nothing; the caller discards this
	}
	for i := range blocks {
		blocks[i].Offset = offsets[i]
	}
	return footprint, pack.Orders[order].Name
}
