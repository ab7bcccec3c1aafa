// This file holds routes, the lock-free map from device addresses to the
// shard that owns them, which Free reads before taking any lock.

package allocator

import (
	"sync/atomic"

	"github.com/gpumem/gpumem/allocator/internal/freeindex"
	"github.com/gpumem/gpumem/device"
)

// routes maps each 2 MiB chunk of device addresses that holds memory of a
// segment (a plain segment, or a mapped page of an expandable one) to the
// shard of that segment's stream, so that Free can lock the one shard
// that holds a block. It is kept only while the allocator has more than
// one shard (with one, every block is the default stream's).
//
// A chunk can hold memory of two segments (they need not be 2 MiB
// aligned); when those belong to different shards the chunk maps to
// neither ("ambiguous") and Free takes every lock instead. A lookup that
// finds nothing does the same, so routes is a map that may say "ask
// everyone", never one that names the wrong shard: Free checks the
// shard's address table anyway.
//
// Writers hold every lock (Allocator.lockAll). Readers hold none: the
// table's slots are atomic words, and a table that grows is replaced
// whole (atomic pointer), the old one left to the readers that still use
// it. A reader looks up the address of a block it allocated, whose chunk
// was registered before that allocation, hence before the lookup: what
// it reads is current for that chunk.
type routes struct {
	on     bool                     // kept up to date (more than one shard)
	tab    atomic.Pointer[routeTab] // the lock-free table
	owners map[uint64]chunkOwners   // by chunk: the shards with memory there
}

const (
	chunkShift   = 21        // a chunk is 2 MiB of addresses
	routeVal     = 20        // bits of a slot's value: a shard's id + 1
	routeNone    = 1         // the value of a deleted slot (its key is 0)
	routeAmbig   = 1<<20 - 1 // the value of a chunk of two shards
	routeMinSize = 64
)

// chunkOwners counts the segments of at most two shards in one chunk (a
// segment is at least 2 MiB, so at most two reach into a chunk).
type chunkOwners struct {
	id [2]uint32 // shard id + 1; 0: none
	n  [2]int32  // segments (or mapped ranges) of that shard in the chunk
}

// routeTab is an open-addressing table of slots (chunk+1)<<routeVal |
// value, with linear probing; a deleted slot keeps probe runs intact.
type routeTab struct {
	slots []atomic.Uint64
	mask  uint64
	shift uint8
	used  int // slots not empty: entries and deleted slots
}

func newRouteTab(size int) *routeTab {
	t := &routeTab{slots: make([]atomic.Uint64, size), mask: uint64(size - 1)}
	t.shift = freeindex.TableShift(size)
	return t
}

func (t *routeTab) home(chunk uint64) uint64 { return freeindex.FibHash(chunk, t.shift) }

// lookup returns the id of the shard that owns the chunk of p, and true;
// false when no shard or two do.
func (r *routes) lookup(p device.Ptr) (uint32, bool) {
	t := r.tab.Load()
	if t == nil {
		return 0, false
	}
	key := uint64(p)>>chunkShift + 1
	for i := t.home(key); ; i = (i + 1) & t.mask {
		w := t.slots[i].Load()
		switch {
		case w == 0:
			return 0, false
		case w>>routeVal == key:
			v := uint32(w & (1<<routeVal - 1))
			return v - 1, v != routeAmbig
		}
	}
}

// set stores the value of chunk (0 deletes it), growing the table when
// more than half of its slots are used.
func (r *routes) set(chunk uint64, v uint32) {
	t := r.tab.Load()
	if t == nil || v != 0 && 2*(t.used+1) > len(t.slots) {
		t = r.rebuild()
	}
	key := chunk + 1
	free := -1
	for i := t.home(key); ; i = (i + 1) & t.mask {
		w := t.slots[i].Load()
		if w>>routeVal == key {
			if v == 0 {
				t.slots[i].Store(routeNone)
			} else {
				t.slots[i].Store(key<<routeVal | uint64(v))
			}
			return
		}
		if w == routeNone && free < 0 {
			free = int(i)
		}
		if w == 0 {
			if v == 0 {
				return
			}
			if free < 0 {
				free = int(i)
				t.used++
			}
			t.slots[free].Store(key<<routeVal | uint64(v))
			return
		}
	}
}

// rebuild publishes a new table holding every chunk of owners, large
// enough to stay at most half full, and returns it.
func (r *routes) rebuild() *routeTab {
	size := routeMinSize
	for size < 4*(len(r.owners)+1) {
		size *= 2
	}
	t := newRouteTab(size)
	for chunk, o := range r.owners {
		key := chunk + 1
		i := t.home(key)
		for t.slots[i].Load() != 0 {
			i = (i + 1) & t.mask
		}
		t.slots[i].Store(key<<routeVal | uint64(o.value()))
		t.used++
	}
	r.tab.Store(t)
	return t
}

// value is the slot value of a chunk with these owners.
func (o chunkOwners) value() uint32 {
	switch {
	case o.id[0] != 0 && o.id[1] != 0:
		return routeAmbig
	case o.id[0] != 0:
		return o.id[0]
	}
	return o.id[1]
}

// add registers the n bytes at p, a unit of memory of shard sh (a plain
// segment, or one page of an expandable segment), with change +1, or
// unregisters them with change -1. A unit is unregistered as it was
// registered, so that each chunk counts the units that reach into it.
func (r *routes) add(p device.Ptr, n uint64, sh *shard, change int32) {
	if !r.on || n == 0 {
		return
	}
	id := uint32(min(sh.id+1, routeAmbig)) // past routeMaxID shards, chunks are ambiguous
	for c := uint64(p) >> chunkShift; c <= (uint64(p)+n-1)>>chunkShift; c++ {
		o := r.owners[c]
		j := 0
		switch {
		case o.id[0] == id:
		case o.id[1] == id:
			j = 1
		case o.id[0] == 0:
			o.id[0] = id
		default:
			// A unit is at least 2 MiB, so at most two units, and two
			// shards, reach into a chunk.
			j = 1
			o.id[1] = id
		}
		o.n[j] += change
		if o.n[j] <= 0 {
			o.id[j], o.n[j] = 0, 0
		}
		if o.id[0] == 0 && o.id[1] == 0 {
			delete(r.owners, c)
			r.set(c, 0)
			continue
		}
		r.owners[c] = o
		r.set(c, o.value())
	}
}
