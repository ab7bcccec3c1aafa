// This file holds the one binary heap of the free indexes: blocks by
// address. The blocks of one size class are such a heap, each block's
// heapIdx its position (sizeBuckets, largeBuckets); so is the frontier
// that walks a class's heap in address order (largeBuckets.ascendHeap),
// which leaves the positions alone.

package freeindex

// heapUp moves h[i] towards the root past every block of a higher
// address, and reports whether it moved. With track, it sets the heapIdx
// of every block it moves to its new position.
func heapUp(h []*Block, i int, track bool) bool {
	b := h[i]
	start := i
	for i > 0 {
		p := (i - 1) / 2
		if h[p].ptr < b.ptr {
			break
		}
		h[i] = h[p]
		if track {
			h[i].heapIdx = int32(i)
		}
		i = p
	}
	h[i] = b
	if track {
		b.heapIdx = int32(i)
	}
	return i != start
}

// heapDown moves h[i] towards the leaves past every block of a lower
// address; with track, it sets the heapIdx of every block it moves.
func heapDown(h []*Block, i int, track bool) {
	b := h[i]
	n := len(h)
	for {
		c := 2*i + 1
		if c >= n {
			break
		}
		if c+1 < n && h[c+1].ptr < h[c].ptr {
			c++
		}
		if b.ptr < h[c].ptr {
			break
		}
		h[i] = h[c]
		if track {
			h[i].heapIdx = int32(i)
		}
		i = c
	}
	h[i] = b
	if track {
		b.heapIdx = int32(i)
	}
}

// heapRemove takes h[i] out of the tracked heap h and returns the
// shorter heap; the last block fills the hole and moves to its place.
func heapRemove(h []*Block, i int) []*Block {
	last := len(h) - 1
	x := h[last]
	h[last] = nil
	h = h[:last]
	if i != last {
		h[i] = x
		x.heapIdx = int32(i)
		if !heapUp(h, i, true) {
			heapDown(h, i, true)
		}
	}
	return h
}
