// This file holds the Allocator, its construction and its public methods:
// Alloc and Free run the ladders of DESIGN.md, step by step in the files
// named there.

package allocator

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/gpumem/gpumem/allocator/internal/deferred"
	"github.com/gpumem/gpumem/allocator/internal/freeindex"
	"github.com/gpumem/gpumem/allocator/internal/peaks"
	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/stats"
)

// Allocator is a caching allocator for one device. It is safe for concurrent
// use by multiple goroutines: Alloc and Free on different streams run at
// once (DESIGN.md, Locking). Make one with New: the zero Allocator has no
// device, and its methods change nothing and return an error, or zero
// values where they return none.
type Allocator struct {
	// Read-only after New.
	dev       device.Device
	vm        device.VirtualMemory // set when expandable segments are on
	pvm       device.VirtualMemory // the device's virtual memory, when it can page segments: named pools' segments are mapped with it (pool_mapped.go)
	ordinal   int
	total     uint64                       // device memory, from MemInfo at New
	rule      splitRule                    // max_split_size and the split rules
	divisions *[NumRoundupIntervals]uint64 // roundup_power2_divisions; nil when no entry is set
	eventDone func(*freeindex.Block)       // eventDoneLocked, bound once so that polling allocates nothing
	def       *shard                       // the default stream's shard
	pol       *policyState                 // the low_fragmentation policy's state; nil for the faithful policy

	// Written in the world only, read by the fast paths too (kept here,
	// away from the lines the locks write).
	aging    bool   // best-fit searches count in the pools' clocks: garbage collection is active, or the policy
	phased   bool   // phases other than the first were named: blocks are counted by phase (phases.go)
	stepping bool   // a step was marked: the shards log their live blocks' changes (steps.go)
	hooks    uint8  // hookListen, hookSearch: whom takeLocked and the frees tell
	phase    uint16 // the current phase (SetPhase): the phase of the blocks handed out

	// Read without a lock; written in the world.
	single   atomic.Pointer[shard]       // the one shard while there is one (the default stream's), then nil
	byStream atomic.Pointer[streamTable] // every shard of its own, by stream: a copy of shards
	byID     atomic.Pointer[[]*shard]    // every shard, by id (its place in the order of creation), for routes
	routes   routes                      // address to shard, while there is more than one shard

	// mu and every shard's lock together (the world) guard everything
	// below: it changes only in the world, and a shard's fast path, which
	// holds only its shard's lock, may read it.
	mu    sync.Mutex
	world bool // the world is held
	// anyFast: the world, as it left last, made some shard fast (or New
	// did). While it is false no shard is fast, so that the world takes
	// no shard's lock and has none to make slow (lockAll, unlockAll).
	// Guarded by mu alone.
	anyFast bool
	// settling: while there are several shards, how many more times the
	// world must leave with no stream event pending before it makes a
	// shard fast again (fastLocked); set to settleExits by a world that
	// leaves with events pending and several shards (so that no shard is
	// fast while it is above 0: shards are never taken away). Guarded by
	// mu alone.
	settling int32
	// cutWaiting: a shard left a cut waiting since the world settled the
	// last (shard.cut). Stored by the fast path that leaves the cut,
	// before its shard's last write (fast cleared), so that the world,
	// which loads that shard's fast flag, sees it; cleared by the world
	// that settles the cuts (cutsLocked).
	cutWaiting atomic.Bool

	cfg      Config
	allowed  uint64 // cap on reserved bytes (fraction or limit); 0 means none
	gcActive bool   // a garbage-collection threshold and a cap are both set

	// small and large are the two pools. Every block of every segment is
	// in exactly one of: its shard's address table (allocated), the
	// events queue (pending, once per outstanding event), the free index
	// of its pool and stream (free), its pool's unmapped index (unmapped).
	small, large *freeindex.Pool
	shards       []*shard                              // the shards of their own by stream (def included), then the cold shard, then the named pools' (pools.go): the order of lockAll
	cold         *shard                                // the shard that the streams past maxShards share; nil until one comes
	coldIdx      map[device.Stream]*[2]freeindex.Index // the free indexes of the cold shard's streams
	segments     map[device.Ptr]*freeindex.Segment     // every segment by base address
	gst          globalCounts                          // the slow paths' counters; with the shards' counts and the peaks, the stats, changed only through the ledger
	peaks        peaks.Table                           // the peaks of the stats and phases (counters.go); with one shard changed under its lock too
	cutChanges   []peaks.Change                        // scratch for cutsLocked
	cutOps       []peaks.Op                            // scratch for cutsLocked

	phases   []phaseInfo       // by phase id; 0 is the phase before any SetPhase
	phaseIDs map[string]uint16 // phase ids by name
	steps    stats.StepCounts[leakKey]
	stepNets leakNets // markStepLocked's, kept for the next boundary

	useRecs  []streamUses                      // the records of the streams blocks were recorded on, named by Block.Uses (streams.go)
	freeUses []int32                           // the names of the records no block holds
	events   *deferred.Queue[*freeindex.Block] // pending frees, per stream
	streams  map[device.Stream]struct{}        // streams known to be valid that have no free indexes yet
	// knownRecent: streams found known lately, by knownSlot (0: none);
	// see knownStreamLocked.
	knownRecent [1 << knownRecentBits]device.Stream

	collected []*freeindex.Block // scratch list for release passes
	examined  int                // blocks looked at by release passes, for the tests of their cost
	visited   int                // free indexes visited by walks over every stream's cache, for the tests of their cost

	// Named pools (pools.go): the pools not yet gone, by id; the routes
	// of streams to them; how many released pools still hold memory; the
	// shards of pools gone, for the next; how many shards pools have made.
	pools      []*Pool
	nextPool   uint64
	route      map[device.Stream]route
	releasing  int
	idle       []*shard
	poolShards int
	strayHost  [][]byte                    // host copies of paused pools a failed HostFree left (pause.go)
	mappedSegs map[*freeindex.Segment]bool // named pools' plain segments reserved and mapped with pvm, not allocated (pool_mapped.go)
	strayRes   []device.Ptr                // reservations of such segments a failed Release left

	// Graph capture (capture.go): the captures underway, the frees that
	// wait for their end (the streams blocks were recorded on during a
	// capture are in their records, streamUses).
	captures int
	deferred []deferredFree

	observers    []observerEntry // copy on write: notified in the world
	oomObservers []oomObserver   // copy on write: called after the world is left
	nextID       uint64
}

// errNotMade is the error of every method of an Allocator not made by New
// (the zero Allocator), which holds no device.
var errNotMade = errors.New("allocator: the zero Allocator has no device: make one with allocator.New")

// made reports whether a was made by New; the methods of the zero
// Allocator change nothing and return errNotMade or zero values.
func (a *Allocator) made() bool { return a.def != nil }

// New returns an allocator for dev with configuration cfg (the zero Config
// is PyTorch's default). It asks the device for its total memory once.
func New(dev device.Device, cfg Config) (*Allocator, error) {
	if dev == nil {
		return nil, errors.New("allocator: nil device")
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	_, total, err := dev.MemInfo()
	if err != nil {
		return nil, fmt.Errorf("allocator: reading device memory: %w", err)
	}
	var vm device.VirtualMemory
	if cfg.ExpandableSegments {
		var ok bool
		if vm, ok = dev.(device.VirtualMemory); !ok {
			return nil, fmt.Errorf("allocator: expandable_segments needs a device with virtual memory; %s has none: %w", dev.Name(), device.ErrNotSupported)
		}
		if g := vm.Granularity(); g == 0 || kSmallBuffer%g != 0 {
			return nil, fmt.Errorf("allocator: expandable_segments needs a mapping granularity dividing 2 MiB; the device's is %d: %w", g, device.ErrNotSupported)
		} else if l := cfg.largeSegment(); l%g != 0 {
			return nil, fmt.Errorf("allocator: expandable_segments pages the large pool by the large segment size, %d bytes, which is not a multiple of the device's mapping granularity %d: %w", l, g, device.ErrNotSupported)
		}
	} else if cfg.Policy != PolicyFaithful {
		vm = pagingVM(dev) // policy: expandable segments when the device can
	}
	a := &Allocator{
		dev:     dev,
		vm:      vm,
		pvm:     pagingVM(dev),
		cfg:     cfg,
		ordinal: dev.Ordinal(),
		total:   total,
		rule: splitRule{
			maxSplit:            cfg.maxSplit(),
			maxNonSplitRounding: cfg.maxNonSplitRounding(),
			expandable:          vm != nil,
			large:               cfg.largeSegment(),
			anyServes:           vm != nil && cfg.Policy != PolicyFaithful,
		},
		small:    freeindex.NewPool(true, vm != nil),
		large:    freeindex.NewPool(false, vm != nil),
		segments: make(map[device.Ptr]*freeindex.Segment),
		events:   deferred.New[*freeindex.Block](dev),
		phases:   []phaseInfo{{}},
		phaseIDs: map[string]uint16{"": 0},
		pol:      newPolicyState(&cfg, vm != nil),
	}
	a.setHooksLocked() // the planned policy's search for steps
	if a.pol != nil {
		a.small.Cold().SetWaited(a.pol.hostWaited)
		a.large.Cold().SetWaited(a.pol.hostWaited)
		a.pol.waiter, _ = dev.(device.StreamWaiter)
	}
	if cfg.RoundupPower2Divisions != [NumRoundupIntervals]uint64{} {
		d := cfg.RoundupPower2Divisions
		a.divisions = &d
	}
	a.eventDone = a.eventDoneLocked
	a.peaksStarted()
	a.def = a.newShard(device.DefaultStream)
	a.shards = []*shard{a.def}
	a.byID.Store(&[]*shard{a.def})
	a.byStream.Store(streamList(a.shards))
	a.single.Store(a.def)
	a.setCapLocked(cfg.MemoryFraction)
	a.def.fast.Store(a.fastLocked())
	a.anyFast = true
	a.gst.maxSplitSize = -1
	if a.rule.maxSplit != maxSplitNone {
		a.gst.maxSplitSize = int64(a.rule.maxSplit)
	}
	return a, nil
}

// Device returns the device the allocator manages.
func (a *Allocator) Device() device.Device { return a.dev }

// Config returns the allocator's configuration.
func (a *Allocator) Config() Config {
	if !a.made() {
		return Config{}
	}
	a.lockAll()
	defer a.unlockAll()
	return a.cfg
}

// Alloc returns the address of a block of at least size bytes for use on
// stream s. Size 0 returns the zero Ptr and no error without touching the
// device, as PyTorch does. When neither the cache nor the device can serve
// the request, even after releasing cached memory, the error is an
// *OutOfMemoryError (which matches device.ErrOutOfMemory with errors.Is).
func (a *Allocator) Alloc(size uint64, s device.Stream) (device.Ptr, error) {
	if size-1 >= maxRequestSize-1 { // 0, or 1 EiB and more
		return 0, outOfRange(size)
	}
	sh := a.def
	if s != device.DefaultStream {
		if sh = a.slotShard(s); sh == nil {
			sh = a.lookupShard(s)
		}
	}
	// A shard that is not fast (stream events pending, say) takes the
	// world without its own lock: the world serves any shard, made fast
	// since the read or not (see shard.fast).
	if sh != nil && sh.fast.Load() {
		sh.mu.Lock()
		if sh.fast.Load() {
			// fitLocked, inlined, and the held front's hand-out
			// (freeindex.Index.Retake) where the index remembers nothing.
			rounded := a.round(size)
			x := indexFor(&sh.free, rounded)
			var f *freeindex.Block
			if h := x.Held(); h != nil && h.Size() == rounded {
				f = a.retakeLocked(sh, x, h, size)
			} else if b := x.Remembered(rounded); b != nil {
				f = a.takeLocked(sh, x, b, rounded, size)
			} else if b = a.searchLocked(x, rounded); b != nil {
				f = a.takeLocked(sh, x, b, rounded, size)
			}
			if f != nil {
				ptr := f.Ptr()
				if sh.cut {
					sh.fast.Store(false) // the world settles the cut first
					sh.mu.Unlock()
					a.settleCut()
				} else {
					sh.mu.Unlock()
				}
				if selfCheck {
					a.selfCheck("Alloc")
				}
				return ptr, nil
			}
			if a.pol != nil {
				// The policy with one shard (nothing to lend, or a step
				// starts): the world searches, counts and asks the plan again.
				x.Pool().GCCalls--
				a.pol.unplanLocked()
			}
		}
		sh.mu.Unlock()
	}
	return a.allocWorld(size, s, sh)
}

// fitLocked runs steps 2 to 4 of the allocation ladder for a request of
// size bytes (at least 1) on the stream whose free indexes are xs: it
// rounds the size (round), picks the pool (indexFor) and finds the best
// fit: the one the index remembers, or the search (searchLocked). It
// returns the free index searched, the rounded size and the block found,
// nil when none may serve the request. The world calls it; Alloc's fast
// path writes out its five lines: fitLocked is too large to inline, and
// calling it there costs a cached alloc and free 14 more instructions
// (570.1 against 555.8, scripts/callgrind.sh pair).
func (a *Allocator) fitLocked(xs *[2]freeindex.Index, size uint64) (*freeindex.Index, uint64, *freeindex.Block) {
	rounded := a.round(size)
	x := indexFor(xs, rounded)
	b := x.Remembered(rounded)
	if b == nil {
		b = a.searchLocked(x, rounded)
	}
	return x, rounded, b
}

// Best fit (step 4): Alloc asks the free index of the request's pool and
// stream for the block of the lowest (size, address) with at least the
// rounded size (freeindex.Index.BestFit): size buckets answer with bit scans,
// and remember the answer until they change; large buckets too, the tree
// with a lower bound; then the rule of expandable segments applies
// (ExpandableBestFit). searchLocked then checks that the block may serve
// the request (splitRule.mayServe: oversize blocks). The block stays in the
// free index: takeLocked takes it out. While garbage collection is
// active, each search of an index that keeps ages (every kind but size
// buckets: the large pool, and pools of expandable segments) counts in
// the pool's clock of block ages (GCCalls); garbage collection reads only
// the large pool's ages. Under the low_fragmentation policy every search
// counts (policyFitLocked), in both pools, whose ages its reclaim and
// lending read.

// searchLocked is step 4 of the allocation ladder but for the answer the
// index remembers: the best fit of x for a request of size (rounded)
// bytes, nil when none may serve it.
func (a *Allocator) searchLocked(x *freeindex.Index, size uint64) *freeindex.Block {
	var b *freeindex.Block
	if a.pol != nil {
		b = a.policyFitLocked(x, size) // policy: a low address among close fits
	} else {
		if a.aging && x.Aged() {
			x.Pool().GCCalls++
		}
		b = x.BestFit(size)
	}
	if b == nil || !a.rule.mayServe(b.Size(), size) {
		return nil
	}
	return b
}

// allocWorld runs the whole allocation ladder in the world. own is the
// shard of stream s's own that Alloc found (lookupShard), or nil: its free
// indexes are the stream's unless the stream is routed to a pool.
func (a *Allocator) allocWorld(size uint64, s device.Stream, own *shard) (device.Ptr, error) {
	if !a.made() {
		return 0, errNotMade
	}
	a.mu.Lock()
	a.enter() // lockAll, inlined
	var xs *[2]freeindex.Index
	var pool *Pool
	if own != nil && len(a.route) == 0 {
		xs = &own.free // as indexesLocked finds them
	} else {
		xs, pool = a.routedIndexesLocked(s)
	}
	if xs == nil {
		a.unlockAll()
		return 0, fmt.Errorf("allocator: stream %d is not a stream of device %d: %w", s, a.ordinal, device.ErrInvalidStream)
	}
	if a.events.Len() > 0 || len(a.deferred) > 0 {
		a.processEventsLocked()
	}
	a.stepIfDueLocked() // planned policy: a step found without marks starts
	x, rounded, b := a.fitLocked(xs, size)
	from := x // the free index b is in
	if b == nil && a.pol != nil {
		from, b = a.lendLocked(x, rounded) // policy: a block cached on another stream
	}
	if b == nil {
		var err error
		from = x
		if from, b, err = a.allocSlowLocked(x, rounded, size); err != nil {
			return 0, a.allocFailedLocked(err)
		}
		if from != x {
			pool = a.shardOf(from).pool // use_on_oom: a pool's free block
		}
	}
	lent := from != x && a.pol != nil
	if lent {
		a.pol.lending, a.pol.lendTo = true, s
	}
	if pool != nil && pool.opts.NoSplit {
		rounded = b.Size() // no_split: the whole block, which then has no rest to split off
	}
	b = a.takeLocked(a.shardOf(from), from, b, rounded, size)
	if lent {
		a.lentLocked(b, s)
	}
	ptr := b.Ptr()
	if selfCheck {
		a.selfCheckLocked("Alloc")
	}
	a.unlockAll()
	return ptr, nil
}

// outOfRange is Alloc's answer to size 0 (no error) or one of 1 EiB or more.
func outOfRange(size uint64) error {
	if size == 0 {
		return nil
	}
	// PyTorch raises its out-of-memory error here (without counting it in
	// num_ooms); the error matches both, so that a replay counts it as
	// PyTorch's does while a caller sees a size it should not ask.
	return fmt.Errorf("allocator: cannot allocate %d bytes (more than 1 EiB; a negative size converted to uint64?): %w (%w)", size, device.ErrInvalidSize, device.ErrOutOfMemory)
}

// allocFailedLocked ends a failed Alloc: it leaves the world and calls the
// out-of-memory observers for an out-of-memory error.
func (a *Allocator) allocFailedLocked(err error) error {
	if selfCheck {
		a.selfCheckLocked("a failed Alloc")
	}
	obs := a.oomObservers
	a.unlockAll()
	if oom, ok := err.(*OutOfMemoryError); ok {
		for _, o := range obs {
			o.f(oom)
		}
	}
	return err
}

// Free returns a block obtained from Alloc. Freeing the zero Ptr does
// nothing. If the block was recorded on other streams (RecordStream), it
// becomes reusable only after the work queued on those streams so far has
// finished; until then it is "pending free": active but not allocated.
// Freeing an address that is not an allocated block of this allocator
// (never allocated, or already freed) fails with an error wrapping
// device.ErrInvalidPointer and changes nothing.
func (a *Allocator) Free(p device.Ptr) error {
	if p == 0 {
		return nil
	}
	sh := a.single.Load()
	if sh == nil {
		if sh = a.routes.cached(p); sh == nil {
			if sh = a.routedShard(p); sh == nil {
				return a.freeWorld(p, nil)
			}
		}
	}
	if !sh.fast.Load() { // the world without the shard's lock, as in Alloc
		return a.freeWorld(p, sh)
	}
	sh.mu.Lock()
	if sh.fast.Load() {
		// Size buckets in a loop, with a split pending: a free of its front
		// holds. The front, allocated, stays parked in the address table
		// (freeindex.PtrTable.Park), for its hand-out again; a held front
		// is not allocated: the world says so.
		if x := &sh.free[0]; x.Again() && x.Pending() {
			if b := x.Front(); b.Ptr() == p {
				if !b.Allocated {
					sh.mu.Unlock()
					return a.freeWorld(p, sh)
				}
				if b.Uses == 0 {
					x.HoldFront(b)
					b.Allocated = false
					a.freeHeldLocked(sh, b)
					goto freed
				}
			}
		}
		b := sh.live.RemoveHome(p)
		if b == nil {
			b = sh.live.Remove(p)
		}
		if b != nil {
			if b.Uses == 0 {
				b.Allocated = false
				// Its index from b's first line: the segment is a miss of its own.
				x := &sh.free[b.PoolIdx()]
				if selfCheck && b.Seg().Free() != x {
					panic("gpumem: a fast shard's live block belongs to another free index")
				}
				a.finishFreeLocked(sh, x, b, true)
				goto freed
			}
			sh.live.Put(b) // the world frees it
		}
	}
	sh.mu.Unlock()
	return a.freeWorld(p, sh)
freed: // a free of shard sh's fast path
	if sh.cut {
		sh.fast.Store(false) // the world settles the cut first
		sh.mu.Unlock()
		a.settleCut()
	} else {
		sh.mu.Unlock()
	}
	if selfCheck {
		a.selfCheck("Free")
	}
	return nil
}

// freeWorld runs the free ladder in the world. hint is the shard whose
// address table Free looked in (its route for p), or nil.
func (a *Allocator) freeWorld(p device.Ptr, hint *shard) error {
	if !a.made() {
		return errNotMade
	}
	a.mu.Lock()
	a.enter() // lockAll, inlined
	defer a.unlockAll()
	b, sh := a.liveBlockLocked(p, hint)
	var err error
	switch {
	case b == nil:
		err = a.invalidPointerLocked("free", p)
	case sh.pool != nil && sh.pool.paused:
		err = fmt.Errorf("allocator: free %v on device %d: its pool %q is paused; resume it first", p, a.ordinal, sh.pool.name)
	case b.Uses != 0:
		sh.live.Remove(p)
		err = a.freeRecordedLocked(sh, b)
	default:
		sh.live.Remove(p)
		b.Allocated = false
		a.completeFreeLocked(b, true)
	}
	if a.releasing > 0 && err == nil {
		// A released pool's memory goes with its last busy block; a device
		// error leaves it cached for EmptyCache, and the free stands.
		_ = a.dropReleasedLocked()
	}
	if selfCheck {
		a.selfCheckLocked("Free")
	}
	return err
}

// freeRecordedLocked runs the free ladder for b, allocated (taken out of
// its shard's address table) and recorded on other streams
// (RecordStream): it records an event on each and leaves b pending, or
// completes the free when the events could not be recorded and the
// streams were synchronized instead.
func (a *Allocator) freeRecordedLocked(sh *shard, b *freeindex.Block) error {
	var n int
	var err error
	if a.pol != nil {
		n, err = a.returnLentLocked(b) // policy: a lent block returns to its lender
	} else {
		n, err = a.deferFreeLocked(b)
	}
	if err != nil {
		sh.live.Put(b) // nothing changed
		return err
	}
	b.Allocated = false
	if n == 0 {
		a.completeFreeLocked(b, true)
		return nil
	}
	a.freeRequestedLocked(b.Seg().Free(), b)
	b.EventCount = int32(n)
	return nil
}
