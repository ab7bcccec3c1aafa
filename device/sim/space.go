// Free address ranges of one region, and the first-fit search over them.
// See doc.go for the address rule.

package sim

// freeSpace is the set of free address ranges of one region (device memory
// or virtual-memory reservations). Ranges are disjoint and never adjacent:
// a freed range merges with the free ranges that touch it.
//
// It is a treap keyed by start address, where every node also knows the
// largest free range in its subtree (maxSize). That one augmentation makes
// the first-fit search logarithmic: descend left while the left subtree has
// a range big enough, stop at the node when it fits, otherwise go right.
// Nothing in here depends on the tree's shape, so the priorities (from a
// fixed-seed generator) affect speed only, never which address is chosen.
//
// freeSpace is not safe for concurrent use; the Device's mutex guards it.
type freeSpace struct {
	root  *spanNode
	count int       // number of free ranges
	seed  uint64    // state of the priority generator (xorshift)
	spare *spanNode // recycled nodes, linked through right
}

type spanNode struct {
	start, size uint64
	maxSize     uint64 // largest size in this subtree
	prio        uint64
	left, right *spanNode
}

// newFreeSpace returns a space whose only free range is [base, base+size).
func newFreeSpace(base, size uint64) freeSpace {
	s := freeSpace{seed: 0x9e3779b97f4a7c15}
	if size > 0 {
		s.root = s.node(base, size)
		s.count = 1
	}
	return s
}

func (s *freeSpace) node(start, size uint64) *spanNode {
	n := s.spare
	if n != nil {
		s.spare = n.right
	} else {
		n = new(spanNode)
	}
	s.seed ^= s.seed << 13
	s.seed ^= s.seed >> 7
	s.seed ^= s.seed << 17
	*n = spanNode{start: start, size: size, maxSize: size, prio: s.seed}
	return n
}

func (s *freeSpace) recycle(n *spanNode) {
	*n = spanNode{right: s.spare}
	s.spare = n
}

func (n *spanNode) fix() {
	m := n.size
	if n.left != nil && n.left.maxSize > m {
		m = n.left.maxSize
	}
	if n.right != nil && n.right.maxSize > m {
		m = n.right.maxSize
	}
	n.maxSize = m
}

// firstFit returns the start of the lowest-addressed free range of at least
// size bytes, without changing anything.
func (s *freeSpace) firstFit(size uint64) (uint64, bool) {
	n := s.root
	if n == nil || n.maxSize < size {
		return 0, false
	}
	for {
		if n.left != nil && n.left.maxSize >= size {
			n = n.left
			continue
		}
		if n.size >= size {
			return n.start, true
		}
		n = n.right // its maxSize >= size, or this one would not be on the path
	}
}

// take allocates size bytes (size > 0) at the lowest free address that fits
// and returns that address.
func (s *freeSpace) take(size uint64) (uint64, bool) {
	start, ok := s.firstFit(size)
	if !ok {
		return 0, false
	}
	s.root = s.carve(s.root, start, size)
	return start, true
}

// carve removes [start, start+size) from the front of the free range that
// begins at start, in the subtree t, and returns the new subtree.
func (s *freeSpace) carve(t *spanNode, start, size uint64) *spanNode {
	switch {
	case start < t.start:
		t.left = s.carve(t.left, start, size)
	case start > t.start:
		t.right = s.carve(t.right, start, size)
	default:
		if t.size == size {
			m := s.merge(t.left, t.right)
			s.recycle(t)
			s.count--
			return m
		}
		// The rest keeps its place in address order: it still lies
		// between its neighbours.
		t.start += size
		t.size -= size
	}
	t.fix()
	return t
}

// give returns [start, start+size) to the free space. The range must not
// overlap a free range (the caller's bookkeeping guarantees it).
func (s *freeSpace) give(start, size uint64) {
	end := start + size
	pred := s.floor(start)
	succ := s.ceil(end)
	joinPred := pred != nil && pred.start+pred.size == start
	joinSucc := succ != nil && succ.start == end
	switch {
	case joinPred && joinSucc:
		total := pred.size + size + succ.size
		succStart := succ.start
		s.root = s.remove(s.root, succStart)
		s.root = s.resize(s.root, pred.start, pred.start, total)
	case joinPred:
		s.root = s.resize(s.root, pred.start, pred.start, pred.size+size)
	case joinSucc:
		s.root = s.resize(s.root, succ.start, start, succ.size+size)
	default:
		s.root = s.insert(s.root, s.node(start, size))
		s.count++
	}
}

// floor returns the free range with the greatest start <= addr.
func (s *freeSpace) floor(addr uint64) *spanNode {
	var best *spanNode
	for n := s.root; n != nil; {
		if n.start <= addr {
			best = n
			n = n.right
		} else {
			n = n.left
		}
	}
	return best
}

// ceil returns the free range with the least start >= addr.
func (s *freeSpace) ceil(addr uint64) *spanNode {
	var best *spanNode
	for n := s.root; n != nil; {
		if n.start >= addr {
			best = n
			n = n.left
		} else {
			n = n.right
		}
	}
	return best
}

// resize finds the range starting at key and gives it a new start and size
// that keep its place in address order, fixing maxSize on the path.
func (s *freeSpace) resize(t *spanNode, key, start, size uint64) *spanNode {
	switch {
	case key < t.start:
		t.left = s.resize(t.left, key, start, size)
	case key > t.start:
		t.right = s.resize(t.right, key, start, size)
	default:
		t.start, t.size = start, size
	}
	t.fix()
	return t
}

func (s *freeSpace) insert(t, n *spanNode) *spanNode {
	if t == nil {
		return n
	}
	if n.prio > t.prio {
		n.left, n.right = s.split(t, n.start)
		n.fix()
		return n
	}
	if n.start < t.start {
		t.left = s.insert(t.left, n)
	} else {
		t.right = s.insert(t.right, n)
	}
	t.fix()
	return t
}

func (s *freeSpace) remove(t *spanNode, key uint64) *spanNode {
	switch {
	case key < t.start:
		t.left = s.remove(t.left, key)
	case key > t.start:
		t.right = s.remove(t.right, key)
	default:
		m := s.merge(t.left, t.right)
		s.recycle(t)
		s.count--
		return m
	}
	t.fix()
	return t
}

// split divides t into the ranges starting below key and the rest.
func (s *freeSpace) split(t *spanNode, key uint64) (lo, hi *spanNode) {
	if t == nil {
		return nil, nil
	}
	if t.start < key {
		t.right, hi = s.split(t.right, key)
		t.fix()
		return t, hi
	}
	lo, t.left = s.split(t.left, key)
	t.fix()
	return lo, t
}

// merge joins two treaps where every key of a is below every key of b.
func (s *freeSpace) merge(a, b *spanNode) *spanNode {
	if a == nil {
		return b
	}
	if b == nil {
		return a
	}
	if a.prio > b.prio {
		a.right = s.merge(a.right, b)
		a.fix()
		return a
	}
	b.left = s.merge(a, b.left)
	b.fix()
	return b
}

// ranges lists the free ranges in address order (for checks and tests).
func (s *freeSpace) ranges() [][2]uint64 {
	out := make([][2]uint64, 0, s.count)
	var walk func(n *spanNode)
	walk = func(n *spanNode) {
		if n == nil {
			return
		}
		walk(n.left)
		out = append(out, [2]uint64{n.start, n.size})
		walk(n.right)
	}
	walk(s.root)
	return out
}
