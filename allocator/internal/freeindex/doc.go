// Package freeindex holds the caching allocator's memory as data: the
// segments it obtained from the device, the blocks that tile them, the two
// pools, and the free index, which finds the best fit among a stream's
// cached blocks and hands blocks out and takes them back. The allocator
// (package allocator) decides when to call the device, what to count and
// which locks to take; this package knows nothing of devices, statistics
// or locks, and imports nothing of the allocator.
//
// # Model
//
// A Segment is one device allocation (or one expandable segment: an
// address range backed by memory page by page). Its Blocks tile it
// exactly, in address order, linked through Prev and Next. A block is
// allocated (handed to a caller), pending (freed, waiting for other
// streams' work), free (cached, in its free index) or unmapped (an
// expandable segment's range with no memory behind it, in its Pool's
// unmapped B-tree). A Pool is the small (blocks of at most 1 MiB) or the
// large one.
//
// An Index holds the free blocks of one pool on one stream, ordered by
// (size, address), in the structure of its Kind, fixed at Init:
//
//   - KindSmall: size buckets (sizeBuckets, buckets.go), one class per 512
//     bytes up to 2 MiB, found by bit scans, each class a heap by address.
//     For the small pool of PyTorch's plain segments. They remember their
//     last best fit until they change (Remembered), which makes the cached
//     alloc-and-free of one size a table lookup.
//   - KindLarge: large buckets (largeBuckets, large.go) for the blocks of
//     up to 128 MiB, classes of 512 bytes found by a three-level bitmap,
//     the classes in use in an open-addressing table, each a heap by
//     address; a B+ tree (freeTree, tree.go) above. For every other pool of a stream that has
//     a shard of its own. The index that takes a stream's small requests
//     and the policy's large pool keep their classes in pages by word of
//     the bitmap instead of the table (KeepPages, pages.go), a word of
//     classes up to 2 MiB keeping its page while it is empty; the close
//     fit reads whole words of the bitmap of classes above 1 MiB from
//     their counts and lowest blocks (closefit.go), and none where the
//     bitmap shows no class above the best fit's within its limit
//     (FitClose). A bound of the classes that hold blocks
//     (largeBuckets.top) answers a fit above every block without the
//     bitmap: what the policy's lends ask of most other streams.
//   - KindTree: the tree alone, for the many streams of the allocator's
//     cold shard, where size classes would cost tens of KiB a stream.
//     Their free blocks are also in their Pool's cold view (cold.go), so
//     that a walk of every stream's cache visits the view, not each
//     stream.
//
// The allocator uses an Index through its methods alone: BestFit (the
// one best fit, with PyTorch's rule of expandable segments,
// ExpandableBestFit) and Remembered; Take (hand out a block, split or
// whole); Put (merge a freed block or an unmapped range with its
// neighbours of the same kind, PyTorch's try_merge_blocks, and file the
// result); Insert and Remove; the ordered walks Fit, AscendAtLeast,
// CloseFit, FitClose (the two in one) and DescendBelow; MayFit (whether a
// fit may find a block, asked without settling); Largest; the whole free
// segments (AppendWholes, EachWhole); Each; the segments (NewSegment,
// which makes one and its first block; MapPages and UnmapPages, which
// make an expandable segment's pages, just mapped or unmapped, a block of
// their own; ForgetSegment; the count, SegmentAdded and SegmentRemoved); Flush;
// and its checks (Check, CheckSegments, Pool.CheckOwners). A Pool is read
// through its methods too (its unmapped ranges: AscendUnmapped,
// EachUnmapped, HasUnmapped, UnmappedLen; its ColdView). PtrTable is the
// map from address to allocated block that each shard keeps; Spares its
// recycled block structs.
//
// # Whose fields
//
// The structure of the memory is this package's alone: every field that
// places a block (its address, size, stream, pool, segment, neighbours,
// whether it is indexed or unmapped, its age base), every field of a
// Segment, of a Pool but GCCalls, and of an Index but Merged is
// unexported, written only here, and read by the allocator through the
// method of its name (Block.Ptr, Segment.Head, Index.NSeg, ...), small
// enough to be inlined. The exported fields are the allocator's, written
// only by it:
//
//   - Block.Requested, Allocated, Phase, EventCount and Uses:
//     its bookkeeping of a block it handed out (Uses names the
//     allocator's record of the streams the block was recorded on). This package reads them only
//     to merge free neighbours alone (Block.Busy) and to check that the
//     struct kept for the next split is unused, and zeroes them when it
//     recycles a struct.
//   - Pool.GCCalls: the clock of block ages, which the allocator's
//     searches advance; this package reads it to stamp what it files.
//   - Index.Merged: the planned policy's mark of a small-pool index it
//     does not use; this package does not read it.
//
// The allocator's tests of its checks break the structure on purpose
// through the Break methods (breaks.go), which nothing else calls.
//
// # The pending split
//
// The cached path is an alloc and a free of one size in a loop. Take
// splits the front of a free block off for the request and leaves the
// rest filed under the key of the whole block (pend, with its key from
// before the split): the usual next step, the free of the front, merges
// the two back into that very key (the unsplit in Put), so the index's
// structures never change. Every other method that reads or changes the
// index moves the rest to its new key first (settle). The struct of the
// front merged back is kept for the next split (front), so that the loop
// neither recycles nor clears a struct. In size buckets that hand out one
// size in a loop even that merge waits: Hold keeps the freed front
// (held), and a request of its size
// whose best fit the buckets still remember as the block from before the
// split takes it again as it is (Retake), so that the loop neither
// splits nor merges; any other use merges the two first (settle, Unhold),
// and until then the front and the rest stand for that one block. An
// Index of KindTree never keeps a pending split.
//
// # The held arena
//
// The allocator's planned policy hands blocks out at addresses planned
// in advance (Carve). In an index of the large kind, a carve from a
// block of an expandable segment takes that free block out of the large
// buckets or the tree and holds its range (arena.go): while held, the
// carves from its free blocks and the frees of its blocks (Put, when no
// free neighbour is filed in the index) change the segment's list alone,
// each change stamping the age base filing would; pend is then arenaMark,
// so that every other method, which settles a pending split first, files
// the range's free blocks back instead (fileArena, keeping their age
// bases), and the index answers as if they had never left it. The
// range's first block keeps its struct while held (a carve at its start
// hands that struct out, a merge keeps the lower struct), where the
// filing back starts.
//
// # Invariants
//
// Checked by Index.Check, Index.CheckSegments and Pool.CheckOwners, which
// the allocator's CheckInvariants calls:
//
//   - an Index holds exactly the free blocks of its pool and stream, each
//     marked Indexed and filed where a lookup finds it, in the structure
//     its size and the Index's Kind say; the structures of other kinds are
//     absent; a pending split's rest follows its front, under the key of
//     both, and the front's lower neighbour is not free (the block split
//     had none, and every free is filed by Put, which settles the split
//     first: so the front's free, held or not, merges with the rest
//     alone); a held front is that front, free, in no structure;
//   - the blocks that fill a plain segment (those releasing the cache
//     returns to the device) are known without a walk: in size buckets
//     the 2 MiB class; in the other kinds, wholes lists exactly them;
//   - NSeg counts the segments of the Index's pool and stream, and the
//     Index is among its Pool's owners exactly when NSeg > 0;
//   - the struct kept for the next split is unused, of the Index's stream
//     and pool;
//   - a held arena's range starts at its first block, of an expandable
//     segment of the Index's pool and stream, and ends at a block's end;
//     its free blocks are in no structure and none neighbours another
//     free block (the allocator's check: every other free block is
//     filed).
//
// The allocator's check covers the rest: the segments (their blocks tile
// them; two free neighbours never both exist, nor two unmapped ones; a
// block's size is a positive multiple of MinBlockSize) and the cold view
// (it holds exactly the free blocks of the pool's cold indexes, under
// the low_fragmentation policy the lenders among them, and lists exactly
// the cold indexes with whole free segments).
//
// The gpumem_invariants build also panics when Take finds a pending split
// (the fit that found its block settles it), unless it takes whole a
// block in no index (Carve's).
//
// # Locking
//
// Nothing here takes a lock. An Index, the blocks of its segments, and
// the PtrTable and Spares it is given belong to one shard of the
// allocator, named by Index.Shard, and are guarded by that shard's lock
// (or by every lock, the allocator's "world"). A Pool's fields and the
// cold view change with every lock held, but Pool.GCCalls, the clock of
// block ages, which the allocator's fast path may count while one shard
// is the only one. The methods assume the caller holds what guards what
// they touch.
//
// # Files
//
// block.go: blocks, segments, pools, spare structs, and the making and
// mapping of segments. index.go: Index, its
// best fit, split, merge and filing. held.go: the held front (Hold,
// HoldFront, Retake, RetakeParked, Unhold). expandable.go: ExpandableBestFit,
// PyTorch's choice among blocks that could grow. walks.go: its ordered walks and its
// list of whole free segments. index_check.go: its checks. buckets.go,
// large.go, tree.go and tree_check.go: its structures. heap.go: the heap of a size class.
// hash.go: the hash. ptrtable.go: PtrTable. cold.go: the cold view.
// carve.go: Carve and Containing, for a block handed out at an address
// planned in advance (the allocator's planned policy); arena.go: the
// held arena Carve keeps. breaks.go: the
// breaks the allocator's check tests make.
package freeindex
