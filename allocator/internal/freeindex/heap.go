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
		p := int(uint(i-1) / 2) // a shift: i is positive
		if h[p].ptr < b.ptr {
			break
		}
		m := h[p]
		h[i] = m
		if track {
			m.heapIdx = int32(i)
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
	for {
		// Unsigned tests against len(h) (an overflowed 2*i+1 is past it
		// too): the compiler then checks no bounds for the children.
		c := 2*i + 1
		if uint(c) >= uint(len(h)) {
			break
		}
		m := h[c] // the child of the lower address
		if d := c + 1; uint(d) < uint(len(h)) {
			if n := h[d]; n.ptr < m.ptr {
				c, m = d, n
			}
		}
		if b.ptr < m.ptr {
			break
		}
		h[i] = m
		if track {
			m.heapIdx = int32(i)
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
