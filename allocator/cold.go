// This file holds the pool-wide view of the cold shard's free indexes:
// what the walks over every stream's cache (the largest free block, the
// whole free segments, the blocks a release may unmap, lending) read of
// the streams past maxShards without visiting each of them.

package allocator

import (
	"github.com/google/btree"

	"github.com/gpumem/gpumem/device"
)

// coldView indexes, for one pool, the free blocks of the cold shard's
// streams, which may be many (a program with a stream per allocation), so
// that a walk over every stream's cache costs the shards of their own (at
// most maxShards) and what it finds among the cold streams, not one visit
// per cold stream. The cold shard is never fast: its free indexes, and
// this view, change in the world only. The free indexes keep it (index.go:
// add, drop, rekey, settle, list, unlist; the indexes with a tree alone
// are exactly the cold shard's).
//
// Under the low_fragmentation policy, lenders holds the blocks of free
// that lending may take: those of the streams that RecordStream has not
// named (policyState.hostWaited), which never lend.
//
// Invariants: free holds exactly the free blocks of the pool's cold free
// indexes, each under the key its index files it under; lenders, under
// the policy, exactly those of them whose stream is not host-waited (nil
// otherwise); wholes holds exactly the cold free indexes whose list of
// whole free segments is not empty, each x at x.coldAt-1.
type coldView struct {
	free    *btree.BTreeG[coldItem]
	lenders *btree.BTreeG[coldItem]
	waited  map[device.Stream]struct{} // the policy's hostWaited; nil without the policy
	wholes  []*freeIndex
}

// A coldItem is a cold free block under its key, kept apart from the
// block's fields, which the merge and the split change before the index
// moves the block to its new key.
type coldItem struct {
	key treeKey
	b   *block
}

// coldLess orders the items by (size, address); addresses are unique
// among the free blocks of a device.
func coldLess(x, y coldItem) bool {
	return x.key.size < y.key.size || x.key.size == y.key.size && x.key.ptr < y.key.ptr
}

// add files the free block b of a cold index under its key.
func (v *coldView) add(b *block) {
	if v.free == nil {
		v.free = btree.NewG(32, coldLess)
	}
	v.free.ReplaceOrInsert(coldItem{keyOf(b), b})
	if v.waited != nil {
		if _, ok := v.waited[b.stream]; !ok {
			if v.lenders == nil {
				v.lenders = btree.NewG(32, coldLess)
			}
			v.lenders.ReplaceOrInsert(coldItem{keyOf(b), b})
		}
	}
}

// drop takes out the free block filed under k.
func (v *coldView) drop(k treeKey) {
	v.free.Delete(coldItem{key: k})
	v.unlend(k)
}

// unlend takes the block filed under k out of the lenders, if it is there.
func (v *coldView) unlend(k treeKey) {
	if v.lenders != nil {
		v.lenders.Delete(coldItem{key: k})
	}
}

// ascendLenders calls f on the cold free blocks that may be lent, of at
// least size bytes, in (size, address) order, until f returns false.
func (v *coldView) ascendLenders(size uint64, f func(*block) bool) {
	if v.lenders == nil {
		return
	}
	v.lenders.AscendGreaterOrEqual(coldItem{key: treeKey{size: size}}, func(it coldItem) bool { return f(it.b) })
}

// listed notes that the cold index x now has whole free segments, and
// unlisted that it has none.
func (v *coldView) listed(x *freeIndex) {
	v.wholes = append(v.wholes, x)
	x.coldAt = len(v.wholes)
}

func (v *coldView) unlisted(x *freeIndex) {
	i := x.coldAt - 1
	last := v.wholes[len(v.wholes)-1]
	v.wholes[i], last.coldAt = last, i+1
	v.wholes[len(v.wholes)-1] = nil
	v.wholes = v.wholes[:len(v.wholes)-1]
	x.coldAt = 0
}

// ascendAtLeast calls f on the cold free blocks of at least size bytes,
// in (size, address) order, until f returns false.
func (v *coldView) ascendAtLeast(size uint64, f func(*block) bool) {
	if v.free == nil {
		return
	}
	v.free.AscendGreaterOrEqual(coldItem{key: treeKey{size: size}}, func(it coldItem) bool { return f(it.b) })
}

// largest returns a largest cold free block, or nil.
func (v *coldView) largest() *block {
	if v.free == nil {
		return nil
	}
	it, _ := v.free.Max()
	return it.b
}
