// This file holds the low_fragmentation policy's cross-stream reuse: a
// free block cached on one stream lent to a request on another, ordered
// on the device by events instead of host waits.

package allocator

import (
	"math/bits"
	"slices"

	"github.com/gpumem/gpumem/allocator/internal/freeindex"
	"github.com/gpumem/gpumem/device"
)

// Lending, as RMM's stream-ordered pools and CUDA's stream-ordered
// allocator reuse memory across streams:
//
//   - A request that no free block of its own stream can serve takes the
//     best-fitting free block of another stream's cache (the lender's),
//     before any device allocation. The borrowing stream first waits, on
//     the device, for the lender's stream (device.StreamWaiter's
//     WaitStream: on CUDA an event the device keeps, recorded there now):
//     the work queued there so far, which includes every use of the block
//     before it was freed, runs before the borrower's work that follows.
//     A wait of the borrower on the lender made after the block was freed
//     (it was filed in the free index before the search count at which
//     that wait was made) already orders it: no new one.
//   - The block keeps its segment's stream (blocks never change stream)
//     and its shard: it stays in the lender's address table and counts,
//     so that Free finds it by its address as any block; while allocated
//     it is recorded on the borrower (Allocator.uses), which makes its
//     Free take the world, and marked Lent, with the borrower its
//     Borrower (policyState.borrowed counts them). Lending
//     reads and changes two streams' shards: it runs in the world, as
//     every operation under the policy does once a second stream has a
//     shard (shards.go).
//   - When the caller frees it, the lender's stream waits for the
//     borrower's stream, and the block returns to the lender's cache at
//     once, free for any stream: the lender's later work follows the
//     borrower's, and a later borrower waits for the lender's.
//     Streams recorded with RecordStream are waited for on the host as
//     always (the block is pending until their events are done).
//   - Streams named by RecordStream are neither lent to nor lent from:
//     the allocator waits for their events on the host, and a device wait
//     would chain another stream's progress into those host waits (a
//     RecordStream on a lender after it lent makes the return of the block
//     wait on the host for the borrower, as for any recorded stream).
//   - Without the StreamWaiter capability the waits are made on the host
//     (SynchronizeEvent), which is correct but blocks the caller.
//   - If a wait fails, the block is not lent (the ladder goes on to
//     the device), or at the free the borrower stays recorded and the free
//     waits for it on the host.

// lendLocked finds the best-fitting free block of x's pool on a stream
// other than x's for a request of size (rounded) bytes, and makes x's
// stream wait for the lender's work so far. It returns the block and the
// free index it is in, or x and nil when lending is off, when no block
// fits, or when the wait fails.
func (a *Allocator) lendLocked(x *freeindex.Index, size uint64) (*freeindex.Index, *freeindex.Block) {
	p, s := x.Pool(), x.Stream()
	if !a.pol.lend || a.recordedLocked(x) {
		return x, nil
	}
	var best *freeindex.Block
	var from *freeindex.Index
	// Any order: the best is the smallest, then lowest, block. The free
	// indexes of the pool that hold segments but the cold shard's
	// (hotIndexesLocked's walk, written out: it runs at every lend), one
	// by one; the cold shard's streams through the cold view, from the
	// request's size up, to the first that may serve (what may serve is
	// a bound on the size, splitRule.servesBelow).
	ids := *a.byID.Load()
	for _, y := range p.Owners() {
		sh := ids[y.Shard()]
		if sh.cold || sh.stream == s || sh.hostWaited {
			continue
		}
		a.visited++
		if !y.MayFit(size) {
			continue // most often, on offload: 152,347 of 242,820
		}
		b := y.Fit(size)
		if b == nil || !a.rule.mayServe(b.Size(), size) {
			continue
		}
		if best == nil || b.Size() < best.Size() || b.Size() == best.Size() && b.Ptr() < best.Ptr() {
			best, from = b, y
		}
	}
	p.Cold().AscendLenders(size, func(b *freeindex.Block) bool {
		a.visited++
		if !a.rule.mayServe(b.Size(), size) || best != nil && (b.Size() > best.Size() || b.Size() == best.Size() && b.Ptr() > best.Ptr()) {
			return false
		}
		if b.Stream() == s {
			return true
		}
		best, from = b, b.Seg().Free()
		return false
	})
	if best == nil {
		return x, nil
	}
	// A wait made since best was freed covers it: a stream that borrows
	// several blocks freed together waits once.
	key := lendKey{borrower: s, lender: best.Stream(), small: p.Small()}
	if w := a.pol.waited.slot(key); !w.waited || w.at <= best.GCCountBase() {
		if !a.waitForLocked(s, best.Stream()) {
			return x, nil
		}
		w.waited, w.at = true, p.GCCalls
	}
	a.pol.lent++
	return from, best
}

// lendKey names the waits lendLocked made: borrower waited on the device
// for lender's work queued before the pool's search count was the value
// kept for it.
type lendKey struct {
	borrower, lender device.Stream
	small            bool
}

// lendWaits keeps, per lendKey, whether the borrower waited for the
// lender and the pool's search count at the last wait, as lendLocked
// reads and sets them on every lend: a table of open addressing with
// linear probing, at most half full, whose entries stay (a borrower that
// waited on a lender once is likely to again), where a Go map would hash
// the key's 17 bytes on every lend.
type lendWaits struct {
	slots []lendWait
	n     int
	shift uint8
}

type lendWait struct {
	key    lendKey
	used   bool  // the slot holds key's entry
	waited bool  // key's borrower waited for its lender...
	at     int64 // ...when the pool's search count was at
}

// slot returns the entry of k, made (not waited) if it has none.
func (w *lendWaits) slot(k lendKey) *lendWait {
	if 2*(w.n+1) > len(w.slots) {
		w.grow()
	}
	mask := len(w.slots) - 1
	for i := w.home(k); ; i = (i + 1) & mask {
		e := &w.slots[i]
		if !e.used {
			e.key, e.used = k, true
			w.n++
			return e
		}
		if e.key == k {
			return e
		}
	}
}

// home is k's first slot: Fibonacci hashing of the two streams and the
// pool.
func (w *lendWaits) home(k lendKey) int {
	h := uint64(k.borrower)*0x9e3779b97f4a7c15 ^ uint64(k.lender)
	if k.small {
		h = ^h
	}
	return int((h * 0x9e3779b97f4a7c15) >> w.shift)
}

// grow doubles the table (16 slots at first) and files its entries anew.
func (w *lendWaits) grow() {
	old := w.slots
	n := max(2*len(old), 16)
	w.slots, w.shift, w.n = make([]lendWait, n), uint8(64-bits.TrailingZeros(uint(n))), 0
	for _, e := range old {
		if e.used {
			*w.slot(e.key) = e
		}
	}
}

// waitForLocked makes stream s wait for the work queued on stream t so
// far: on the device when it can (one WaitStream call, no event to keep
// or release), else on the host. It reports whether the wait was made.
func (a *Allocator) waitForLocked(s, t device.Stream) bool {
	if w := a.pol.waiter; w != nil {
		return w.WaitStream(s, t) == nil
	}
	e, err := a.dev.RecordEvent(t)
	if err != nil {
		return false
	}
	err = a.dev.SynchronizeEvent(e)
	a.events.Release(e) // a release the device refuses is retried by the events queue
	return err == nil
}

// lentLocked records b, just handed out by takeLocked from another
// stream's cache while pol.lending named s (so that observers see the
// allocation on s), as lent to s.
func (a *Allocator) lentLocked(b *freeindex.Block, s device.Stream) {
	a.pol.lending = false
	b.Lent, b.Borrower = true, s
	a.pol.borrowed++
	a.addUseLocked(b, s, false)
}

// returnLentLocked is deferFreeLocked under the policy: if b was lent,
// the lender's stream first waits for the borrower's work, and the free
// then waits only for the other streams b was recorded on. If that wait
// cannot be made, the borrower stays recorded and the free waits for it
// as for any recorded stream. On an error nothing changed.
func (a *Allocator) returnLentLocked(b *freeindex.Block) (int, error) {
	if !b.Lent {
		return a.deferFreeLocked(b)
	}
	s := b.Borrower
	if a.recordedLocked(b.Seg().Free()) || !a.waitForLocked(b.Stream(), s) {
		n, err := a.deferFreeLocked(b)
		if err == nil {
			a.returnedLocked(b)
		}
		return n, err
	}
	// The borrower leaves b's record (it is there, first: lentLocked);
	// on an error it goes back where it was.
	u := &a.useRecs[b.Uses-1]
	at := slices.Index(u.streams, s)
	u.streams = slices.Delete(u.streams, at, at+1)
	if len(u.streams) == 0 {
		a.dropUsesLocked(b)
		a.returnedLocked(b)
		return 0, nil
	}
	n, err := a.deferFreeLocked(b)
	if err != nil {
		u = &a.useRecs[b.Uses-1]
		u.streams = slices.Insert(u.streams, at, s) // nothing changed (the device wait made is harmless)
		return 0, err
	}
	a.returnedLocked(b)
	return n, nil
}

// returnedLocked unmarks b, a lent block that returned to its lender.
func (a *Allocator) returnedLocked(b *freeindex.Block) {
	b.Lent, b.Borrower = false, 0
	a.pol.borrowed--
}

// noteRecordedLocked remembers that RecordStream named stream s.
// The cold shard's blocks of s leave the cold views' lenders.
func (a *Allocator) noteRecordedLocked(s device.Stream) {
	p := a.pol
	if sh := a.lookupShard(s); sh != nil && sh.hostWaited {
		return // named before (the shard's flag, a map lookup spared)
	}
	if _, ok := p.hostWaited[s]; ok {
		return
	}
	p.hostWaited[s] = struct{}{}
	for _, sh := range a.shards {
		if sh.stream == s && !sh.cold {
			sh.hostWaited = true
		}
	}
	if xs := a.coldIdx[s]; xs != nil {
		for i := range xs {
			x := &xs[i]
			x.Each(func(b *freeindex.Block) bool {
				x.Pool().Cold().Unlend(freeindex.KeyOf(b))
				return true
			})
		}
	}
}

// recordedLocked reports whether RecordStream ever named the stream of
// free index x: the flag of x's shard, or, for the cold shard's streams,
// which share it, the policy's set.
func (a *Allocator) recordedLocked(x *freeindex.Index) bool {
	if sh := a.shardOf(x); !sh.cold {
		return sh.hostWaited
	}
	return a.pol.hostWaitedLocked(x.Stream())
}

// hostWaitedLocked reports whether RecordStream ever named stream s.
func (p *policyState) hostWaitedLocked(s device.Stream) bool {
	_, ok := p.hostWaited[s]
	return ok
}
