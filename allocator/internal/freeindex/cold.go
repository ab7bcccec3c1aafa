// This file holds the pool-wide view of the cold shard's free indexes:
// what the walks over every stream's cache (the largest free block, the
// whole free segments, the blocks a release may unmap, lending) read of
// the streams past the allocator's maxShards without visiting each of them.

package freeindex

import (
	"github.com/google/btree"

	"github.com/gpumem/gpumem/device"
)

// coldView indexes, for one pool, the free blocks of the cold shard's
// streams, which may be many (a program with a stream per allocation), so
// that a walk over every stream's cache costs the shards of their own (at
// most the allocator's maxShards) and what it finds among the cold streams, not one visit
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
	Free    *btree.BTreeG[ColdItem]
	Lenders *btree.BTreeG[ColdItem]
	Waited  map[device.Stream]struct{} // the policy's hostWaited; nil without the policy
	Wholes  []*Index
}

// A ColdItem is a cold free block under its key, kept apart from the
// block's fields, which the merge and the split change before the index
// moves the block to its new key.
type ColdItem struct {
	Key Key
	B   *Block
}

// coldLess orders the items by (size, address); addresses are unique
// among the free blocks of a device.
func coldLess(x, y ColdItem) bool {
	return x.Key.size < y.Key.size || x.Key.size == y.Key.size && x.Key.ptr < y.Key.ptr
}

// add files the free block b of a cold index under its key.
func (v *coldView) add(b *Block) {
	if v.Free == nil {
		v.Free = btree.NewG(32, coldLess)
	}
	v.Free.ReplaceOrInsert(ColdItem{KeyOf(b), b})
	if v.Waited != nil {
		if _, ok := v.Waited[b.Stream]; !ok {
			if v.Lenders == nil {
				v.Lenders = btree.NewG(32, coldLess)
			}
			v.Lenders.ReplaceOrInsert(ColdItem{KeyOf(b), b})
		}
	}
}

// drop takes out the free block filed under k.
func (v *coldView) drop(k Key) {
	v.Free.Delete(ColdItem{Key: k})
	v.Unlend(k)
}

// Unlend takes the block filed under k out of the lenders, if it is there.
func (v *coldView) Unlend(k Key) {
	if v.Lenders != nil {
		v.Lenders.Delete(ColdItem{Key: k})
	}
}

// AscendLenders calls f on the cold free blocks that may be lent, of at
// least size bytes, in (size, address) order, until f returns false.
func (v *coldView) AscendLenders(size uint64, f func(*Block) bool) {
	if v.Lenders == nil {
		return
	}
	v.Lenders.AscendGreaterOrEqual(ColdItem{Key: Key{size: size}}, func(it ColdItem) bool { return f(it.B) })
}

// listed notes that the cold index x now has whole free segments, and
// unlisted that it has none.
func (v *coldView) listed(x *Index) {
	v.Wholes = append(v.Wholes, x)
	x.ColdAt = len(v.Wholes)
}

func (v *coldView) unlisted(x *Index) {
	i := x.ColdAt - 1
	last := v.Wholes[len(v.Wholes)-1]
	v.Wholes[i], last.ColdAt = last, i+1
	v.Wholes[len(v.Wholes)-1] = nil
	v.Wholes = v.Wholes[:len(v.Wholes)-1]
	x.ColdAt = 0
}

// AscendAtLeast calls f on the cold free blocks of at least size bytes,
// in (size, address) order, until f returns false.
func (v *coldView) AscendAtLeast(size uint64, f func(*Block) bool) {
	if v.Free == nil {
		return
	}
	v.Free.AscendGreaterOrEqual(ColdItem{Key: Key{size: size}}, func(it ColdItem) bool { return f(it.B) })
}

// Largest returns a largest cold free block, or nil.
func (v *coldView) Largest() *Block {
	if v.Free == nil {
		return nil
	}
	it, _ := v.Free.Max()
	return it.B
}
