// Package stats holds what a gpumem allocator counts and the ways to read
// it: the memory_stats key space of PyTorch, PyTorch's memory summary
// table, a one-line report and an slog value.
//
// Every stat means what it means in PyTorch 2.6's CUDA caching allocator,
// so that numbers can be compared one for one with a PyTorch run, and tools
// written against torch.cuda.memory_stats() port over by key.
//
// # Model
//
// A Stat is one tracked quantity with four fields: Current, the value now;
// Peak, the highest Current since the last peak reset; Allocated, the sum of
// every increase; Freed, the sum of every decrease. Allocated and Freed only
// grow (until ResetAccumulated), so Allocated - Freed == Current as long as
// no reset has run.
//
// A StatArray is one Stat per pool. The allocator keeps two pools of
// blocks: the small pool, for requests whose rounded size is at most 1 MiB,
// carved out of 2 MiB segments, and the large pool for the rest. Entry All
// is the aggregate. Every change updates All and the entry of the block's
// pool together, so for Current, Allocated and Freed, All is the sum of the
// two pools; Peak is not additive: All.Peak is the peak of the sum, which
// can be below the sum of the pool peaks.
//
// A DeviceStats is everything one allocator counts for one device: nine
// StatArrays, two pool-less Stats for oversize blocks, five event counters
// and the max_split_size setting.
//
// # When each stat moves
//
// The rules, as PyTorch's allocator applies them:
//
//   - Allocation, AllocatedBytes, Active, ActiveBytes and RequestedBytes
//     rise together when a block is handed to a caller: by one block, by
//     the block's size and by the size the caller asked for.
//   - The allocated stats and the active ones differ in when they fall. A
//     free by the caller lowers Allocation and AllocatedBytes at once. Active,
//     ActiveBytes and RequestedBytes fall only when the block truly
//     returns to the cache: at once for a block used on its own stream
//     only, but for a block recorded on other streams (RecordStream) only
//     after the events recorded on those streams have completed. In between
//     the block is active but not allocated: PyTorch's "active pending
//     free" memory is ActiveBytes - AllocatedBytes.
//   - RequestedBytes counts the sizes callers asked for; AllocatedBytes and
//     ActiveBytes count whole blocks: the request rounded up (to a multiple
//     of 512 bytes, or by the power-of-two divisions setting), plus any
//     remainder too small to split off. The gap between them is the cost of
//     rounding.
//   - Segment and ReservedBytes rise when the allocator obtains device
//     memory (cudaMalloc) and fall when it gives a segment back (EmptyCache,
//     the flush before a retry, garbage collection). An expandable segment
//     is not counted in Segment at all: mapping pages into it raises
//     ReservedBytes only, and unmapping lowers it.
//   - InactiveSplit and InactiveSplitBytes count free blocks that share
//     their segment with other blocks. Such a block is cached memory that
//     cannot be given back to the device without the rest of its segment
//     ("non-releasable"). A free block that fills its whole segment is not
//     counted, and blocks of expandable segments never are. The moves:
//     splitting a whole free segment adds its free remainder (one block,
//     its bytes); cutting a request out of an already split free block
//     leaves the count alone and lowers the bytes by what was cut; handing
//     out an already split free block whole removes it; on free, free
//     neighbours merged into the block are removed and the merged block is
//     added back if it still does not fill its segment.
//   - OversizeAllocations counts active blocks of at least max_split_size
//     bytes and OversizeSegments segments of that size. With the default
//     (unlimited) max_split_size both stay zero.
//   - NumAllocRetries counts device allocations retried after the
//     allocator freed its whole cache; NumOOMs out-of-memory errors
//     returned to callers; NumSyncAllStreams waits for every outstanding
//     stream event (EmptyCache, and the flush before a retry);
//     NumDeviceAlloc and NumDeviceFree successful device calls, counting
//     page mappings and unmappings of expandable segments as calls.
//   - MaxSplitSize is the configured max_split_size in bytes, or -1 when
//     unlimited (PyTorch reports SIZE_MAX, which reads as -1).
//
// So, for an allocator at rest with consistent stats:
//
//	0 <= RequestedBytes <= ActiveBytes    (per block: requested <= size)
//	AllocatedBytes <= ActiveBytes
//	ActiveBytes + InactiveSplitBytes <= ReservedBytes
//	Current <= Peak                       (every Stat)
//
// # The key space
//
// PyTorch flattens its stats into keys such as "allocated_bytes.all.peak",
// "segment.small_pool.current", "oversize_allocations.freed" and
// "num_alloc_retries"; DeviceStats.Map lists all NumKeys of them with their
// meanings. Map builds the dictionary, Get reads one key without building
// anything, Entries walks them in PyTorch's sorted order, Keys lists them
// and FromMap goes back from a dictionary (a PyTorch run's memory_stats
// dumped as JSON, say) to a DeviceStats. Allocated, Reserved, MaxAllocated
// and MaxReserved are PyTorch's memory_allocated, memory_reserved and their
// max_ variants.
//
// # Reports
//
// Summary prints PyTorch's memory_summary table, the same to the character
// but for the title. FormatSize writes a byte count as PyTorch's
// out-of-memory message does. Line gives a one-line progress report for a
// training loop; a DeviceStats is an slog.LogValuer. The expvar bridge
// (/debug/vars) is package expvarstats, so that importing stats registers
// nothing.
//
// # Copies and concurrency
//
// A DeviceStats is a plain value. The allocator keeps its own under its
// lock and hands out copies; a copy is a consistent snapshot that nothing
// changes behind the reader, so reading it needs no lock, and the functions
// of this package read only what they are given. Several goroutines may read
// one DeviceStats at once; a goroutine that updates one must not share it
// without its own lock. This package has no lock and no global state.
package stats
