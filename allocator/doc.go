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
//     pool, 20 MiB or a multiple of 2 MiB for the large pool.
//   - block: a contiguous range of a segment. The blocks of a segment tile
//     it exactly and are linked to their neighbours (prev, next) in address
//     order. A block is allocated (handed to a caller), pending (freed by the
//     caller but recorded on other streams whose work has not finished), or
//     free (cached).
//   - pool: small (blocks of at most 1 MiB) or large. Each pool indexes its
//     free blocks in a B-tree (github.com/google/btree) ordered by (stream,
//     size, address), and with expandable segments its unmapped ranges in
//     a second one ordered by (stream, address).
//   - live: an open-addressing table from address to allocated block, for
//     Free (ptrtable.go).
//   - events: per stream, the events recorded for pending frees, oldest
//     first (the queue of internal/deferred, shared with allocator/host).
//   - counters: the stats, kept per pool as PyTorch keeps them, and changed
//     only by the ledger (ledger.go): one method per state change (segment
//     allocated or freed, pages mapped or unmapped, block handed out, free
//     requested, free completed, out of memory, retry, synchronize-all)
//     updates the stats and notifies the observers together.
//
// The files follow the ladders: allocator.go holds the public methods;
// sizes.go the constants, the rounding, the segment sizes and the split
// rule; fit.go best fit and the split; merge.go the merge of neighbours
// (one merge for plain and expandable segments); reclaim.go obtaining
// memory from the device and reclaiming it (the out-of-memory ladder,
// garbage collection); streams.go RecordStream and deferred frees;
// expandable.go expandable segments; check.go the invariant checker;
// policy.go, policy_grow.go and policy_streams.go the opt-in
// low_fragmentation policy (its own section below).
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
//     same stream with size >= the rounded size. An oversize block (at
//     least max_split_size) is never given to a smaller request, and given
//     to an oversize request only if it is less than
//     max_non_split_rounding bytes larger.
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
//     pool). The block is handed out: allocated, in live, in the ledger.
//
// # Free ladder (Free)
//
//  1. Look the address up among allocated blocks (unknown or already freed:
//     an error, nothing changes).
//  2. Mark it not allocated (allocation and allocated_bytes fall now).
//  3. If it was recorded on other streams, record an event on each and
//     leave the block pending; it is completed later by step 1 of Alloc,
//     by EmptyCache or by the out-of-memory path.
//  4. Otherwise, or when its events are done, complete the free: merge the
//     block with free neighbours in its segment and put the result in the
//     free index (active, active_bytes and requested_bytes fall now).
//  5. Segments stay cached until EmptyCache, the out-of-memory path or
//     garbage collection releases those that are wholly free (with
//     expandable segments, EmptyCache and the out-of-memory path unmap the
//     whole pages of free blocks instead).
//
// # Invariants
//
// Checked by CheckInvariants after every step of the tests, and after
// every Alloc, Free and EmptyCache in builds with the gpumem_invariants
// tag (go test -tags gpumem_invariants), which panic on a violation: a bug
// in gpumem, never a caller's mistake:
//
//   - every byte of a segment is in exactly one block; no gaps, no
//     overlaps;
//   - no two neighbouring blocks of a segment are both free;
//   - a block is in its pool's free index if and only if it is free (and
//     then marked indexed), in the unmapped index if and only if it is an
//     unmapped range, in the address map if and only if it is allocated,
//     and in the events queue (once per event) if and only if it is
//     pending;
//   - a block is never reused on another stream (except lent, under the
//     low_fragmentation policy): blocks keep the stream of their segment;
//   - every current stat equals a count over the blocks, and the device's
//     bytes in use equal reserved_bytes.all.current.
//
// # Locking
//
// One mutex (Allocator.mu) guards all state but the fields set once by
// New. Every exported method takes it once; methods of the Allocator whose
// names end in Locked expect it held, and every method that needs it has
// the suffix. The fields and methods of blocks, segments and pools are
// guarded by it too. Device calls on
// the slow paths (malloc, free, events) are made with the lock held, as
// PyTorch does by default; the cached path makes none. Observers are called
// with the lock held; out-of-memory observers after it is released. There
// is no second lock and no background goroutine: pending frees are
// completed by the calls above.
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
// memory page by page (2 MiB pages in the small pool, 20 MiB in the large
// one), so that blocks freed next to each other merge even when they were
// mapped at different times; expandable.go describes the rules. Mapping a
// page counts as a device allocation and adds to reserved bytes; unmapping
// (EmptyCache, the out-of-memory path) counts as a device free. The device
// must implement device.VirtualMemory.
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
//     where it forms whole pages.
//   - Lending (between steps 4 and 5): a request that its own stream's
//     cache cannot serve takes the best fit of another stream's cache,
//     after its stream waits on the device (device.StreamWaiter) for an
//     event recorded on the lender's; freed, the block returns to the
//     lender's cache at once, the lender waiting on the device for the
//     borrower. Streams named by RecordStream neither lend nor borrow.
//     policy_streams.go has the rules.
//   - Growth (step 5): the pages are mapped into the unmapped range that
//     needs the fewest, counting the free blocks on either side of it,
//     plus up to LowFrag.MapAhead bytes more while reserved memory stays
//     within the slack.
//   - Reclaim (step 5): growth that would raise reserved memory above its
//     high-water mark and above (1 + LowFrag.Slack) times the peak of
//     requested bytes first unmaps whole free pages of the same pool
//     elsewhere: the smallest free block that has enough, else at most
//     LowFrag.Victims of the largest, never one freed in the last
//     LowFrag.MinAge best-fit searches. Under a cap, or when the device
//     refuses, it unmaps whatever the pool has before the ladder flushes
//     the cache.
//
// Its invariants, checked by CheckInvariants besides those above: a block
// keeps its segment's stream even when lent, and a lent block is
// allocated and recorded on its borrower (never its own stream); with
// expandable segments reserved bytes never exceed the high-water mark, and
// every segment's page is its pool's. Stats stay true to the blocks:
// every map and unmap goes through the ledger as with expandable
// segments, and a lent block is counted in its segment's pool.
package allocator
