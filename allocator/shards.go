// This file holds the shards, one per stream, and the locking that lets
// Alloc and Free on different streams run at once: each shard's own
// lock for the common case, every lock ("the world") for the rest; and
// the lookup of a pointer's block and shard.

package allocator

import (
	"cmp"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/gpumem/gpumem/allocator/internal/freeindex"
	"github.com/gpumem/gpumem/device"
)

// A shard is one stream's part of the allocator: the free indexes of its
// blocks in both pools, the address table of its allocated blocks, its
// counts (per phase too, phases.go) and its spare block structs. A
// stream's blocks serve no other stream (but lent by the
// low_fragmentation policy, in the world), so Alloc and Free on one
// stream need no other stream's state: they run under the shard's lock
// alone when the shard is "fast" (see Allocator.lockAll for the rest).
//
// The default stream and the first maxShards-1 other streams the
// allocator uses get shards of their own; the streams after them share
// one more, the cold shard, which is never fast: their operations take
// the world, which then costs the same however many streams there are.
// The cold shard's free indexes are per stream (Allocator.coldIdx), its
// address table, counts and spares shared.
//
// The shard's fields, and the blocks of its segments, are guarded by mu.
// Holding the world also guards them: the world holds mu of every fast
// shard, and a shard that is not fast is touched in the world only.
type shard struct {
	mu sync.Mutex
	_  [56]byte // the lock's cache line holds nothing else

	id         int // its place in Allocator.byID, for routes
	stream     device.Stream
	cold       bool                 // the cold shard: its free is unused, its streams' indexes are in Allocator.coldIdx
	hostWaited bool                 // the policy's: RecordStream named its stream (policyState.hostWaited), so it neither lends nor borrows
	free       [2]freeindex.Index   // by freeindex.Pool.Idx
	live       freeindex.PtrTable   // its allocated blocks by address
	st         [numRows]shardCounts // by stats.Metric, then oversizeA and oversizeS
	ph         []phaseCount         // by phase id, while blocks are counted by phase; grown on use
	spare      freeindex.Spares     // recycled block structs
	steps      stepLog              // live blocks at the last step boundary, and the changes since (steps.go)

	// activeImplied: nothing is pending and the active limits are at least
	// the allocation limits, so an Alloc within its allocation limits is
	// within its active limits (see count).
	activeImplied bool
	// impliedOff: activeImplied is false as refreshImplied found it, and
	// no limit has changed since (every writer that clears activeImplied
	// clears it too), nor has anything pending ended (finishFreeLocked
	// refreshes): the world as it leaves need not look again.
	impliedOff bool
	// credit is the held front whose free (freeHeldLocked) was the last
	// change of the small pool's counts, creditReq its requested bytes
	// then, and creditLarge the large pool's rises then (largeRises); the
	// world clears it (it may set limits, the phase, or the observers),
	// and the free leaves none when the front's phase is not the current
	// one or observers listen. Its hand-out again (retakeLocked) for at
	// most creditReq bytes, with no rise of the large pool since (and so
	// in the front's phase, the current one still), brings every count it
	// changes back to at most its value before that free, which was
	// within its limits, so it tests no limit. (Any other change of the small pool merges the
	// held front back first: freeindex.Index.Retake.) creditSplit is the
	// change of inactive_split_bytes that the free counted: the rest's
	// bytes, negated, when the segment became whole, else the front's.
	credit      *freeindex.Block
	creditReq   uint64
	creditSplit int64
	creditLarge int64
	// fast: Alloc and Free may run under mu alone: the world found them
	// able to (fastLocked: no stream event pending, or settled with
	// several shards, garbage collection off, the policy off or this the
	// only shard, no observer attached),
	// no cut waits, and the shard is not the cold one. Set by the world
	// as it leaves, cleared by the world or by the fast path that leaves
	// a cut, as its last write before unlocking; read under mu (lockAll
	// reads it to know which locks to take), and before it by Alloc and
	// Free, which take the world without mu where it is false (the world
	// serves any shard: one made fast since the read loses only its fast
	// path, once). Atomic: the world may change it without the lock of a
	// shard that is not fast (see lockAll).
	fast atomic.Bool
	// cut: a change of the shard's counts passed a limit while other
	// shards exist, and its peaks wait for the world (cutsLocked); cutOp
	// is that operation's change, cutRows and cutK the rows it passed a
	// limit of and its pool (exceedRows' arguments). Until then the shard
	// is not fast.
	cut     bool
	cutRows uint32
	cutK    int
	cutOp   opDelta

	// Named pools (pools.go), changed in the world: pool is the named
	// pool whose blocks the shard keeps (nil for the default pool's
	// shards); idle marks a shard of a pool gone, kept for the next pool
	// shard; slow keeps the shard from running alone: every shard of a
	// pool, idle ones too, and the default pool's shard of a stream routed
	// to a pool (see Allocator.routesChangedLocked).
	pool *Pool
	idle bool
	slow bool

	_ [64]byte // keeps the next object's hot fields off the last cache line
}

// maxShards bounds the shards: streams of their own, the default
// stream's included, before the cold shard. The world takes the lock of
// every fast shard, so its cost grows with them.
const maxShards = 32

// settleExits is how many times the world leaves with no stream event
// pending, after it left with some, before it makes shards fast again
// while there are several (Allocator.settling, fastLocked). On the
// 10-stream offload trace 8 saved little (1,436 instructions an op
// against 1,498), 64 and 256 nearly all (1,243 and 1,246).
const settleExits = 64

func (a *Allocator) newShard(s device.Stream) *shard {
	sh := &shard{stream: s, hostWaited: a.pol != nil && a.pol.hostWaitedLocked(s)}
	if ids := a.byID.Load(); ids != nil {
		sh.id = len(*ids)
	}
	// Size buckets for the small pool of PyTorch's plain segments; large
	// buckets for the other pools: expandable segments, whose small-pool
	// blocks can be larger than 2 MiB, and the policy, which reads the
	// small pool's ages too.
	small := freeindex.KindLarge
	if a.vm == nil && a.pol == nil {
		small = freeindex.KindSmall
	}
	sh.free[0].Init(sh.id, &sh.spare, s, a.small, small)
	sh.free[1].Init(sh.id, &sh.spare, s, a.large, freeindex.KindLarge)
	sh.free[0].SetTable(&sh.live)
	sh.free[1].SetTable(&sh.live)
	sh.free[0].Merged = a.onePoolLocked()
	// Classes in pages, not the hash table, where blocks split and merge
	// with almost every operation: the index of the small requests when
	// it is of large buckets, and the policy's large pool.
	if small == freeindex.KindLarge && !sh.free[0].Merged {
		sh.free[0].KeepPages()
	}
	if sh.free[0].Merged || a.pol != nil {
		sh.free[1].KeepPages()
	}
	sh.activeImplied = true
	return sh
}

// fastLocked reports whether the shards may run Alloc and Free alone
// now: no stream event is pending, no observer is attached, and neither
// garbage collection nor the low_fragmentation policy looks at other
// streams' blocks: garbage collection ages the blocks of every stream on
// each search, the policy lends and ages them too, unless the default
// stream's shard is the only one (a hit then touches that shard and its
// pools' clocks alone, and a miss takes the world anyway).
//
// With several shards, the events must also have settled: the world has
// left settleExits times with none pending since it last left with some
// (Allocator.settling). A program whose events come and go every few
// operations (frees recorded on other streams, then a synchronize) would
// otherwise make every shard fast at each synchronize, and slow again at
// the next recorded free a few operations later: the world's entry and
// exit then take and let go of every shard's lock, and a shard that ran
// alone under the serial peaks (no room: peaks.Table.Serial) leaves a cut
// at nearly every Alloc. On the 10-stream offload trace that cost 255
// instructions an op (scripts/callgrind.sh offload: 1,498 against 1,243
// with the window, 1,232 with no shard ever fast); a program whose events
// stop pays settleExits operations in the world once.
func (a *Allocator) fastLocked() bool {
	if a.gcActive || a.events.Len() != 0 || len(a.observers) != 0 {
		return false
	}
	return len(a.shards) == 1 || a.pol == nil && a.settling == 0
}

// lockAll takes the world: the allocator's own lock (Allocator.mu), then
// the lock of every shard that is fast, in the order of a.shards (by stream, then
// the cold shard, then the named pools' shards, which are never fast). Every method but the fast paths of Alloc and Free runs in the
// world. On the way in it settles the cuts that shards left waiting.
//
// A shard that is not fast needs no lock: no fast path runs on it (a
// fast path runs only under the lock of a shard it finds fast), and it
// becomes fast only when the world leaves. Its last fast path, if any,
// cleared fast as its last write (a cut), or the world cleared it, so
// the world that finds it not fast sees all that path did (the atomic
// load follows the store). The world's cost is then that of the shards
// that can run alone: with events pending, garbage collection, the
// policy with several shards, or observers, no shard is fast and the
// world is one lock.
//
// A shard found fast may have left fast while lockAll waited for its
// lock (a fast path that left a cut clears fast, unlocks, and then waits
// for the world itself): lockAll lets its lock go again. So in the world
// the shards whose locks it holds are exactly the fast ones, and
// unlockAll, which reads every shard's fast flag anyway, needs no list of
// them.
//
// Deadlock: a fast path holds one shard lock and takes no other lock
// while holding it, and every taker of more than one lock takes
// Allocator.mu first, so no two goroutines wait for each other.
//
// Alloc's, Free's and RecordStream's ways into the world take
// Allocator.mu and call enter themselves, which is inlined there (lockAll,
// with the lock, is over the compiler's budget for inlining): 11
// instructions an op fewer on the 10-stream offload replay, where every
// operation takes the world.
func (a *Allocator) lockAll() {
	a.mu.Lock()
	a.enter()
}

// enter is lockAll after Allocator.mu is taken: with no shard fast and no
// cut waiting, the world is that lock.
func (a *Allocator) enter() {
	if a.anyFast || a.cutWaiting.Load() {
		a.lockShards()
		return
	}
	a.world = true
}

// lockShards is the rest of lockAll, under Allocator.mu, where a shard is
// fast or a cut waits.
func (a *Allocator) lockShards() {
	if a.anyFast {
		for _, sh := range a.shards {
			if sh.fast.Load() {
				sh.mu.Lock()
				if !sh.fast.Load() { // it left a cut while we waited
					sh.mu.Unlock()
				}
			}
		}
	}
	a.world = true
	if a.cutWaiting.Load() {
		a.cutsLocked()
	}
}

// unlockAll leaves the world, deciding first which shards may run their
// Alloc and Free alone. Everything the fast paths read is written before
// a shard is made fast: that store publishes it.
//
// With no shard fast as it comes (anyFast false) and none to make fast,
// it has no shard to look at: the common case while stream events are
// pending, when every operation takes the world. Otherwise it lets go of
// each shard's lock as it leaves the shard: the world holds the lock of
// the shards that were fast (lockAll), and a fast path that then starts
// on a shard touches that shard alone.
//
// Its common case, stream events pending with several shards and none
// fast, comes first (7 instructions an op fewer on the 10-stream offload
// replay).
func (a *Allocator) unlockAll() {
	if a.events.Len() > 0 && !a.anyFast && len(a.shards) > 1 {
		a.settling = settleExits // no shard becomes fast (fastLocked)
		a.world = false
		a.mu.Unlock()
		return
	}
	if a.events.Len() > 0 {
		if len(a.shards) > 1 {
			a.settling = settleExits
		}
	} else if a.settling > 0 {
		a.settling--
	}
	fast := a.fastLocked()
	a.world = false
	if fast || a.anyFast {
		any := false
		for _, sh := range a.shards {
			want := fast && !sh.cut && !sh.cold && !sh.slow
			if want {
				sh.credit = nil // the world may have set limits
				if !sh.activeImplied && !sh.impliedOff {
					sh.refreshImplied() // a limit set by the peaks may have cleared it (shardParts.SetLimit)
				}
			}
			was := sh.fast.Load()
			if was != want {
				sh.fast.Store(want)
			}
			if was {
				sh.mu.Unlock()
			}
			any = any || want
		}
		a.anyFast = any
	}
	a.mu.Unlock()
}

// Cuts. An Alloc or Free that runs under its shard's lock alone while
// other shards exist, and whose counts pass one of the shard's limits,
// cannot reach the other shards' counts: it marks a cut (shard.cut, its
// change in shard.cutOp) and clears fast, and then takes the world
// (settleCut), whose lockAll settles every waiting cut first
// (cutsLocked, in the ledger): with every lock held, the peaks' Cut counts
// those operations one after another, in the order of the shards, from
// the state before any of them, and hands out new limits.
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
// exactly (the peaks package).

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

// streamTable is Allocator.byStream, the lock-free copy of the shards of
// their own: every one in list, sorted by stream, and in slot, a table
// direct-mapped by a hash of the stream (streamSlot), each shard at its
// stream's slot unless a shard before it in list took the slot. With a
// few streams, every stream is found in its slot; the others by a binary
// search of list. It is never changed once published: the world stores
// a new one.
type streamTable struct {
	slot [streamSlots]streamShard
	list []streamShard
}

// streamSlots is the size of streamTable.slot: twice maxShards, so that
// the streams of a program's first shards seldom share a slot.
const streamSlots = 64

// streamSlot returns stream s's slot in a streamTable: the top bits of s
// times the golden ratio (Fibonacci hashing), which spreads the small
// integers of the simulated device and the aligned addresses of CUDA's
// stream handles alike.
func streamSlot(s device.Stream) int {
	return int(uint64(s) * 0x9e3779b97f4a7c15 >> (64 - 6))
}

// lookupShard returns the shard of its own of stream s without a lock,
// or nil if s has none: its slot in the lock-free table, else a binary
// search of its list.
func (a *Allocator) lookupShard(s device.Stream) *shard {
	if sh := a.slotShard(s); sh != nil {
		return sh
	}
	if t := a.byStream.Load(); t != nil { // nil: the zero Allocator
		return t.lookup(s)
	}
	return nil
}

// slotShard returns the shard of stream s if s holds its slot of the
// lock-free table, else nil. Small enough to be inlined into Alloc, which
// calls lookupShard when it finds nil.
func (a *Allocator) slotShard(s device.Stream) *shard {
	if t := a.byStream.Load(); t != nil {
		if e := &t.slot[streamSlot(s)]; e.stream == s {
			return e.sh // nil in an empty slot: stream 0's, which has no shard if it is not there
		}
	}
	return nil
}

// lookup returns the shard of stream s in t's list, or nil: a binary
// search, for the streams that found their slot taken.
func (t *streamTable) lookup(s device.Stream) *shard {
	list := t.list
	lo, hi := 0, len(list)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if list[m].stream < s {
			lo = m + 1
		} else {
			hi = m
		}
	}
	if lo < len(list) && list[lo].stream == s {
		return list[lo].sh
	}
	return nil
}

// indexesLocked returns the free indexes (by pool) of stream s, or nil if
// s is not a stream of the device; it runs in the world. The default
// stream always is one; others are asked of the device once, when it can
// tell (device.StreamChecker), and get their indexes the first time they
// allocate: a shard of their own while there are fewer than maxShards,
// else a place in the cold shard. A new shard is not fast: the world
// needs no lock of it.
func (a *Allocator) indexesLocked(s device.Stream) *[2]freeindex.Index {
	if s == device.DefaultStream {
		return &a.def.free
	}
	if xs := a.streamIndexesLocked(s); xs != nil {
		return xs
	}
	if !a.knownStreamLocked(s) {
		return nil
	}
	delete(a.streams, s) // known by its indexes from now on
	if a.cold == nil && a.ownShardsLocked() < maxShards {
		return &a.addShardLocked(s).free
	}
	if a.cold == nil {
		a.cold = &shard{id: len(*a.byID.Load()), cold: true, activeImplied: true}
		a.coldIdx = make(map[device.Stream]*[2]freeindex.Index)
		a.shards = slices.Insert(slices.Clip(a.shards), len(a.shards)-a.poolShards, a.cold)
		ids := append(slices.Clip(*a.byID.Load()), a.cold)
		a.byID.Store(&ids)
	}
	xs := new([2]freeindex.Index)
	xs[0].Init(a.cold.id, &a.cold.spare, s, a.small, freeindex.KindTree)
	xs[1].Init(a.cold.id, &a.cold.spare, s, a.large, freeindex.KindTree)
	xs[0].Merged = a.onePoolLocked()
	a.coldIdx[s] = xs
	return xs
}

// streamIndexesLocked returns the free indexes of stream s if it has
// them, else nil.
func (a *Allocator) streamIndexesLocked(s device.Stream) *[2]freeindex.Index {
	if sh := a.lookupShard(s); sh != nil {
		return &sh.free
	}
	return a.coldIdx[s]
}

// addShardLocked makes a shard of its own for stream s and files it.
func (a *Allocator) addShardLocked(s device.Stream) *shard {
	sh := a.newShard(s)
	i, _ := slices.BinarySearchFunc(a.shards[:a.ownShardsLocked()], s, func(x *shard, s device.Stream) int {
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
	if len(a.route) > 0 {
		a.routesChangedLocked()
	}
	return sh
}

// ownShardsLocked returns how many of a.shards are the default pool's
// shards of their own: they come first, by stream; then the cold shard,
// if any; then the named pools' shards (pools.go), in the order they came.
func (a *Allocator) ownShardsLocked() int {
	n := len(a.shards) - a.poolShards
	if a.cold != nil {
		n--
	}
	return n
}

// streamList returns the lock-free table of the shards of their own.
func streamList(shards []*shard) *streamTable {
	t := &streamTable{list: make([]streamShard, 0, len(shards))}
	for _, sh := range shards {
		if !sh.cold && sh.pool == nil && !sh.idle {
			e := streamShard{sh.stream, sh}
			t.list = append(t.list, e)
			if slot := &t.slot[streamSlot(sh.stream)]; slot.sh == nil {
				*slot = e
			}
		}
	}
	return t
}

// startRoutesLocked fills the routes with every segment's memory, when a
// second shard appears. (The limits need no change then: the first
// shard's are the peaks, the new shard's are zero, as its counts are.)
func (a *Allocator) startRoutesLocked() {
	a.routes.start()
	for _, seg := range a.segments {
		if p := a.shardOf(seg.Free()).pool; p != nil && p.paused {
			continue // its pages are unmapped (pause.go)
		}
		if !seg.Expandable() {
			a.routes.add(seg.Ptr(), seg.Size(), a.shardOf(seg.Free()), +1)
			continue
		}
		seg.MappedRuns(func(p device.Ptr, n uint64) { a.routePagesLocked(seg, p, n, +1) })
	}
}

// routedShard returns the shard of the memory at p as the routes' tree
// says, or nil: Free's lookup when the cache does not know p's chunk.
func (a *Allocator) routedShard(p device.Ptr) *shard {
	if id, ok := a.routes.lookup(p); ok {
		if ids := *a.byID.Load(); int(id) < len(ids) {
			return ids[id]
		}
	}
	return nil
}

// liveBlockLocked returns the allocated block at p and its shard, or nil;
// it runs in the world. It looks in the address table of shard hint first,
// if not nil (the shard of p's route that Free found), else of the shard
// the routes' cache names.
func (a *Allocator) liveBlockLocked(p device.Ptr, hint *shard) (*freeindex.Block, *shard) {
	if hint == nil {
		hint = a.routes.cached(p) // nil with one shard: the routes are not kept
	}
	if hint != nil {
		if b := hint.live.Get(p); b != nil {
			return b, hint
		}
	}
	if id, ok := a.routes.lookup(p); ok {
		sh := (*a.byID.Load())[id]
		if b := sh.live.Get(p); b != nil {
			return b, sh
		}
	}
	for _, sh := range a.shards {
		if b := sh.live.Get(p); b != nil {
			return b, sh
		}
	}
	return nil, nil
}

// liveCountLocked returns the number of allocated blocks.
func (a *Allocator) liveCountLocked() int {
	n := 0
	for _, sh := range a.shards {
		n += sh.live.Len()
	}
	return n
}

// invalidPointerLocked builds the error for a pointer that is not an
// allocated block, saying what it is if the allocator knows.
func (a *Allocator) invalidPointerLocked(op string, p device.Ptr) error {
	what := "not allocated by this allocator"
	for b := range a.events.Items() {
		if b.Ptr() == p {
			what = "already freed (its free is waiting for stream events): double free"
			break
		}
	}
	if seg := a.segmentOfLocked(p); seg != nil && what == "not allocated by this allocator" {
		what = "inside a cached segment but not the start of an allocated block: double free or bad pointer"
	}
	return fmt.Errorf("allocator: %s %v on device %d: %s: %w", op, p, a.ordinal, what, device.ErrInvalidPointer)
}

// segmentOfLocked returns the segment containing p, or nil. Only used on
// error paths: it scans every segment.
func (a *Allocator) segmentOfLocked(p device.Ptr) *freeindex.Segment {
	for _, s := range a.segments {
		if p >= s.Ptr() && uint64(p-s.Ptr()) < s.Size() {
			return s
		}
	}
	return nil
}

// shardOf returns the shard of the free index x, whose lock guards it.
func (a *Allocator) shardOf(x *freeindex.Index) *shard { return (*a.byID.Load())[x.Shard()] }
