// This file holds freeTree, the ordered index of one stream's free blocks
// in the large pool (and in pools of expandable segments): a B+ tree whose
// nodes hold their (size, address) keys inline, so that a search compares
// integers in one node's memory instead of calling a comparison function
// on blocks scattered over the heap.

package freeindex

import "github.com/gpumem/gpumem/device"

// Key is a free block's place in the best-fit order: by size, then by
// address (PyTorch 2.6's order within one stream).
type Key struct {
	size uint64
	ptr  device.Ptr
}

func KeyOf(b *Block) Key { return Key{b.size, b.ptr} }

func (k Key) less(o Key) bool {
	return k.size < o.size || k.size == o.size && k.ptr < o.ptr
}

const (
	treeOrder    = 32 // entries of a leaf, children of an inner node, at most
	treeMinFill  = treeOrder / 4
	treeMaxDepth = 12 // inner levels: a tree of that height holds at least 2 * 8^12 blocks
)

// A treeLeaf holds up to treeOrder blocks in key order. Leaves are linked
// in key order for iteration.
type treeLeaf struct {
	n          int
	keys       [treeOrder]Key
	vals       [treeOrder]*Block
	prev, next *treeLeaf
}

// A treeInner holds up to treeOrder children: inner nodes, or leaves at
// the lowest inner level. keys[i] separates kids i and i+1: every key in
// kid i is less than keys[i], every key in kid i+1 is at least keys[i].
type treeInner struct {
	n      int
	keys   [treeOrder - 1]Key
	inner  [treeOrder]*treeInner // children above the lowest inner level
	leaves [treeOrder]*treeLeaf  // children at the lowest inner level
}

// freeTree is a B+ tree of blocks keyed by (size, address). The zero
// value is an empty tree.
//
// Why not github.com/google/btree, which the unmapped indexes use: its
// nodes hold the items alone, so every comparison of a search calls the
// less function on two blocks, each a pointer into the heap, where
// freeTree compares integer keys held in the node; it has no lower bound
// but through a callback walk, and no move of a key within its leaf
// (rekey). BenchmarkFreeTree (tree_bench_test.go) does what a free index
// does with its tree, a best-fit search, the removal of the block found
// and an insertion: measured with callgrind (instructions per operation,
// CGO_ENABLED=0 GOMAXPROCS=1 GOGC=off; the difference of runs of 100000
// and 200000 operations), freeTree takes 870, 1190 and 1514 instructions
// among 64, 4096 and 262144 blocks, google/btree of degree 32 takes 1783,
// 2609 and 5711: two to almost four times as many. Invariants (checked by check): keys strictly
// increase through the leaves; every node but the root holds at least
// treeMinFill entries; separators bound their subtrees; n counts the
// blocks.
type freeTree struct {
	root        *treeInner // nil while the tree is one leaf (height 0)
	leaf        *treeLeaf  // the root while height is 0; nil when empty
	height      int        // inner levels
	first, last *treeLeaf
	n           int
	spare       *treeLeaf // the last leaf of a tree that emptied, for the next insert
}

// search returns the index of the first key of l not less than k.
func (l *treeLeaf) search(k Key) int { return l.searchIn(k, 0, l.n) }

// child returns the index of the child of in whose range holds k.
func (in *treeInner) child(k Key) int {
	lo, hi := 0, in.n-1
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if k.less(in.keys[m]) {
			hi = m
		} else {
			lo = m + 1
		}
	}
	return lo
}

// pathStep is one inner node on the way down and the child taken.
type pathStep struct {
	node *treeInner
	i    int
}

// descend walks from the root to the leaf whose range holds k, recording
// the inner nodes in path, and returns the leaf.
func (t *freeTree) descend(k Key, path *[treeMaxDepth]pathStep) *treeLeaf {
	if t.height == 0 {
		return t.leaf
	}
	n := t.root
	for h := 0; ; h++ {
		i := n.child(k)
		path[h] = pathStep{n, i}
		if h == t.height-1 {
			return n.leaves[i]
		}
		n = n.inner[i]
	}
}

// leafFor returns the leaf whose range holds k (nil for an empty tree).
func (t *freeTree) leafFor(k Key) *treeLeaf {
	if t.height == 0 {
		return t.leaf
	}
	n := t.root
	for h := t.height; h > 1; h-- {
		n = n.inner[n.child(k)]
	}
	return n.leaves[n.child(k)]
}

// seek returns the position of the first block not less than k: a leaf and
// an index in it, or a nil leaf when there is none.
func (t *freeTree) seek(k Key) (*treeLeaf, int) {
	l := t.leafFor(k)
	if l == nil {
		return nil, 0
	}
	i := l.search(k)
	if i == l.n {
		return l.next, 0
	}
	return l, i
}

// lowerBound returns the first block of at least size bytes (the lowest
// address among the smallest such), or nil.
func (t *freeTree) lowerBound(size uint64) *Block {
	l, i := t.seek(Key{size, 0})
	if l == nil {
		return nil
	}
	return l.vals[i]
}

// min and max return the first and last blocks, or nil.
func (t *freeTree) min() *Block {
	if t.n == 0 {
		return nil
	}
	return t.first.vals[0]
}

func (t *freeTree) max() *Block {
	if t.n == 0 {
		return nil
	}
	return t.last.vals[t.last.n-1]
}

// insert adds b under its key, which must not be in the tree.
func (t *freeTree) insert(b *Block) {
	k := KeyOf(b)
	t.n++
	if t.leaf == nil && t.height == 0 {
		l := t.spare
		if l == nil {
			l = new(treeLeaf)
		}
		t.spare = nil
		l.n = 1
		l.keys[0], l.vals[0] = k, b
		t.leaf, t.first, t.last = l, l, l
		return
	}
	l := t.leafFor(k)
	i := l.search(k)
	if l.n < treeOrder {
		l.insertAt(i, k, b)
		return
	}
	// Split the full leaf in two halves, then put b in its half; the path
	// down is needed to add the new leaf to its parent.
	var path [treeMaxDepth]pathStep
	t.descend(k, &path)
	r := &treeLeaf{n: treeOrder / 2}
	copy(r.keys[:], l.keys[treeOrder/2:])
	copy(r.vals[:], l.vals[treeOrder/2:])
	clear(l.vals[treeOrder/2:])
	l.n = treeOrder / 2
	r.prev, r.next = l, l.next
	if l.next != nil {
		l.next.prev = r
	} else {
		t.last = r
	}
	l.next = r
	if i <= treeOrder/2 {
		l.insertAt(i, k, b)
	} else {
		r.insertAt(i-treeOrder/2, k, b)
	}
	t.grow(&path, r.keys[0], nil, r)
}

func (l *treeLeaf) insertAt(i int, k Key, b *Block) {
	copy(l.keys[i+1:l.n+1], l.keys[i:l.n])
	copy(l.vals[i+1:l.n+1], l.vals[i:l.n])
	l.keys[i], l.vals[i] = k, b
	l.n++
}

// grow adds a new right sibling (an inner node or a leaf) with separator
// sep after the child taken at the lowest level of path, splitting inner
// nodes up the path as they fill.
func (t *freeTree) grow(path *[treeMaxDepth]pathStep, sep Key, inner *treeInner, leaf *treeLeaf) {
	for h := t.height - 1; h >= 0; h-- {
		n, i := path[h].node, path[h].i
		if n.n < treeOrder {
			n.insertChild(i, sep, inner, leaf)
			return
		}
		// Split n: the right half moves to r, and the middle separator
		// goes up.
		r := &treeInner{}
		const half = treeOrder / 2
		up := n.keys[half-1]
		r.n = treeOrder - half
		copy(r.keys[:], n.keys[half:])
		copy(r.inner[:], n.inner[half:])
		copy(r.leaves[:], n.leaves[half:])
		clear(n.inner[half:])
		clear(n.leaves[half:])
		n.n = half
		if i < half {
			n.insertChild(i, sep, inner, leaf)
		} else {
			r.insertChild(i-half, sep, inner, leaf)
		}
		sep, inner, leaf = up, r, nil
	}
	// The root split: a new root above.
	root := &treeInner{n: 2}
	root.keys[0] = sep
	if t.height == 0 {
		root.leaves[0], root.leaves[1] = t.leaf, leaf
		t.leaf = nil
	} else {
		root.inner[0], root.inner[1] = t.root, inner
	}
	t.root = root
	t.height++
}

// insertChild puts a new child (inner or leaf) right after child i, with
// separator sep before it.
func (n *treeInner) insertChild(i int, sep Key, inner *treeInner, leaf *treeLeaf) {
	copy(n.keys[i+1:n.n], n.keys[i:n.n-1])
	n.keys[i] = sep
	if leaf != nil {
		copy(n.leaves[i+2:n.n+1], n.leaves[i+1:n.n])
		n.leaves[i+1] = leaf
	} else {
		copy(n.inner[i+2:n.n+1], n.inner[i+1:n.n])
		n.inner[i+1] = inner
	}
	n.n++
}

// rekey moves b, filed under old, to its current key (b's size and
// address changed, as a split or a merge changes them). When the new key
// falls strictly between two other keys of b's leaf, or below all keys of
// the first leaf or above all keys of the last (no other leaf's range
// then bounds it), b moves within the leaf, shifting the entries between
// its two places: one search instead of a remove and an insert.
func (t *freeTree) rekey(b *Block, old Key) {
	k := KeyOf(b)
	l := t.leafFor(old)
	i := l.n - 1 // the leaf's highest, as the free top of a pool with one segment is
	if i < 0 || l.vals[i] != b {
		i = l.search(old)
	}
	if i < l.n && l.vals[i] == b {
		if k.less(old) {
			// Moving down: the first key not less than k, among those
			// before b, needs a smaller key before it in the leaf, or
			// the leaf to be the first. Most often b keeps its slot.
			if i > 0 && l.keys[i-1].less(k) {
				l.keys[i] = k
				return
			}
			j := l.searchIn(k, 0, i)
			if j > 0 || l == t.first {
				copy(l.keys[j+1:i+1], l.keys[j:i])
				copy(l.vals[j+1:i+1], l.vals[j:i])
				l.keys[j], l.vals[j] = k, b
				return
			}
		} else {
			// Moving up: the first key not less than k, among those after
			// b, must be in the leaf, or the leaf be the last.
			if i+1 < l.n && k.less(l.keys[i+1]) {
				l.keys[i] = k
				return
			}
			j := l.searchIn(k, i+1, l.n)
			if j < l.n || l == t.last {
				copy(l.keys[i:j-1], l.keys[i+1:j])
				copy(l.vals[i:j-1], l.vals[i+1:j])
				l.keys[j-1], l.vals[j-1] = k, b
				return
			}
		}
	}
	// Across leaves: a remove under the old key and an insert.
	b.ptr, b.size = old.ptr, old.size
	t.remove(b)
	b.ptr, b.size = k.ptr, k.size
	t.insert(b)
}

// searchIn returns the index of the first key of l[lo:hi] not less than
// k, or hi.
func (l *treeLeaf) searchIn(k Key, lo, hi int) int {
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if l.keys[m].less(k) {
			lo = m + 1
		} else {
			hi = m
		}
	}
	return lo
}

// remove deletes b, filed under its current key; it reports whether b
// was there.
func (t *freeTree) remove(b *Block) bool {
	if t.n == 0 {
		return false
	}
	k := KeyOf(b)
	l := t.leafFor(k)
	i := l.search(k)
	if i == l.n || l.vals[i] != b {
		return false
	}
	copy(l.keys[i:l.n-1], l.keys[i+1:l.n])
	copy(l.vals[i:l.n-1], l.vals[i+1:l.n])
	l.n--
	l.vals[l.n] = nil
	t.n--
	if l.n >= treeMinFill {
		return true
	}
	if t.height == 0 {
		if l.n == 0 {
			t.leaf, t.first, t.last, t.spare = nil, nil, nil, l
		}
		return true
	}
	var path [treeMaxDepth]pathStep
	t.descend(k, &path) // the separators are as they were: the same leaf
	t.rebalanceLeaf(&path, l)
	return true
}

// rebalanceLeaf refills the underfull leaf l from a sibling, or merges the
// two, and then rebalances the inner nodes up the path.
func (t *freeTree) rebalanceLeaf(path *[treeMaxDepth]pathStep, l *treeLeaf) {
	h := t.height - 1
	parent, i := path[h].node, path[h].i
	// Work on the pair (left, right) = children j and j+1 of parent.
	j := i
	if j == parent.n-1 {
		j--
	}
	left, right := parent.leaves[j], parent.leaves[j+1]
	if left.n+right.n > treeOrder {
		// Redistribute: even the pair out.
		total := left.n + right.n
		want := total / 2
		if left.n < want {
			m := want - left.n
			copy(left.keys[left.n:], right.keys[:m])
			copy(left.vals[left.n:], right.vals[:m])
			copy(right.keys[:], right.keys[m:right.n])
			copy(right.vals[:], right.vals[m:right.n])
			clear(right.vals[right.n-m : right.n])
			left.n, right.n = want, right.n-m
		} else {
			m := left.n - want
			copy(right.keys[m:], right.keys[:right.n])
			copy(right.vals[m:], right.vals[:right.n])
			copy(right.keys[:m], left.keys[want:left.n])
			copy(right.vals[:m], left.vals[want:left.n])
			clear(left.vals[want:left.n])
			left.n, right.n = want, right.n+m
		}
		parent.keys[j] = right.keys[0]
		return
	}
	// Merge right into left.
	copy(left.keys[left.n:], right.keys[:right.n])
	copy(left.vals[left.n:], right.vals[:right.n])
	left.n += right.n
	left.next = right.next
	if right.next != nil {
		right.next.prev = left
	} else {
		t.last = left
	}
	parent.removeChild(j + 1)
	t.rebalanceInner(path, h)
}

// removeChild deletes child i (i >= 1) and the separator before it.
func (n *treeInner) removeChild(i int) {
	copy(n.keys[i-1:n.n-2], n.keys[i:n.n-1])
	copy(n.inner[i:n.n-1], n.inner[i+1:n.n])
	copy(n.leaves[i:n.n-1], n.leaves[i+1:n.n])
	n.n--
	n.inner[n.n], n.leaves[n.n] = nil, nil
}

// rebalanceInner restores the fill of the inner node at level h of path
// after it lost a child, up to the root.
func (t *freeTree) rebalanceInner(path *[treeMaxDepth]pathStep, h int) {
	for ; ; h-- {
		n := path[h].node
		if h == 0 {
			if n.n == 1 { // the root has one child: it becomes the root
				if t.height == 1 {
					t.leaf = n.leaves[0]
					t.root = nil
				} else {
					t.root = n.inner[0]
				}
				t.height--
			}
			return
		}
		if n.n >= treeMinFill {
			return
		}
		parent, i := path[h-1].node, path[h-1].i
		j := i
		if j == parent.n-1 {
			j--
		}
		left, right := parent.inner[j], parent.inner[j+1]
		if left.n+right.n > treeOrder {
			// Rotate children through the parent's separator.
			want := (left.n + right.n) / 2
			for left.n < want {
				left.keys[left.n-1] = parent.keys[j]
				left.inner[left.n], left.leaves[left.n] = right.inner[0], right.leaves[0]
				left.n++
				parent.keys[j] = right.keys[0]
				right.removeFirst()
			}
			for left.n > want {
				right.prependChild(parent.keys[j], left.inner[left.n-1], left.leaves[left.n-1])
				parent.keys[j] = left.keys[left.n-2]
				left.n--
				left.inner[left.n], left.leaves[left.n] = nil, nil
			}
			return
		}
		// Merge right into left, pulling the separator down.
		left.keys[left.n-1] = parent.keys[j]
		copy(left.keys[left.n:], right.keys[:right.n-1])
		copy(left.inner[left.n:], right.inner[:right.n])
		copy(left.leaves[left.n:], right.leaves[:right.n])
		left.n += right.n
		parent.removeChild(j + 1)
	}
}

// removeFirst drops child 0 and separator 0.
func (n *treeInner) removeFirst() {
	copy(n.keys[:n.n-2], n.keys[1:n.n-1])
	copy(n.inner[:n.n-1], n.inner[1:n.n])
	copy(n.leaves[:n.n-1], n.leaves[1:n.n])
	n.n--
	n.inner[n.n], n.leaves[n.n] = nil, nil
}

// prependChild puts a child before child 0, with separator sep after it.
func (n *treeInner) prependChild(sep Key, inner *treeInner, leaf *treeLeaf) {
	copy(n.keys[1:n.n], n.keys[:n.n-1])
	copy(n.inner[1:n.n+1], n.inner[:n.n])
	copy(n.leaves[1:n.n+1], n.leaves[:n.n])
	n.keys[0] = sep
	n.inner[0], n.leaves[0] = inner, leaf
	n.n++
}

// ascendFrom calls f on the blocks from the position (l, i) on, in key
// order, until f returns false.
func ascendFrom(l *treeLeaf, i int, f func(*Block) bool) {
	for ; l != nil; l, i = l.next, 0 {
		for ; i < l.n; i++ {
			if !f(l.vals[i]) {
				return
			}
		}
	}
}

// ascend calls f on every block in key order until f returns false.
func (t *freeTree) ascend(f func(*Block) bool) { ascendFrom(t.first, 0, f) }

// DescendBelow calls f on the blocks less than k, from the largest down,
// until f returns false.
func (t *freeTree) descendBelow(k Key, f func(*Block) bool) {
	l, i := t.seek(k)
	if l == nil {
		l, i = t.last, 0
		if l != nil {
			i = l.n
		}
	}
	for ; l != nil; l = l.prev {
		for i--; i >= 0; i-- {
			if !f(l.vals[i]) {
				return
			}
		}
		if l.prev != nil {
			i = l.prev.n
		}
	}
}
