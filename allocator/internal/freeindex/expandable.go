// This file holds ExpandableBestFit and what it reads of a block: PyTorch's
// rule for choosing among free blocks of expandable segments by what they
// could grow to.

package freeindex

// ExpandableBestFit applies PyTorch's rule for an expandable block b found
// by the best-fit search (the lowest address of its size): among the
// following blocks of the same stream, prefer one whose size plus the
// unmapped range after it is smaller, that is, one that could not grow as
// much. The walk visits the blocks in (size, address) order from the
// lowest address of b's size, b itself passed over, and stops at the
// first that could grow as much as the one kept, or after one of a plain
// segment was kept. In large buckets the classes of one block are read
// in place, without a call per block, up to the first class of several
// (a heap, walked in address order by expandableRest).
func ExpandableBestFit(x *Index, b *Block) *Block {
	if expandableSize(b) == b.size {
		// b cannot grow, and no later block is smaller: the walk would
		// stop at the first.
		return b
	}
	if x.pend != nil {
		x.settle()
	}
	if !x.inLarge(b.size) {
		l, i := x.tree.seek(KeyOf(b))
		return expandableRest(nil, -1, l, i, b, b)
	}
	s := x.large
	cur, curSize := b, expandableSize(b)
	for c := classOf(b.size); c >= 0; c = s.firstAtLeast(c + 1) {
		bk := s.find(c)
		if len(bk.heap) > 0 {
			return expandableRest(s, c, x.tree.first, 0, b, cur)
		}
		if n := bk.first; n != b {
			if !cur.seg.Expandable() || expandableSize(n) >= curSize {
				return cur
			}
			cur, curSize = n, expandableSize(n)
		}
		if c+1 == largeClasses {
			break
		}
	}
	if x.tree.n == 0 {
		return cur
	}
	return expandableRest(nil, -1, x.tree.first, 0, b, cur) // the blocks above 128 MiB
}

// expandableRest is ExpandableBestFit's walk for b on from class c of the
// large buckets s (none if c < 0) and then through the tree from its leaf
// l at i, with cur the block kept so far.
func expandableRest(s *largeBuckets, c int, l *treeLeaf, i int, b, cur *Block) *Block {
	curSize := expandableSize(cur)
	visit := func(n *Block) bool {
		if n == b {
			return true
		}
		if !cur.seg.Expandable() || expandableSize(n) >= curSize {
			return false
		}
		cur, curSize = n, expandableSize(n)
		return true
	}
	if c >= 0 && !s.ascendFrom(c, visit) {
		return cur
	}
	ascendFrom(l, i, visit)
	return cur
}

// CanGrow reports whether b, a free block of an expandable segment, has
// an unmapped range after it: whether ExpandableBestFit may choose
// another block than b. Small enough to be inlined where the test saves
// the call.
func CanGrow(b *Block) bool { return b.grows() }

// expandableSize is what a free block could grow to by mapping the
// unmapped range after it.
func expandableSize(b *Block) uint64 {
	if b.grows() {
		return b.size + b.next.size
	}
	return b.size
}
