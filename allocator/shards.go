// This file holds the shards, one per stream, and the locking that lets
// Alloc and Free on different streams run at once: each shard's own
// lock for the common case, every lock ("the world") for the rest.

package allocator

import (
	"cmp"
	"slices"
	"sync"

	"github.com/gpumem/gpumem/device"
)

// A shard is one stream's part of the allocator: the free indexes of its
// blocks in both pools, the address table of its allocated blocks, its
// counts and its spare block structs. A stream's blocks never serve
// another stream, so Alloc and Free on one stream need no other stream's
// state: they run under the shard's lock alone when the shard is "fast"
// (see Allocator.lockAll for the rest).
//
// The shard's fields, and the blocks of its segments, are guarded by mu.
// Holding every lock (the world) also guards them.
type shard struct {
	mu sync.Mutex
	_  [56]byte // the lock's cache line holds nothing else

	id     int // its place in Allocator.byID, for routes
	stream device.Stream
	free   [2]freeIndex         // by pool.idx
	live   ptrTable             // its allocated blocks by address
	st     [numRows]shardCounts // by stats.Metric, then oversizeA and oversizeS
	spare  *block               // recycled block structs, linked through next
	nspare int

	// activeImplied: nothing is pending and the active limits are at least
	// the allocation limits, so an Alloc within its allocation limits is
	// within its active limits (see count).
	activeImplied bool
	// fast: Alloc and Free may run under mu alone: no stream event is
	// pending, garbage collection is off, no observer is attached and no
	// cut waits. Written under the world; read under mu.
	fast bool
	// cut: a change of the shard's counts passed a limit while other
	// shards exist, and its peaks wait for the world (cutsLocked); cutOp
	// is that operation's change. Until then the shard is not fast.
	cut   bool
	cutOp opDelta

	_ [64]byte // keeps the next object's hot fields off the last cache line
}

func (a *Allocator) newShard(s device.Stream) *shard {
	sh := &shard{stream: s}
	if ids := a.byID.Load(); ids != nil {
		sh.id = len(*ids)
	}
	sh.free[0].init(sh, a.small, a.vm != nil)
	sh.free[1].init(sh, a.large, a.vm != nil)
	sh.activeImplied = true
	return sh
}

// lockAll takes the world: the allocator's lock and every shard's, in
// the order of a.shards (by stream). Every method but the fast paths of
// Alloc and Free runs in the world. On the way in it settles the cuts
// that shards left waiting.
//
// Deadlock: a fast path holds one shard lock and takes no other lock
// while holding it, and every taker of more than one lock takes the
// allocator's lock first, so no two goroutines wait for each other.
func (a *Allocator) lockAll() {
	a.mu.Lock()
	for _, sh := range a.shards {
		sh.mu.Lock()
	}
	a.world = true
	a.cutsLocked()
}

// unlockAll leaves the world, deciding first which shards may run their
// Alloc and Free alone.
func (a *Allocator) unlockAll() {
	fast := !a.gcActive && a.events.Len() == 0 && len(a.observers) == 0
	for _, sh := range a.shards {
		sh.fast = fast && !sh.cut
	}
	a.world = false
	for _, sh := range a.shards {
		sh.mu.Unlock()
	}
	a.mu.Unlock()
}

// cutsLocked settles the peaks that shards left waiting: their
// operations passed a limit while they ran under their lock alone. With
// every lock held, it counts those operations one after another, in the
// order of the shards, from the state before any of them: each
// quantity's total over the shards after each raises its peak if it
// passes it. Then the limits are handed out anew (exceed).
//
// The order the stats follow: every Alloc and Free counts at the moment
// it holds its shard's lock, or the world, except one whose counts passed
// a limit, which counts at the cut that settles it, a moment before it
// returns. No other operation can see its work before then: its shard is
// not fast until the cut, so the next operation on it takes the world,
// which settles the cut first. Operations waiting for one cut overlap in
// time, so any order among them is one they could have happened in.
// Between two moments of the world, the shards' changes stay within their
// limits, whose sum is at most the peak, so every interleaving of them
// stays at or below the peak, and the peaks are those of this order
// exactly.
func (a *Allocator) cutsLocked() {
	var waiting []*shard
	for _, sh := range a.shards {
		if sh.cut {
			waiting = append(waiting, sh)
		}
	}
	if len(waiting) == 0 {
		return
	}
	for row := range numRows {
		for k := range numQ {
			var total int64
			for _, sh := range a.shards {
				total += sh.value(row, k)
			}
			for _, sh := range waiting {
				total -= sh.cutOp.of(row, k) // the state before the waiting operations
			}
			peak := &a.gst.peak[row][k]
			for _, sh := range waiting {
				if d := sh.cutOp.of(row, k); d > 0 {
					total += d
					*peak = max(*peak, total)
				} else {
					total += d
				}
			}
		}
	}
	for _, sh := range waiting {
		sh.cut = false
		for row := range numRows {
			for k := range numQ {
				if sh.value(row, k) > *sh.limit(row, k) {
					a.exceed(sh, row, k)
				}
			}
		}
		sh.refreshImplied()
	}
}

// settleCut takes and leaves the world to settle a cut that sh left
// waiting (unless another world operation settled it first).
func (a *Allocator) settleCut() {
	a.lockAll()
	a.unlockAll()
}

// streamShard is an entry of Allocator.byStream: the stream is copied
// next to its shard, so that a lookup reads no shard's memory (another
// goroutine's lock words share lines with a shard's first fields).
type streamShard struct {
	stream device.Stream
	sh     *shard
}

// lookupShard returns the shard of stream s without a lock, or nil if s
// has none yet.
func (a *Allocator) lookupShard(s device.Stream) *shard {
	for _, e := range *a.byStream.Load() {
		if e.stream == s {
			return e.sh
		}
	}
	return nil
}

// shardLocked returns the shard of stream s, or nil if s is not a stream
// of the device; it runs in the world. The default stream always is one;
// others are asked of the device once, when it can tell
// (device.StreamChecker), and get a shard the first time they are used:
// locked, as the world holds every shard's lock.
func (a *Allocator) shardLocked(s device.Stream) *shard {
	if s == device.DefaultStream {
		return a.def
	}
	if sh := a.lookupShard(s); sh != nil {
		return sh
	}
	if !a.knownStreamLocked(s) {
		return nil
	}
	sh := a.newShard(s)
	sh.mu.Lock()
	i, _ := slices.BinarySearchFunc(a.shards, s, func(x *shard, s device.Stream) int {
		return cmp.Compare(x.stream, s)
	})
	a.shards = slices.Insert(slices.Clip(a.shards), i, sh)
	ids := append(slices.Clip(*a.byID.Load()), sh)
	a.byID.Store(&ids)
	a.byStream.Store(streamList(a.shards))
	if len(a.shards) == 2 {
		// From now on Free needs routes, and the peaks need cuts.
		a.single.Store(nil)
		a.startRoutesLocked()
	}
	return sh
}

// streamList returns the lock-free list of shards by stream.
func streamList(shards []*shard) *[]streamShard {
	list := make([]streamShard, len(shards))
	for i, sh := range shards {
		list[i] = streamShard{sh.stream, sh}
	}
	return &list
}

// startRoutesLocked fills the routes with every segment's memory, when a
// second shard appears. (The limits need no change then: the first
// shard's are the peaks, the new shard's are zero, as its counts are.)
func (a *Allocator) startRoutesLocked() {
	a.routes.on = true
	a.routes.owners = make(map[uint64]chunkOwners)
	for _, seg := range a.segments {
		if !seg.expandable() {
			a.routes.add(seg.ptr, seg.size, seg.free.sh, +1)
			continue
		}
		seg.mappedRuns(func(p device.Ptr, n uint64) { a.routePagesLocked(seg, p, n, +1) })
	}
	a.routes.rebuild()
}

// liveBlockLocked returns the allocated block at p and its shard, or nil;
// it runs in the world.
func (a *Allocator) liveBlockLocked(p device.Ptr) (*block, *shard) {
	if id, ok := a.routes.lookup(p); ok {
		if sh := (*a.byID.Load())[id]; sh.live.get(p) != nil {
			return sh.live.get(p), sh
		}
	}
	for _, sh := range a.shards {
		if b := sh.live.get(p); b != nil {
			return b, sh
		}
	}
	return nil, nil
}

// liveCountLocked returns the number of allocated blocks.
func (a *Allocator) liveCountLocked() int {
	n := 0
	for _, sh := range a.shards {
		n += sh.live.len()
	}
	return n
}
