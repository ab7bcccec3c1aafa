// This file holds the structural check of freeTree, for the invariant
// checker.

package freeindex

// check verifies the tree's structure and returns a description of the
// first fault found, or "".
func (t *freeTree) check() string {
	if t.height == 0 {
		if t.root != nil {
			return "a one-leaf tree has an inner root"
		}
		if t.leaf == nil {
			if t.n != 0 || t.first != nil || t.last != nil {
				return "an empty tree has blocks or leaves"
			}
			return ""
		}
		if t.first != t.leaf || t.last != t.leaf || t.leaf.prev != nil || t.leaf.next != nil {
			return "a one-leaf tree's leaf links are wrong"
		}
		return checkLeafKeys(t.leaf, nil, nil)
	}
	if t.root == nil || t.leaf != nil {
		return "a tree of inner levels has no root"
	}
	var leaves []*treeLeaf
	if msg := t.checkInner(t.root, 1, nil, nil, &leaves); msg != "" {
		return msg
	}
	count := 0
	var prev *treeLeaf
	for i, l := range leaves {
		if l.prev != prev || (i == 0) != (t.first == l) {
			return "the leaves are not linked in order"
		}
		if prev != nil && prev.next != l {
			return "the leaves are not linked in order"
		}
		prev = l
		count += l.n
	}
	if prev != t.last || prev.next != nil {
		return "the last leaf is wrong"
	}
	if count != t.n {
		return "the block count is wrong"
	}
	return ""
}

func (t *freeTree) checkInner(n *treeInner, depth int, lo, hi *Key, leaves *[]*treeLeaf) string {
	if n.n < 2 || n.n > treeOrder || (n != t.root && n.n < treeMinFill) {
		return "an inner node has too few or too many children"
	}
	for i := 0; i < n.n; i++ {
		clo, chi := lo, hi
		if i > 0 {
			clo = &n.keys[i-1]
		}
		if i < n.n-1 {
			chi = &n.keys[i]
		}
		if i > 0 && i < n.n-1 && !n.keys[i-1].less(n.keys[i]) {
			return "inner separators out of order"
		}
		if depth == t.height {
			l := n.leaves[i]
			if l == nil || n.inner[i] != nil {
				return "a lowest inner node lacks a leaf"
			}
			if l.n < treeMinFill {
				return "a leaf is underfull"
			}
			if msg := checkLeafKeys(l, clo, chi); msg != "" {
				return msg
			}
			*leaves = append(*leaves, l)
			continue
		}
		if n.inner[i] == nil || n.leaves[i] != nil {
			return "an inner node lacks a child"
		}
		if msg := t.checkInner(n.inner[i], depth+1, clo, chi, leaves); msg != "" {
			return msg
		}
	}
	return ""
}

func checkLeafKeys(l *treeLeaf, lo, hi *Key) string {
	if l.n == 0 || l.n > treeOrder {
		return "a leaf is empty or overfull"
	}
	for i := 0; i < l.n; i++ {
		k := l.keys[i]
		if b := l.vals[i]; b == nil || KeyOf(b) != k {
			return "a leaf key does not match its block"
		}
		if i > 0 && !l.keys[i-1].less(k) {
			return "leaf keys out of order"
		}
		if lo != nil && k.less(*lo) || hi != nil && !k.less(*hi) {
			return "a leaf key lies outside its separators"
		}
	}
	for i := l.n; i < treeOrder; i++ {
		if l.vals[i] != nil {
			return "a leaf keeps a block past its end"
		}
	}
	return ""
}
