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
// # Model
//
// An Allocator keeps the device memory it obtains as segments: device
// allocations of 2 MiB for requests of at most 1 MiB (the small pool),
// 20 MiB or more for larger ones (the large pool). A request is rounded up
// to a multiple of 512 bytes and served by the smallest cached free block
// of its stream and pool that fits, split when the rest is worth keeping;
// a freed block merges with its free neighbours and stays cached for the
// next request of its stream. Only when no cached block fits does the
// allocator call the device, and when the device is out of memory it
// releases cached segments and tries again before it returns an error
// (OnOutOfMemory observers hear of it). EmptyCache returns every cached
// segment to the device.
//
// Memory freed on one stream serves only that stream. RecordStream marks
// a block as used by another stream: its Free then waits for that
// stream's work (a device event) before the block is cached again.
//
// Stats reports PyTorch's statistics (allocation, allocated_bytes,
// reserved_bytes, ... with current, peak, allocated and freed figures per
// pool); Snapshot the segments and blocks; Attach observers every change,
// in order. The peaks are exact under concurrency too: those of one serial
// order of the operations.
//
// # Concurrency
//
// An Allocator is safe for concurrent use. Alloc of a cached block and
// Free of a block that was not recorded on other streams take only their
// stream's lock (the first 32 streams used, the default stream's
// included, have one each; later streams share one) and allocate nothing
// on the Go heap. Everything else (device calls, the out-of-memory path,
// EmptyCache, observers, pending frees, the low_fragmentation policy with
// several streams) takes every lock. No method calls the device while it
// holds only a stream's lock, and no method prints. CheckInvariants
// checks the invariants DESIGN.md lists and returns an error that
// describes every violation found.
//
// # Phases
//
// SetPhase names the caller's phase; blocks carry the phase current when
// they were handed out, and PhaseStats reports each phase's allocated
// bytes and blocks (current, peak, allocated, freed). While only the
// first phase exists its stats are allocation's and allocated_bytes' and
// nothing more is counted, so that the cached path does the same work as
// without phases. From the second phase on, each phase is counted as
// the other stats are, its peaks exact under concurrency too. MarkStep
// counts the live blocks by (phase, requested size); Leaks reports the
// groups that grew at every recent step.
//
// # Differences from PyTorch 2.6
//
// gpumem follows 2.6 where later PyTorch differs (later versions add a
// registration counter to the best-fit order, and a 20 MiB
// large_segment_size option); named pools take MemPool's no_split and
// use_on_oom from later versions, and pausing pools is gpumem's (as
// torch_memory_saver and vLLM's sleep mode do it outside PyTorch).
// During a graph capture gpumem releases no cached memory (PyTorch
// would, and then fail an internal assertion). Errors are returned, never thrown: a failed device free
// leaves its block cached; an event that cannot be recorded is replaced by
// synchronizing its stream. An expandable segment reserved for an
// allocation that fails is released at once, and a reservation the device
// refuses to release is released by a later flush.
//
// # Pools, graph capture, sleep and wake
//
// NewPool makes a named pool (PyTorch's MemPool): a cache of its own, with
// its own segments and figures (PoolStats). UsePool routes a stream's
// allocations to it until UseDefaultPool (PyTorch's beginAllocateToPool
// with a stream filter, which use_mem_pool uses); a pool's blocks serve
// only the allocations routed to it, and Free returns a block to the pool
// it came from. PoolOptions.NoSplit hands out whole blocks;
// PoolOptions.UseOnOOM lets the default pool take the pool's free blocks
// before it reports out of memory. EmptyCache leaves a pool's segments
// alone until ReleasePool, which returns them now, and those holding live
// blocks once the last is freed. Snapshots give each segment its pool's
// id (SegmentInfo.PoolID; the pickle's segment_pool_id).
//
// BeginCapture and EndCapture bracket a CUDA graph capture on a stream
// into a pool, with PyTorch 2.6's rules: the capturing stream allocates in
// the pool; no event is queried while a capture is underway, and the free
// of a block used on other streams waits until none is; the pool outlives
// the capture until it is released.
//
// PausePool puts a pool to sleep: its physical memory goes back to the
// device while its address reservations stay, so that its live blocks
// keep their addresses, and by choice their bytes are backed up to pinned
// host memory (on a device that is a device.Copier and has HostMemory). ResumePool
// maps fresh pages at the same addresses, running the out-of-memory ladder
// when the device is full, and restores the bytes. A paused pool counts
// in no stat. Pausing needs a device with virtual memory: without
// expandable segments, a named pool's segments are then reserved and
// mapped whole rather than allocated, so that their pages can go.
//
// # Expandable segments
//
// With Config.ExpandableSegments (expandable_segments:True) a pool's
// memory for a stream comes from one reserved address range, backed by
// memory page by page (2 MiB pages in the small pool, 20 MiB or
// Config.LargeSegmentSize in the large one), so that blocks freed next to
// each other merge even when they were mapped at different times;
// DESIGN.md and expandable.go describe the rules. Mapping a page counts as a device
// allocation and adds to reserved bytes; unmapping (EmptyCache, the
// out-of-memory path) counts as a device free. The device must implement
// device.VirtualMemory.
//
// # The low_fragmentation policy
//
// Config.Policy = PolicyLowFragmentation (gpumem_policy:low_fragmentation)
// leaves PyTorch's decisions where they waste memory; the faithful policy
// stays the default. It builds every pool from expandable segments of
// 2 MiB pages when the device has virtual memory, prefers low addresses
// among close fits, lends free blocks across streams (one stream waiting
// for the other on the device), and unmaps old free pages before it maps
// new ones. POLICY.md measures each part. Under the policy with several
// streams, every operation takes every lock.
//
// Config.Policy = PolicyPlanned (gpumem_policy:planned) is that policy
// with one pool (every request from the large pool's 2 MiB pages, so
// small blocks count in large_pool stats; freed pages stay mapped until
// the device grows short) until a step (MarkStep; in a program that
// marks none, a period in the order of its allocations and frees that
// it finds itself, whatever their sizes)
// repeats the one before it, or fits the largest sizes of the steps
// before it (batches of varying length): it then packs the step's
// allocations offline, at those largest sizes (each at the lowest place
// free in its lifetime where the program marks the steps, else at the
// smallest; a plan whose steps find places taken is packed again the
// second way; a step too large to pack so within a bound on the work
// at its boundary, which holds the lock, more than about 5,800 blocks
// in use at once, in the order its blocks come into use), into an arena
// of free memory and serves the steps that
// fit it (same order, the same sizes or smaller ones: a short last
// batch) from there, with no fit and no device call; the step's allocations on other streams than its main one
// (an input copied on a stream of its own) keep their places in the
// pattern and are served by the policy (in marked steps), as is a request whose place is
// taken, and one that departs from the pattern (larger, or on another
// stream than the plan's at its position),
// and the next step that fits is planned anew (a step of another shape
// now and then, an optimizer's step every few micro-batches, keeps the
// plan; a plan that ends is kept, and taken up again when its steps come
// back, training after an evaluation). Memory kept across steps stays out
// of the plan. PlanStats says what the plans served.
// Where steps do not repeat, most of them log nothing (runs of quiet
// steps, up to 64 long), so a repeat is planned at most 66 steps late.
//
// # Design
//
// DESIGN.md, beside this file, describes how the allocator works inside:
// its data structures (segments, blocks, pools, shards, the free indexes,
// the address tables, the routes, the ledger), the ladders Alloc and Free
// follow (out of memory included), the invariants CheckInvariants checks,
// the lock rules, the policy's rules and which file holds what.
package allocator
