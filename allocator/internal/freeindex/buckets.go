// This file holds sizeBuckets, the index of one stream's free blocks in
// the small pool: a bucket per 512-byte size, each a heap by address, and
// a bitmap of the buckets that hold blocks, so that the best fit is found
// with two bit scans instead of a search.

package freeindex

import "math/bits"

const (
	numClasses = SmallBuffer / MinBlockSize // sizes 512 B to 2 MiB, the largest free block of a small segment
	classWords = numClasses / 64
)

// sizeBuckets indexes free blocks of at most 2 MiB by size class (size /
// 512 - 1). Within a class every block has the same size, so the best fit
// for a size is the lowest address in the first non-empty class at or
// above the size's: the bitmap finds the class, the class's heap its
// lowest address. This is the order (size, address) of the B-tree that
// PyTorch 2.6 searches, for one stream.
//
// A class of one block (the common case) is just first[c]; a class of two
// or more is a heap by address in heaps[c], whose root first[c] mirrors.
//
// Invariants (checked by check): a bit of words is set exactly when its
// class holds blocks; a bit of summary exactly when its word is not zero;
// first[c] is the lowest address of class c, nil when it is empty;
// heaps[c] is empty for a class of at most one block, otherwise a heap by
// address of all its blocks with every block's heapIdx its position; n
// counts the blocks.
type sizeBuckets struct {
	summary uint64
	words   [classWords]uint64
	first   [numClasses]*Block
	heaps   *[numClasses][]*Block // made when a class first holds two blocks
	n       int

	// version changes with every insert and remove; the last best fit is
	// remembered with it (memo), so that asking again for the same size
	// of an index that has not changed since (an alloc and free of one
	// size in a loop, whose split waits and merges back: Index.pend)
	// costs a comparison.
	version     uint64
	memoVersion uint64
	memoSize    uint64
	memo        *Block
}

// classOf returns the class of a block size (a multiple of 512, at most 2
// MiB).
func classOf(size uint64) int { return int(size/MinBlockSize) - 1 }

// firstAtLeast returns the first non-empty class at or above c, or -1.
func (s *sizeBuckets) firstAtLeast(c int) int {
	w := c >> 6 & (classWords - 1)
	if m := s.words[w] & (^uint64(0) << (c & 63)); m != 0 {
		return w<<6 | bits.TrailingZeros64(m)
	}
	m := s.summary & (^uint64(0) << (w + 1))
	if m == 0 {
		return -1
	}
	w = bits.TrailingZeros64(m)
	return w<<6 | bits.TrailingZeros64(s.words[w&(classWords-1)])
}

// bestFit returns the free block of the lowest (size, address) with at
// least size bytes, or nil, and remembers the answer.
func (s *sizeBuckets) bestFit(size uint64) *Block {
	b := s.fit(size)
	s.memo, s.memoSize, s.memoVersion = b, size, s.version
	return b
}

// fit returns the free block of the lowest (size, address) with at least
// size bytes, or nil.
func (s *sizeBuckets) fit(size uint64) *Block {
	if size > SmallBuffer {
		return nil
	}
	if c := s.firstAtLeast(classOf(size)); c >= 0 {
		return s.first[c&(numClasses-1)]
	}
	return nil
}

// last returns a block of the largest size, or nil.
func (s *sizeBuckets) last() *Block {
	if s.summary == 0 {
		return nil
	}
	w := 63 - bits.LeadingZeros64(s.summary)
	c := w<<6 | (63 - bits.LeadingZeros64(s.words[w]))
	return s.first[c]
}

// insert adds b to its class.
func (s *sizeBuckets) insert(b *Block) {
	c := classOf(b.size) & (numClasses - 1)
	s.n++
	s.version++
	if s.first[c] != nil {
		s.insertMore(b, c)
		return
	}
	s.first[c] = b
	s.words[c>>6] |= 1 << (c & 63)
	s.summary |= 1 << (c >> 6)
}

// insertMore adds b to class c, which holds blocks already.
func (s *sizeBuckets) insertMore(b *Block, c int) {
	if s.heaps == nil {
		s.heaps = new([numClasses][]*Block)
	}
	h := s.heaps[c]
	if len(h) == 0 {
		if cap(h) == 0 {
			h = make([]*Block, 0, 4) // kept when the class shrinks back
		}
		f := s.first[c]
		f.heapIdx = 0
		h = append(h, f)
	}
	h = append(h, b)
	heapUp(h, len(h)-1, true)
	s.heaps[c] = h
	s.first[c] = h[0]
}

// remove takes b out of its class.
func (s *sizeBuckets) remove(b *Block) {
	c := classOf(b.size) & (numClasses - 1)
	s.n--
	s.version++
	if s.heaps != nil && len(s.heaps[c]) != 0 {
		s.removeMore(b, c)
		return
	}
	s.first[c] = nil
	w := s.words[c>>6] &^ (1 << (c & 63))
	s.words[c>>6] = w
	if w == 0 {
		s.summary &^= 1 << (c >> 6)
	}
}

// removeMore takes b out of class c, a heap of two blocks or more.
func (s *sizeBuckets) removeMore(b *Block, c int) {
	h := heapRemove(s.heaps[c], int(b.heapIdx))
	s.first[c] = h[0]
	if len(h) == 1 {
		h[0] = nil
		h = h[:0]
	}
	s.heaps[c] = h
}

// each calls f on every block, by class and in heap order within a class,
// until f returns false.
func (s *sizeBuckets) each(f func(*Block) bool) {
	for c := range numClasses {
		h := s.heap(c)
		if len(h) == 0 {
			if b := s.first[c]; b != nil && !f(b) {
				return
			}
			continue
		}
		for _, b := range h {
			if !f(b) {
				return
			}
		}
	}
}

// heap returns the heap of class c, nil for a class of at most one block.
func (s *sizeBuckets) heap(c int) []*Block {
	if s.heaps == nil {
		return nil
	}
	return s.heaps[c]
}

// class returns the blocks of class c, lowest address first in a class of
// one block, in heap order otherwise.
func (s *sizeBuckets) class(c int) []*Block {
	if h := s.heap(c); len(h) > 0 {
		return h
	}
	if s.first[c] != nil {
		return s.first[c : c+1]
	}
	return nil
}

// check verifies the bitmaps and heaps and returns a description of the
// first fault found, or "".
func (s *sizeBuckets) check() string {
	count := 0
	for c := range numClasses {
		h, f := s.heap(c), s.first[c]
		if (f != nil) != (s.words[c>>6]&(1<<(c&63)) != 0) {
			return "a size-class bit disagrees with its bucket"
		}
		if len(h) == 1 || len(h) > 0 && h[0] != f {
			return "a size bucket's heap and its first block disagree"
		}
		if f != nil && classOf(f.size) != c {
			return "a block is in the bucket of another size"
		}
		for i, b := range h {
			if b == nil || classOf(b.size) != c {
				return "a block is in the bucket of another size"
			}
			if int(b.heapIdx) != i {
				return "a block's heap position is wrong"
			}
			if i > 0 && h[(i-1)/2].ptr > b.ptr {
				return "a size bucket is not a heap by address"
			}
		}
		if len(h) > 0 {
			count += len(h)
		} else if f != nil {
			count++
		}
	}
	for w := range classWords {
		if (s.words[w] != 0) != (s.summary&(1<<w) != 0) {
			return "a summary bit disagrees with its word"
		}
	}
	if count != s.n {
		return "the block count is wrong"
	}
	if s.memoVersion == s.version && s.fit(s.memoSize) != s.memo {
		return "the remembered best fit is not the best fit"
	}
	return ""
}
