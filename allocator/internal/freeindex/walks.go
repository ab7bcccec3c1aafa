// This file holds the free index's walks: the ordered walks in (size,
// address) order that the rule of expandable segments and the
// low_fragmentation policy make, the largest block, every block, and the
// list of wholly free segments that releasing the cache walks.

package freeindex

import "math/bits"

// Fit returns the free block of the lowest (size, address) with at least
// size bytes, or nil, without the rule of expandable segments: where the
// walks in (size, address) order start.
func (x *Index) Fit(size uint64) *Block {
	if x.pend != nil {
		x.settle()
	}
	switch {
	case x.kind == KindSmall:
		return x.buckets.fit(size)
	case x.inLarge(size):
		if b := x.large.fit(size); b != nil {
			return b
		}
		return x.tree.min() // every block of the tree is larger
	}
	return x.tree.lowerBound(size)
}

// MayFit reports whether x may hold a free block of at least size bytes,
// without settling a pending split or reading the bitmap: false only
// where x surely holds none, an index of large buckets whose bound of the
// classes that hold blocks (a split's rest filed under the key of the
// whole, which is no smaller) lies below size's and whose tree is empty,
// with no arena held (whose free blocks are in no structure, and may
// have come from the tree). Fit then returns nil; the policy's search of
// the other streams' caches for a block to lend asks it first.
func (x *Index) MayFit(size uint64) bool {
	return x.kind != KindLarge || x.tree.n != 0 || x.pend == arenaMark || size > maxLargeSize || classOf(size) <= x.large.top
}

// Largest returns a free block of the largest size, or nil.
func (x *Index) Largest() *Block {
	if x.pend != nil {
		x.settle()
	}
	switch {
	case x.kind == KindSmall:
		return x.buckets.last()
	case x.kind == KindLarge && x.tree.n == 0:
		return x.large.last()
	}
	return x.tree.max()
}

// ascendFrom calls f on b, the lowest address of its size in x (a best
// fit, as fit returns it), then on the blocks after it in (size, address)
// order, until f returns false. Not for size buckets.
func (x *Index) ascendFrom(b *Block, f func(*Block) bool) {
	if x.pend != nil {
		x.settle()
	}
	if x.inLarge(b.size) {
		if !x.large.ascendFrom(classOf(b.size), f) {
			return
		}
		x.tree.ascend(f)
		return
	}
	l, i := x.tree.seek(KeyOf(b))
	ascendFrom(l, i, f)
}

// AscendAtLeast calls f on the free blocks of at least size bytes in
// (size, address) order until f returns false. Not for size buckets.
func (x *Index) AscendAtLeast(size uint64, f func(*Block) bool) {
	if b := x.Fit(size); b != nil {
		x.ascendFrom(b, f)
	}
}

// FitClose is Fit(size) and then, when that finds a block b, CloseFit(b,
// b's size plus that size >> shift, below, window): the low_fragmentation
// policy's fit of a large request, in one call that finds the size class
// of b once. Not for size buckets.
func (x *Index) FitClose(size uint64, shift uint, below uint64, window int) *Block {
	if x.pend != nil {
		x.settle()
	}
	if x.inLarge(size) {
		if c := x.large.firstAtLeast(classOf(size)); c >= 0 {
			s := x.large
			b := s.find(c).first
			limit := b.size + b.size>>shift
			if top := int(limit/MinBlockSize) - 1; limit < maxLargeSize {
				// No other class within limit, as on most fits of a loop
				// over tensors of a few shapes (BERT's steps: 1,626 of
				// 1,649 close fits a replay; random_mixed: 3,039 of
				// 37,388): b's class is the walk. The first class above
				// c in its word of l0 tells it, or else the first word
				// with classes above.
				w := c >> 6 & (largeWords - 1)
				if m := s.l0[w] >> (c & 63) >> 1; m != 0 {
					if c+1+bits.TrailingZeros64(m) > top {
						return b
					}
				} else if s.noneAboveWord(w, top) {
					return b
				}
			}
			return x.closeFitFrom(b, c, limit, below, window)
		}
	}
	b := x.Fit(size)
	if b == nil {
		return nil
	}
	return x.CloseFit(b, b.size+b.size>>shift, below, window)
}

// CloseFit returns the block of the lowest address among at most window
// free blocks of x from b (a best fit) up in (size, address) order, none
// larger than limit, whose size is below below; b if none is lower. Of
// the blocks of one size only the first, the lowest address, can be
// chosen; the others count in the window. Not for size buckets.
func (x *Index) CloseFit(b *Block, limit, below uint64, window int) *Block {
	if x.pend != nil {
		x.settle()
	}
	if x.inLarge(b.size) {
		return x.closeFitFrom(b, classOf(b.size), limit, below, window)
	}
	l, i := x.tree.seek(KeyOf(b))
	return closeFitTree(l, i, b, 0, limit, below, window)
}

// closeFitFrom is CloseFit for b, of class c of the large buckets.
func (x *Index) closeFitFrom(b *Block, c int, limit, below uint64, window int) *Block {
	best, n, done := x.large.closeFit(c, limit, below, window, b)
	if done {
		return best
	}
	return closeFitTree(x.tree.first, 0, best, n, limit, below, window) // then the blocks above 128 MiB
}

// closeFitTree is CloseFit's walk of the tree from its leaf l at i, with
// best the best block so far and n the blocks counted.
func closeFitTree(l *treeLeaf, i int, best *Block, n int, limit, below uint64, window int) *Block {
	ascendFrom(l, i, func(c *Block) bool {
		if c.size > limit {
			return false
		}
		n++
		if c.size < below && c.ptr < best.ptr {
			best = c
		}
		return n < window
	})
	return best
}

// Each calls f on every free block until f returns false, in no order
// the caller may rely on (the block whose split is pending is where its
// old key files it). It changes nothing, so that the checker may use it.
func (x *Index) Each(f func(*Block) bool) {
	switch x.kind {
	case KindSmall:
		x.buckets.each(f)
		return
	case KindLarge:
		stopped := false
		x.large.each(func(b *Block) bool {
			stopped = !f(b)
			return !stopped
		})
		if stopped {
			return
		}
	}
	x.tree.ascend(f)
}

// DescendBelow calls f on the free blocks of less than size bytes, from
// the largest (and, among equal sizes, the highest address) down, until f
// returns false. Size buckets hold no block it is asked for (it serves
// the release of oversize blocks, of more than 20 MiB): it calls f on
// none of theirs.
func (x *Index) DescendBelow(size uint64, f func(*Block) bool) {
	if x.kind == KindSmall {
		return
	}
	if x.pend != nil {
		x.settle()
	}
	stopped := false
	x.tree.descendBelow(Key{size, 0}, func(b *Block) bool {
		stopped = !f(b)
		return !stopped
	})
	if stopped || x.kind != KindLarge {
		return
	}
	c := largeClasses // every class is below size
	if size <= maxLargeSize {
		c = classOf(size)
	}
	x.large.descendBelow(c, f)
}

// AppendWholes appends the free blocks that fill their plain segment to
// list, in no particular order, and returns it.
func (x *Index) AppendWholes(list []*Block) []*Block {
	if x.pend != nil {
		x.settle()
	}
	if x.kind == KindSmall {
		return append(list, x.buckets.class(numClasses-1)...)
	}
	for b := x.wholes; b != nil; b = b.nextWhole {
		list = append(list, b)
	}
	return list
}

// EachWhole calls f on every free block that fills its plain segment, in
// no particular order.
func (x *Index) EachWhole(f func(*Block)) {
	if x.pend != nil {
		x.settle()
	}
	if x.kind == KindSmall {
		for _, b := range x.buckets.class(numClasses - 1) {
			f(b)
		}
		return
	}
	for b := x.wholes; b != nil; b = b.nextWhole {
		f(b)
	}
}

// list and unlist put a block that fills its segment in the list of whole
// free segments of an index that is not of size buckets, and take it out.
func (x *Index) list(b *Block) {
	b.listed, b.prevWhole, b.nextWhole = true, nil, x.wholes
	if x.wholes != nil {
		x.wholes.prevWhole = b
	} else if x.kind == KindTree { // a cold index
		x.pool.cold.listed(x)
	}
	x.wholes = b
}

func (x *Index) unlist(b *Block) {
	if b.prevWhole != nil {
		b.prevWhole.nextWhole = b.nextWhole
	} else {
		x.wholes = b.nextWhole
		if x.wholes == nil && x.kind == KindTree { // a cold index
			x.pool.cold.unlisted(x)
		}
	}
	if b.nextWhole != nil {
		b.nextWhole.prevWhole = b.prevWhole
	}
	b.listed, b.prevWhole, b.nextWhole = false, nil, nil
}
