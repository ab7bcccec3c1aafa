// This file holds the pool-wide view of the cold shard's free indexes:
// what the walks over every stream's cache (the largest free block, the
// whole free segments, the blocks a release may unmap, lending) read of
// the streams past the allocator's maxShards without visiting each of them.

package freeindex

import (
	"github.com/google/btree"

	"github.com/gpumem/gpumem/device"
)

// ColdView indexes, for one pool, the free blocks of the cold shard's
// streams, which may be many (a program with a stream per allocation), so
// that a walk over every stream's cache costs the shards of their own (at
// most the allocator's maxShards) and what it finds among the cold
// streams, not one visit per cold stream. The cold shard is never fast:
// its free indexes, and this view, change in the world only. The free
// indexes keep it (index.go and walks.go: add, drop, rekey, settle, list,
// unlist; the indexes with a tree alone are exactly the cold shard's).
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
type ColdView struct {
	free    *btree.BTreeG[coldItem]
	lenders *btree.BTreeG[coldItem]
	waited  map[device.Stream]struct{} // the policy's hostWaited; nil without the policy
	wholes  []*Index
}

// A coldItem is a cold free block under its key, kept apart from the
// block's fields, which the merge and the split change before the index
// moves the block to its new key.
type coldItem struct {
	Key Key
	b   *Block
}

// coldLess orders the items by (size, address); addresses are unique
// among the free blocks of a device.
func coldLess(x, y coldItem) bool {
	return x.Key.size < y.Key.size || x.Key.size == y.Key.size && x.Key.ptr < y.Key.ptr
}

// add files the free block b of a cold index under its key.
func (v *ColdView) add(b *Block) {
	if v.free == nil {
		v.free = btree.NewG(32, coldLess)
	}
	v.free.ReplaceOrInsert(coldItem{KeyOf(b), b})
	if v.waited != nil {
		if _, ok := v.waited[b.stream]; !ok {
			if v.lenders == nil {
				v.lenders = btree.NewG(32, coldLess)
			}
			v.lenders.ReplaceOrInsert(coldItem{KeyOf(b), b})
		}
	}
}

// drop takes out the free block filed under k.
func (v *ColdView) drop(k Key) {
	v.free.Delete(coldItem{Key: k})
	v.Unlend(k)
}

// Unlend takes the block filed under k out of the lenders, if it is there.
func (v *ColdView) Unlend(k Key) {
	if v.lenders != nil {
		v.lenders.Delete(coldItem{Key: k})
	}
}

// AscendLenders calls f on the cold free blocks that may be lent, of at
// least size bytes, in (size, address) order, until f returns false.
func (v *ColdView) AscendLenders(size uint64, f func(*Block) bool) {
	if v.lenders == nil {
		return
	}
	v.lenders.AscendGreaterOrEqual(coldItem{Key: Key{size: size}}, func(it coldItem) bool { return f(it.b) })
}

// listed notes that the cold index x now has whole free segments, and
// unlisted that it has none.
func (v *ColdView) listed(x *Index) {
	v.wholes = append(v.wholes, x)
	x.coldAt = len(v.wholes)
}

func (v *ColdView) unlisted(x *Index) {
	i := x.coldAt - 1
	last := v.wholes[len(v.wholes)-1]
	v.wholes[i], last.coldAt = last, i+1
	v.wholes[len(v.wholes)-1] = nil
	v.wholes = v.wholes[:len(v.wholes)-1]
	x.coldAt = 0
}

// AscendAtLeast calls f on the cold free blocks of at least size bytes,
// in (size, address) order, until f returns false.
func (v *ColdView) AscendAtLeast(size uint64, f func(*Block) bool) {
	if v.free == nil {
		return
	}
	v.free.AscendGreaterOrEqual(coldItem{Key: Key{size: size}}, func(it coldItem) bool { return f(it.b) })
}

// Largest returns a largest cold free block, or nil.
func (v *ColdView) Largest() *Block {
	if v.free == nil {
		return nil
	}
	it, _ := v.free.Max()
	return it.b
}

// CheckCold checks the cold view of p against p's cold free indexes,
// which cold calls f on, and reports each fault to bad: with policy (the
// low_fragmentation policy), the view keeps the lenders, the blocks whose
// stream is not in Waited.
func (p *Pool) CheckCold(cold func(f func(*Index)), policy bool, bad func(string, ...any)) {
	n, lenders, wholes := 0, 0, 0
	cold(func(x *Index) {
		x.Each(func(b *Block) bool {
			n++
			if got, ok := p.cold.free.Get(coldItem{Key: KeyOf(b)}); !ok || got.b != b {
				bad("cold free block %v+%d of pool %s is not in its cold view", b.ptr, b.size, p.stat)
			}
			if !policy {
				return true
			}
			_, waited := p.cold.waited[b.stream]
			if !waited {
				lenders++
			}
			var got coldItem
			var ok bool
			if p.cold.lenders != nil {
				got, ok = p.cold.lenders.Get(coldItem{Key: KeyOf(b)})
			}
			if ok == waited || ok && got.b != b {
				bad("cold free block %v+%d of pool %s (stream %d, host-waited %v) is wrongly among the lenders", b.ptr, b.size, p.stat, b.stream, waited)
			}
			return true
		})
		if x.wholes != nil {
			wholes++
			if x.coldAt < 1 || x.coldAt > len(p.cold.wholes) || p.cold.wholes[x.coldAt-1] != x {
				bad("the cold index of stream %d, pool %s, has whole free segments but is not listed", x.stream, p.stat)
			}
		}
	})
	if p.cold.free != nil && p.cold.free.Len() != n {
		bad("the cold view of pool %s holds %d free blocks, the cold indexes %d", p.stat, p.cold.free.Len(), n)
	}
	held := 0
	if p.cold.lenders != nil {
		held = p.cold.lenders.Len()
	}
	if held != lenders || (p.cold.waited != nil) != policy {
		bad("the cold view of pool %s holds %d lenders, there are %d (policy: %v)", p.stat, held, lenders, policy)
	}
	if len(p.cold.wholes) != wholes {
		bad("the cold view of pool %s lists %d indexes with whole segments, there are %d", p.stat, len(p.cold.wholes), wholes)
	}
}

// WholeIndexes returns the cold free indexes that have whole free segments, in
// no order. The caller must not change the slice.
func (v *ColdView) WholeIndexes() []*Index { return v.wholes }

// SetWaited gives the view the low_fragmentation policy's set of streams
// that RecordStream has named (policyState.hostWaited), which never lend:
// the allocator's, which it alone changes, and which the view reads when
// it files a block. Without the policy the view has none and keeps no
// lenders.
func (v *ColdView) SetWaited(waited map[device.Stream]struct{}) { v.waited = waited }
