// This file holds the ledger's records of a free index's held front
// (freeindex.Index.Hold and Retake): the free of the front that leaves
// its merge waiting, and the hand-out of the front again. Each records
// what finishFreeLocked and takeLocked would for the merge and the split
// that do not happen; the free leaves a credit (shard.credit) that lets
// the hand-out again skip the limit tests. Held fronts are of size
// buckets, whose blocks are at most 2 MiB, never oversize
// (max_split_size is at least the large segment size, more than 10 MiB:
// Config.validate), so the oversize counts do not move. It is part of
// the ledger: TestOnlyTheLedgerWrites lets the ledger's files, and no
// other, change the counts.

package allocator

import (
	"github.com/gpumem/gpumem/allocator/internal/freeindex"
	"github.com/gpumem/gpumem/stats"
)

// retakeLocked hands out again f, the held front of its free index x's
// pending split, of the request's rounded size, of shard sh, for a
// request of requested bytes: it takes f out of x
// (freeindex.Index.Retake), and records the hand-out that takeLocked
// would make of the block from before the split, whose rest stays
// pending, as takeLocked records it; x has nothing more to do. A front
// that its free left parked in the address table
// (freeindex.Index.Parked) is there already. It returns f. The hand-out
// with a credit (which no free leaves while observers listen) of a
// parked front, the loop's, calls nothing; retakeOther makes every
// other.
func (a *Allocator) retakeLocked(sh *shard, x *freeindex.Index, f *freeindex.Block, requested uint64) *freeindex.Block {
	if sh.credit != f || requested > sh.creditReq || sh.largeRises() != sh.creditLarge || !x.IsParked() {
		return a.retakeOther(sh, x, f, requested)
	}
	x.RetakeParked()
	// The counts come back to at most where they were before f's free
	// (shard.credit), in f's phase, the current one still (only the
	// world changes it, and it clears the credit): no limit to test.
	// inactive_split moves back as that free moved it (creditSplit).
	const k = qSmall // size buckets are a small pool's (freeindex.Index.PoolIdx)
	n := int64(f.Size())
	st := &sh.st
	st[stats.Allocation].grow(k, 1)
	st[stats.AllocatedBytes].grow(k, n)
	st[stats.RequestedBytes].grow(k, int64(requested))
	if rest := -sh.creditSplit; rest > 0 { // the segment was whole
		st[stats.InactiveSplit].grow(k, 1)
		st[stats.InactiveSplitBytes].grow(k, rest)
	} else {
		st[stats.InactiveSplitBytes].pool[k&1].Carry(rest)
	}
	if a.phased {
		sh.ph[a.phase].grow(n)
	}
	f.Allocated, f.Requested = true, requested // f.Phase is the current phase
	return f
}

// retakeOther is retakeLocked's hand-out again of f without a credit
// (observers may listen), or of a front not parked: it takes f out of x,
// its counts tested against their limits (retakeCounted), f added to the
// address table unless parked, the observers told.
func (a *Allocator) retakeOther(sh *shard, x *freeindex.Index, f *freeindex.Block, requested uint64) *freeindex.Block {
	x.Retake()
	n := int64(f.Size())
	a.retakeCounted(sh, f, n, int64(requested))
	f.Allocated, f.Requested = true, requested
	if a.phased { // else 0 (checkPhasesLocked)
		f.Phase = a.phase
	}
	if !x.Parked() && !sh.live.PutHome(f) {
		sh.live.Put(f)
	}
	if a.hooks != 0 {
		a.handedOutLocked(sh, f, uint64(n))
	}
	return f
}

// retakeCounted records retakeLocked's hand-out of f, of n bytes, requested as
// asked, without a credit: each count tested against its limits, as
// takeLocked does.
func (a *Allocator) retakeCounted(sh *shard, f *freeindex.Block, n, requested int64) {
	const k = qSmall
	// The block from before the split is f and the rest after it, in a
	// plain segment: its split makes the rest a free block of a split
	// segment, and takes f's bytes from inactive_split if it was one.
	splitBlocks, splitBytes := int64(1), int64(f.Next().Size())
	if f.Prev() != nil || f.Next().Next() != nil {
		splitBlocks, splitBytes = 0, -n
	}
	st := &sh.st
	var rows uint32 // the rows past a limit, as in takeLocked
	if st[stats.Allocation].bump(k, 1) {
		rows |= 1<<stats.Allocation | activeRows
	}
	if st[stats.AllocatedBytes].bump(k, n) {
		rows |= 1<<stats.AllocatedBytes | activeRows
	}
	if st[stats.RequestedBytes].bump(k, requested) {
		rows |= 1 << stats.RequestedBytes
	}
	if !sh.activeImplied && sh.activeOver(k) {
		rows |= activeRows
	}
	if st[stats.InactiveSplit].move(k, splitBlocks) {
		rows |= 1 << stats.InactiveSplit
	}
	if st[stats.InactiveSplitBytes].move(k, splitBytes) {
		rows |= 1 << stats.InactiveSplitBytes
	}
	if a.phased && sh.phaseCount(a.phase).add(n) {
		rows |= phaseBit
	}
	if rows != 0 {
		a.takeExceeded(sh, k, rows, n, requested, splitBlocks, splitBytes, false)
	}
}

// freeHeldLocked is finishFreeLocked for a caller's free of b that its
// free index held (freeindex.Index.Hold: b is the front of its pending
// split): the counts are the unsplit's, whose rest goes into the block
// from before the split, counted in inactive_split if its segment stays
// split; the merge itself waits.
func (a *Allocator) freeHeldLocked(sh *shard, b *freeindex.Block) {
	const k = qSmall // size buckets are a small pool's (freeindex.Index.PoolIdx)
	st, size := &sh.st, int64(b.Size())
	rest := b.Next()
	blocks, bytes := int64(-1), -int64(rest.Size())
	if b.Prev() != nil || rest.Next() != nil {
		blocks, bytes = 0, size
	}
	st[stats.Allocation].pool[k&1].Drop(1)
	st[stats.AllocatedBytes].pool[k&1].Drop(size)
	credit := b
	if a.phased {
		c := &sh.ph[b.Phase]
		c.bytes.Drop(size)
		c.blocks.Drop(1)
		if b.Phase != a.phase {
			credit = nil // its hand-out again counts in another phase: retakeCounted
		}
	}
	st[stats.RequestedBytes].pool[k&1].Drop(int64(b.Requested))
	if bytes > 0 { // blocks is zero
		if st[stats.InactiveSplitBytes].bump(k, bytes) {
			a.freeExceeded(sh, k, b, true, blocks, bytes)
		}
	} else {
		st[stats.InactiveSplit].pool[k&1].Carry(blocks)
		st[stats.InactiveSplitBytes].pool[k&1].Carry(bytes)
	}
	if a.hooks&hookListen != 0 {
		a.freedLocked(sh, b, true)
		credit = nil // its hand-out again tells them: retakeOther
	}
	sh.credit, sh.creditReq, sh.creditSplit, sh.creditLarge = credit, b.Requested, bytes, sh.largeRises()
	b.Requested = 0
}
