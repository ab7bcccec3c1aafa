// This file holds TimeOrder, the packing in the order items come into use,
// and Within, which packs by size (Greedy) unless that would read more
// than a budget of placed items, and in time order then.

package pack

import (
	"cmp"
	"context"
	"slices"

	"github.com/google/btree"
)

// gap is a free range [off, off+size) below a TimeOrder's top.
type gap struct{ off, size uint64 }

// gapLess orders gaps by size, then offset: the first at or above a size
// is the best fit for it, the lowest of its size.
func gapLess(a, b gap) bool {
	if a.size != b.size {
		return a.size < b.size
	}
	return a.off < b.off
}

// gaps are the free ranges below a TimeOrder's top: by size and offset
// for the best fit, and by their starts and their ends for the merge of
// a range given back with those beside it.
type gaps struct {
	bySize *btree.BTreeG[gap]
	at     map[uint64]uint64 // start -> size
	ending map[uint64]uint64 // end -> start
}

// add files the free range x.
func (g *gaps) add(x gap) {
	g.bySize.ReplaceOrInsert(x)
	g.at[x.off] = x.size
	g.ending[x.off+x.size] = x.off
}

// remove takes the free range x, filed, out.
func (g *gaps) remove(x gap) {
	g.bySize.Delete(x)
	delete(g.at, x.off)
	delete(g.ending, x.off+x.size)
}

// TimeOrder packs items as an allocator that knows no lifetime would
// place them, in the order they come into use: at its Start each item
// takes the smallest free gap that holds it (the lowest of those on a
// tie), or else the free gap that ends at the top, grown past it, or
// else the top; at its End it gives its bytes back, merged with the free
// gaps beside them. At an op, the items that end there give their bytes
// back before those that start there take theirs; items that start at
// one op come in the order of their indices. It writes each item's
// offset in offsets (0 for one that takes no memory), and, if order is
// not nil, the items by offset as Greedy does (those that take memory
// from the lowest offset up, ties by index, then the others by index),
// and returns the footprint.
//
// It costs O(n log n) whatever the lifetimes, where Greedy reads about
// the pairs of items in use at once: on a training step's blocks, most
// of which are in use together, n^2/2. It packs looser: BERT's steps at
// batches 2, 4 and 8 into 0.04 to 0.52 % more than their peaks of
// bytes in use, which greedy by size meets or comes within 0.09 % of.
func TimeOrder(items []Item, offsets []uint64, order []int32) uint64 {
	var starts []int32
	for i := range items {
		offsets[i] = 0
		if takesMemory(&items[i]) {
			starts = append(starts, int32(i))
		}
	}
	ends := slices.Clone(starts)
	slices.SortFunc(starts, func(x, y int32) int {
		return cmp.Or(cmp.Compare(items[x].Start, items[y].Start), cmp.Compare(x, y))
	})
	slices.SortFunc(ends, func(x, y int32) int {
		return cmp.Or(cmp.Compare(items[x].End, items[y].End), cmp.Compare(x, y))
	})
	g := gaps{bySize: btree.NewG(32, gapLess), at: map[uint64]uint64{}, ending: map[uint64]uint64{}}
	var top uint64
	for i, j := 0, 0; i < len(starts); {
		if j < len(ends) && items[ends[j]].End <= items[starts[i]].Start {
			// A free: merged with the gaps that end where it starts and
			// start where it ends.
			x := gap{offsets[ends[j]], items[ends[j]].Bytes}
			if off, ok := g.ending[x.off]; ok {
				below := gap{off, x.off - off}
				g.remove(below)
				x = gap{off, below.size + x.size}
			}
			if size, ok := g.at[x.off+x.size]; ok {
				g.remove(gap{x.off + x.size, size})
				x.size += size
			}
			g.add(x)
			j++
			continue
		}
		k := starts[i]
		i++
		b := items[k].Bytes
		var fit gap
		found := false
		g.bySize.AscendGreaterOrEqual(gap{size: b}, func(x gap) bool {
			fit, found = x, true
			return false
		})
		switch {
		case found:
			g.remove(fit)
			if fit.size > b {
				g.add(gap{fit.off + b, fit.size - b})
			}
			offsets[k] = fit.off
		default:
			off := top
			if start, ok := g.ending[top]; ok {
				g.remove(gap{start, top - start}) // the gap at the top, grown
				off = start
			}
			offsets[k] = off
			top = off + b
		}
	}
	if order != nil {
		n := copy(order, starts)
		slices.SortFunc(order[:n], func(x, y int32) int {
			return cmp.Or(cmp.Compare(offsets[x], offsets[y]), cmp.Compare(x, y))
		})
		listUnplaced(items, order[n:])
	}
	return top
}

// Within packs items as Greedy does by size (Orders[0]), with fit,
// unless Greedy's model of the placed items it would read (the cheaper
// of its two searches: n^2/2 in address order, or through the buckets
// of time at scanCosts each) exceeds budget: then in time order
// (TimeOrder). It writes offsets and order as Greedy does, and returns
// the footprint and whether it packed by size. A caller that packs
// while others wait (the allocator's planned policy, under its lock)
// bounds the wait so: Greedy's reads grow as the square of the items
// in use at once, TimeOrder's work as n log n.
func Within(items []Item, ops int, offsets []uint64, fit Fit, order []int32, budget int) (uint64, bool) {
	if len(items) == 0 {
		return 0, true
	}
	scan, cost := searchCost(items, ops)
	if cost > budget {
		return TimeOrder(items, offsets, order), false
	}
	return greedy(context.Background(), items, ops, Sorted(items, 0), offsets, fit, order, scan), true
}
