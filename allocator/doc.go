// Package allocator is gpumem's caching allocator: one Allocator per device
// that keeps device memory it has obtained and hands it out again instead of
// calling the device's malloc and free for every request. With the zero
// Config it makes exactly the decisions PyTorch 2.6's CUDA caching
// allocator makes (c10/cuda/CUDACachingAllocator.cpp): the same requests
// give the same device allocations, the same segments and the same
// statistics.
//
//	a, err := allocator.New(dev, allocator.Config{})
//	p, err := a.Alloc(4<<20, device.DefaultStream)
//	...
//	err = a.Free(p)
//	fmt.Println(a.Stats().Get("allocated_bytes.all.peak"))
//
// # Data structures
//
//   - segment: one device allocation (Device.Malloc), 2 MiB for the small
//     pool, 20 MiB (Config.LargeSegmentSize when set) or a multiple of
//     2 MiB for the large pool.
//   - block: a contiguous range of a segment. The blocks of a segment tile
//     it exactly and are linked to their neighbours (prev, next) in address
//     order. A block is allocated (handed to a caller), pending (freed by the
//     caller but recorded on other streams whose work has not finished), or
//     free (cached).
//   - pool: small (blocks of at most 1 MiB) or large; with expandable
//     segments it indexes its unmapped ranges in a B-tree
//     (github.com/google/btree) ordered by (stream, address). It lists the
//     free indexes of the streams that hold segments in it (owners), and
//     keeps a view of the cold shard's free blocks (cold.go): by (size,
//     address), those that may be lent, and the cold indexes with whole
//     free segments. A walk of every stream's cached blocks (releasing
//     the cache, garbage collection, the largest free block, lending)
//     visits the shards of their own and what it takes from the view, not
//     every stream that holds memory.
//   - shard: one stream's part of the allocator (shards.go), with a lock of
//     its own. A stream's blocks serve no other stream (but lent by the
//     low_fragmentation policy, in the world), so everything an Alloc or
//     Free of one stream touches in the common case is its shard's: the
//     free indexes of its two pools, the address table of its allocated
//     blocks, its counts (per phase too), its spare block structs. The
//     default stream and the next maxShards-1 streams to allocate get
//     shards of their own; later streams share the cold shard, which has
//     an index pair per stream (trees alone: a size bucket array costs tens
//     of KiB) and is never fast, so that a program with a stream per
//     allocation costs the same per operation however many streams came
//     before.
//   - free index (index.go): one pool's free blocks on one stream, in the
//     order (size, address) that PyTorch 2.6's B-tree keeps per stream,
//     used through its methods alone (freeIndex lists them): the one best
//     fit, take (the split), put (the merge), the ordered walks, the
//     largest block, the whole free segments and its own check. Its kind,
//     fixed when it is made, says its structures. A bucket per 512-byte
//     size, each a heap by address (heap.go), and a bitmap of the buckets
//     in use find the best fit with bit scans: the small pool's 4096
//     sizes of PyTorch's plain segments in two levels (size buckets,
//     buckets.go); the other pools' 2^18 sizes up to 128 MiB in three,
//     with a hash table of the sizes in use (large buckets, large.go): the
//     large pool of plain segments, both pools of expandable segments
//     (whose small blocks can pass 2 MiB) and the policy's. The walks in
//     (size, address) order that the rule of expandable segments and the
//     policy's close fit make cross the sizes by the bitmap, each in
//     address order from its heap. Larger blocks, and every block of the
//     cold shard's streams (the tree kind), are in a B+ tree with its
//     (size, address) keys in its nodes (tree.go). A split whose rest
//     stays in the index waits to move it (pend) until the index is used
//     again: the free of the block handed out, the usual next step, merges
//     the two back into the key the rest is still filed under, and the
//     index never changes (an "unsplit"). Size buckets remember their last
//     best fit until they change.
//   - live: per shard, an open-addressing table from address to allocated
//     block, for Free (ptrtable.go).
//   - routes: a lock-free table from 2 MiB chunks of addresses to the shard
//     whose segments hold them (routes.go), for Free, which is not told the
//     stream, to take one shard's lock; kept once there are two shards.
//   - events: per stream, the events recorded for pending frees, oldest
//     first (the queue of allocator/internal/deferred, shared with
//     allocator/host).
//   - counters (counters.go): the stats, kept per shard and pool, with
//     per-shard limits that keep the peaks of their totals exact: the
//     peaks are the rows of one table of allocator/internal/peaks, whose
//     parts are the shards. Values, limits and peaks are changed only by
//     the ledger (ledger.go): one method per state change (segment
//     allocated or freed, pages mapped or unmapped, block handed out, free
//     requested, free completed, out of memory, retry, synchronize-all)
//     updates the stats and notifies the observers together, and the
//     ledger settles the cuts and resets.
//   - phases (phases.go): the phase names and the current phase (every
//     block carries the phase it was handed out in); once a second phase
//     is named, every shard counts its blocks' bytes and number by phase,
//     and each phase's peaks are two more rows of the same table. Steps
//     keep the counts of live blocks by (phase, requested size) at each
//     boundary, for Leaks.
//
// The files follow the ladders: allocator.go holds the public methods and
// steps 2 to 4 (fitLocked: the rounding, the pool, the one search of the
// free index); sizes.go the constants, the rounding, the segment sizes and
// the split rule; ledger.go the handing out of a block (step 7,
// takeLocked) and the completion of a free (step 4 of the free ladder,
// finishFreeLocked), each with its record; reclaim.go obtaining
// memory from the device and reclaiming it (the out-of-memory ladder,
// garbage collection); streams.go RecordStream and deferred frees;
// expandable.go expandable segments; shards.go and routes.go the shards
// and their locking; the free indexes in index.go (the index and its
// methods: the best fit with the rule of expandable segments, the split,
// the merge, the walks), index_check.go (its check), buckets.go, large.go,
// tree.go and tree_check.go (its structures), heap.go (the heap of a size
// class) and hash.go (the hash of the open-addressing tables: the large
// buckets', the address tables' of ptrtable.go, the routes'); cold.go the
// pools' view of the cold shard's free indexes; counters.go, ledger.go and
// phases.go the stats (their peaks in allocator/internal/peaks), steps.go
// the counts of live blocks at step boundaries; check.go the invariant
// checker; policy.go, policy_grow.go and policy_streams.go the opt-in
// low_fragmentation policy (its own section below).
//
// The walk of a request: Alloc (allocator.go) finds its shard
// (shards.go), asks fitLocked (allocator.go) for the best fit, which asks
// the free index (index.go and its structures); takeLocked (ledger.go)
// has the index split the block (index.go), files it in the shard's
// address table (ptrtable.go) and records it (ledger.go, counters.go).
// Free finds the shard by the routes (routes.go), the block in the
// address table (ptrtable.go); finishFreeLocked (ledger.go) records it
// and has the index merge and file it (index.go).
//
// # Allocation ladder (Alloc)
//
//  0. Size 0 returns the zero Ptr; sizes of 1 EiB or more are refused.
//  1. Complete pending frees whose stream events are done.
//  2. Round the size: up to 512 bytes at least and a multiple of 512, or
//     to the next power-of-two division when roundup_power2_divisions
//     says so for the size's interval.
//  3. Pick the pool: small if the rounded size is at most 1 MiB.
//  4. Best fit: the lowest (size, address) free block of that pool on the
//     same stream with size >= the rounded size (the stream's free index;
//     a pending split there is settled first). An oversize block (at
//     least max_split_size) is never given to a smaller request, and given
//     to an oversize request only if it is less than
//     max_non_split_rounding bytes larger. (Under the policy, a close fit
//     at a lower address, then a block lent by another stream.)
//  5. On a miss: garbage-collect old cached blocks if a threshold and a
//     memory cap are set; then ask the device for a new segment, or with
//     expandable segments map pages into one (refused without asking when
//     it would pass the cap); if it says out of
//     memory, release cached oversize blocks of this pool and stream and
//     try again; if that fails, wait for all stream events, release every
//     cached segment that is wholly free, and try once more (counted in
//     num_alloc_retries).
//  6. Still nothing: count num_ooms and return an *OutOfMemoryError,
//     calling the OnOutOfMemory observers.
//  7. Split: keep the front of the block for the request and return the
//     rest to the free index, if the rest is at least 512 bytes (small
//     pool) or more than 1 MiB and the request is not oversize (large
//     pool); the rest's move to its new key waits (pend). The block is
//     handed out: allocated, of the current phase, in its shard's live
//     table, in the ledger.
//
// # Free ladder (Free)
//
//  1. Look the address up among allocated blocks: the routes name the
//     shard, its table the block (unknown or already freed: an error,
//     nothing changes).
//  2. Mark it not allocated (allocation and allocated_bytes fall now).
//  3. If it was recorded on other streams, record an event on each and
//     leave the block pending; it is completed later by step 1 of Alloc,
//     by EmptyCache or by the out-of-memory path.
//  4. Otherwise, or when its events are done, complete the free: merge the
//     block with free neighbours in its segment and put the result in the
//     free index (active, active_bytes and requested_bytes fall now); when
//     the block is the front of the index's pending split, merging it back
//     leaves the index as it was (unsplit).
//  5. Segments stay cached until EmptyCache, the out-of-memory path or
//     garbage collection releases those that are wholly free (with
//     expandable segments, EmptyCache and the out-of-memory path unmap the
//     whole pages of free blocks instead).
//
// # Invariants
//
// Checked by CheckInvariants after every step of the tests, and after
// every operation in builds with the gpumem_invariants tag (go test -tags
// gpumem_invariants), which panic on a violation: a bug in gpumem, never a
// caller's mistake:
//
//   - every byte of a segment is in exactly one block; no gaps, no
//     overlaps;
//   - no two neighbouring blocks of a segment are both free;
//   - a block is in the free index of its pool and stream if and only if
//     it is free (and then marked indexed, filed in the structure its size
//     says, under its key, or under its key from before the split when it
//     is the index's pending split, whose front is then the block before
//     it), in the unmapped index if and only if it is an unmapped range, in
//     its shard's live table if and only if it is allocated, and in the
//     events queue (once per event) if and only if it is pending;
//   - the structures of the free indexes hold: bitmaps and buckets agree,
//     buckets are heaps by address, the B+ tree is ordered and balanced,
//     a remembered best fit is still the best fit, the whole free segments
//     are known exactly;
//   - a block is never reused on another stream (but lent, under the
//     low_fragmentation policy): blocks keep the stream, and the shard, of
//     their segment;
//   - the cold shard's indexes never keep a pending split; every free
//     index with segments, and no other, is among its pool's owners, with
//     the count of its segments; each pool's cold view holds exactly the
//     cold shard's free blocks of the pool (its lenders exactly those of
//     streams RecordStream has not named, under the policy) and the cold
//     indexes with whole free segments;
//   - every current count equals a count over the blocks, per shard, and
//     the device's bytes in use equal reserved_bytes.all.current;
//   - every shard's count of a quantity is within its limit, the limits add
//     up to at most the peak, and the peak is at least the total; the same
//     holds of every phase's bytes and blocks, which equal counts over the
//     allocated blocks of the phase;
//   - the routes hold every 2 MiB chunk of every segment's memory (a plain
//     segment, a mapped page of an expandable one), naming its shard, and
//     nothing else; the lock-free copies of the shard list are current.
//
// # Locking
//
// Each shard has a lock (shard.mu); the allocator has one more (mu).
// Holding mu and the lock of every shard that is fast, taken by lockAll
// in the order of a.shards after mu, is holding "the world". The lock
// order is mu, then shards in the order of a.shards (by stream, the cold
// shard last); no lock is taken while a shard's lock is held outside the
// world.
//
//   - A shard's fields, and the blocks of its segments, are guarded by its
//     lock; the world guards them too.
//   - Everything else (the segments map, the pools' unmapped indexes and
//     owners, the events queue, observers, configuration, the shard list,
//     the phases, the policy's state) is changed only in the world, so a
//     goroutine holding any one shard's lock may read it; but the peaks,
//     which while there is one shard are its limits, guarded by its lock
//     and raised by its fast path, and a pool's clock of block ages
//     (gcCalls), which the policy's fast path counts too, while the
//     default stream's shard is the only one. Methods
//     whose names end in Locked expect the locks of what they touch held:
//     their shard's for those the fast paths call (searchLocked,
//     takeLocked, finishFreeLocked,
//     policyFitLocked, and the free index's methods, which need no suffix:
//     an index is its shard's), the world for the others.
//   - Fast paths: Alloc of a cached block and Free of an allocated block
//     that was not recorded on other streams run under their shard's lock
//     alone, when the shard is fast: no stream event is pending, garbage
//     collection is off, the policy is off or the default stream's shard
//     is the only one, no observer is attached, no cut waits, and the
//     shard is not the cold one. They take no other lock while holding it
//     and call no device. The shard of a stream is found by a binary
//     search of a lock-free copy of the shard list (byStream), the shard
//     of an address through the routes; both are written in the world and
//     read with atomic loads.
//   - Fast is an atomic flag: set by the world as it leaves, after every
//     other write (the store publishes them); cleared by the world, or by
//     a fast path that leaves a cut, as its last write. A shard that is
//     not fast runs no fast path, so the world needs no lock of it, and
//     the world costs a lock per shard that can run alone: one lock in all
//     while events are pending, garbage collection or the policy is on
//     with several streams, or observers are attached.
//   - Everything else, and a fast path that cannot finish, takes the
//     world: a miss (device calls are made in the world, as PyTorch makes
//     them under its lock), out of memory, RecordStream, pending events,
//     EmptyCache, the stats, snapshots, observers, phases and steps,
//     lending, the checker.
//   - No deadlock: the fast paths hold one lock; every taker of more than
//     one takes mu first.
//   - Stats: a fast path whose counts pass a shard's limit (a possible new
//     peak, of a stat or of its block's phase) marks a cut and leaves; the
//     cut (cutsLocked, with the peaks' Cut) runs in the world before
//     anything else, computes the totals and raises the peaks. The stats
//     follow the order in which the operations took their locks, where an
//     operation that needed a cut counts at its cut, a moment before it
//     returns: every peak, the "all" peaks and the phases' included, is
//     that order's (shards.go, allocator/internal/peaks). For one
//     goroutine that is the order of its calls.
//   - Observers are called in the world; out-of-memory observers after it
//     is left. There is no background goroutine: pending frees are
//     completed by the calls above.
//
// # Phases
//
// SetPhase names the caller's phase; blocks carry the phase current when
// they were handed out, and PhaseStats reports each phase's allocated
// bytes and blocks (current, peak, allocated, freed). While only the
// first phase exists its stats are allocation's and allocated_bytes' and
// nothing more is counted, so that the cached path does the same work as
// without phases. From the second phase on, the ledger counts per shard
// and phase, and the phases' peaks are kept with limits and cuts as the
// other stats are: exact, under concurrency too, in the order the stats
// follow. MarkStep counts the live blocks by (phase, requested size) in
// the world; Leaks reports the groups that grew at every recent step.
//
// # Differences from PyTorch 2.6
//
// gpumem follows 2.6 where later PyTorch differs (later versions add a
// registration counter to the best-fit order, and a 20 MiB
// large_segment_size option). CUDA graphs and private pools are not
// implemented. Errors are returned, never thrown: a failed device free
// leaves its block cached; an event that cannot be recorded is replaced by
// synchronizing its stream. An expandable segment reserved for an
// allocation that fails is released at once, and a reservation the device
// refuses to release is released by a later flush.
//
// # Expandable segments
//
// With Config.ExpandableSegments (expandable_segments:True) a pool's
// memory for a stream comes from one reserved address range, backed by
// memory page by page (2 MiB pages in the small pool, 20 MiB or
// Config.LargeSegmentSize in the large one), so that blocks freed next to
// each other merge even when they were mapped at different times;
// expandable.go describes the rules. Mapping a page counts as a device
// allocation and adds to reserved bytes; unmapping (EmptyCache, the
// out-of-memory path) counts as a device free. The device must implement
// device.VirtualMemory.
//
// # The low_fragmentation policy
//
// Config.Policy = PolicyLowFragmentation (gpumem_policy:low_fragmentation)
// leaves PyTorch's decisions where they waste memory; the faithful policy
// stays the default and the code paths above are its. POLICY.md measures
// each part. The model: reserved memory is physical pages, address space
// is free, and what counts is the peak of reserved bytes against the peak
// of requested bytes, at a bounded number of device calls.
//
//   - Pages: with a device that has virtual memory, every pool is made of
//     expandable segments, 2 MiB pages in both pools (LowFrag.LargePage),
//     so that a block wastes at most the rest of one page at each end.
//     Without virtual memory the policy keeps plain segments and lends
//     across streams only.
//   - Fit (step 4): in the large pool, among the free blocks no more than
//     an eighth larger than the best fit (at most LowFrag.FitWindow of
//     them), the lowest address: live blocks gather low, free memory high,
//     where it forms whole pages. Every search counts in its pool's clock
//     of block ages, in both pools.
//   - Lending (between steps 4 and 5): a request that its own stream's
//     cache cannot serve takes the best fit of another stream's cache,
//     after its stream waits on the device (device.StreamWaiter) for an
//     event recorded on the lender's; freed, the block returns to the
//     lender's cache at once, the lender waiting on the device for the
//     borrower. Streams named by RecordStream neither lend nor borrow.
//     policy_streams.go has the rules. The lent block stays in its
//     lender's shard (address table, counts); it is recorded on the
//     borrower, so its Free takes the world.
//   - Growth (step 5): the pages are mapped into the unmapped range that
//     needs the fewest, counting the free blocks on either side of it,
//     plus up to LowFrag.MapAhead bytes more while reserved memory stays
//     within the slack.
//   - Reclaim (step 5): growth that would raise reserved memory above its
//     high-water mark and above (1 + LowFrag.Slack) times the peak of
//     requested bytes first unmaps whole free pages of the same pool and
//     stream elsewhere: the smallest free block that has enough, else at
//     most LowFrag.Victims of the largest, never one freed in the last
//     LowFrag.MinAge best-fit searches. Under a cap, or when the device
//     refuses, it unmaps whatever the pool has before the ladder flushes
//     the cache.
//   - Concurrency: lending reads and changes the caches of two streams,
//     and the ages are one clock per pool, so under the policy the shards
//     are fast only while the default stream's is the only one (a cached
//     hit then touches that shard and its pools' clocks alone; a search
//     that misses uncounts itself, as the world searches again); with
//     several streams every operation takes the world.
//
// Its invariants, checked by CheckInvariants besides those above: a block
// keeps its segment's stream even when lent, and a lent block is
// allocated and recorded on its borrower (never its own stream); with
// expandable segments reserved bytes never exceed the high-water mark, and
// every segment's page is its pool's. Stats stay true to the blocks:
// every map and unmap goes through the ledger as with expandable
// segments, and a lent block is counted in its segment's pool and shard.
package allocator
