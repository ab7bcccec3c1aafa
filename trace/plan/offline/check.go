// This file holds Check: the proof that no two blocks in use at the same
// time share memory.

package offline

import (
	"cmp"
	"fmt"
	"math"
	"slices"

	"github.com/google/btree"
)

// Check returns an error naming two blocks that are in use at the same
// time and share a byte of memory, or a block whose end overflows; nil if
// there are none. It sweeps the blocks' starts and ends in time order
// (ends first at the same op, as lifetimes are half open) and keeps the
// live blocks in a B-tree by offset: the live blocks never overlap, so a
// starting block overlaps one of them exactly when it overlaps its
// neighbour below or above. Blocks of 0 bytes take no memory.
func Check(blocks []Block) error {
	type event struct {
		t     int
		block int32
		start bool
	}
	ev := make([]event, 0, 2*len(blocks))
	for i := range blocks {
		b := &blocks[i]
		if b.Bytes == 0 || b.Start >= b.End {
			continue
		}
		if b.Offset > math.MaxUint64-b.Bytes {
			return fmt.Errorf("offline: block %d (op %d) at offset %d: its end overflows", b.ID, b.Start+1, b.Offset)
		}
		ev = append(ev, event{b.Start, int32(i), true}, event{b.End, int32(i), false})
	}
	slices.SortFunc(ev, func(x, y event) int {
		if c := cmp.Compare(x.t, y.t); c != 0 {
			return c
		}
		if x.start != y.start {
			if x.start {
				return 1
			}
			return -1
		}
		return cmp.Compare(x.block, y.block)
	})
	less := func(x, y int32) bool {
		return blocks[x].Offset < blocks[y].Offset || blocks[x].Offset == blocks[y].Offset && x < y
	}
	live := btree.NewG(16, less)
	for _, e := range ev {
		if !e.start {
			live.Delete(e.block)
			continue
		}
		b := &blocks[e.block]
		var other int32 = -1
		live.DescendLessOrEqual(e.block, func(y int32) bool {
			if overlapsAddress(b, &blocks[y]) {
				other = y
			}
			return false
		})
		if other < 0 {
			live.AscendGreaterOrEqual(e.block, func(y int32) bool {
				if overlapsAddress(b, &blocks[y]) {
					other = y
				}
				return false
			})
		}
		if other >= 0 {
			c := &blocks[other]
			return fmt.Errorf("offline: blocks %d (op %d, [%d, %d)) and %d (op %d, [%d, %d)) share memory while both are in use at op %d",
				c.ID, c.Start+1, c.Offset, c.Offset+c.Bytes, b.ID, b.Start+1, b.Offset, b.Offset+b.Bytes, e.t+1)
		}
		live.ReplaceOrInsert(e.block)
	}
	return nil
}

// Check verifies the plan: its packing (Check), its footprint (the highest
// end of a block) and that its bound is no more than its footprint.
func (p *Plan) Check() error {
	if err := Check(p.Blocks); err != nil {
		return err
	}
	var top uint64
	for i := range p.Blocks {
		b := &p.Blocks[i]
		if b.Bytes > 0 {
			top = max(top, b.Offset+b.Bytes)
		}
		if b.Start < 0 || b.End > p.Ops || b.Start >= b.End {
			return fmt.Errorf("offline: block %d has lifetime [%d, %d), outside the trace's %d ops", b.ID, b.Start, b.End, p.Ops)
		}
	}
	if top != p.Footprint {
		return fmt.Errorf("offline: the footprint is %d bytes, but the blocks reach %d", p.Footprint, top)
	}
	if p.Bound > p.Footprint {
		return fmt.Errorf("offline: the bound, %d bytes, is more than the footprint, %d", p.Bound, p.Footprint)
	}
	return nil
}
