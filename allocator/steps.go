// This file holds the counts of live blocks at step boundaries (MarkStep,
// for Leaks), kept from what changed since the last boundary, or from a
// walk of the live blocks where fewer blocks are live than changed.

package allocator

import (
	"math/bits"

	"github.com/gpumem/gpumem/allocator/internal/freeindex"
)

// A stepLog is one shard's count of its live (allocated) blocks by
// (phase, requested size) at the last step boundary, and the changes
// since: the ledger logs each block handed out (+1) and each free
// requested (-1) once a step has been marked (Allocator.stepping), and the
// next boundary applies them, so that a boundary costs the operations
// since the last one rather than a walk of every live block, unless
// those are fewer. The log is bounded: past minStepLog entries and the
// live blocks at the last boundary, it stops and the next boundary counts
// the shard's live blocks instead (lost). Both go through the same
// netting table (leakNets), at about the same cost a block or an entry,
// so the boundary pays the lesser of the two: a step that hands out and
// frees more blocks than it keeps (a training step: BERT's logs 2,008
// changes over 589 live blocks) is counted from its live blocks, a loop
// that marks every few operations over many live blocks from its log.
// Guarded by the shard's lock.
type stepLog struct {
	alive map[leakKey]int64 // at the last boundary; nil until one has counted the shard
	log   []stepDelta       // since the last boundary
	limit int               // the log's bound until the next boundary
	lost  bool              // the log passed its bound: count the live blocks
}

type stepDelta struct {
	key leakKey
	d   int64
}

// minStepLog is the least bound of a shard's step log.
const minStepLog = 64

// note logs that b became live (d = +1) or stopped being so (-1).
func (l *stepLog) note(b *freeindex.Block, d int64) {
	if len(l.log) < l.limit {
		l.log = append(l.log, stepDelta{leakKey{b.Phase, b.Requested}, d})
	} else {
		l.lost = true
	}
}

// markStepLocked counts the live blocks of every shard by (phase,
// requested size) at a step boundary, and from now on logs the changes.
func (a *Allocator) markStepLocked() map[leakKey]int64 {
	a.stepping = true
	a.setHooksLocked()
	total := make(map[leakKey]int64)
	for _, sh := range a.shards {
		l := &sh.steps
		if l.alive == nil || l.lost {
			// Counted in the netting table first, as a log is, then
			// copied: a live block costs an addition there, where the
			// map would hash it and find its entry.
			a.stepNets.reset()
			sh.live.Each(func(b *freeindex.Block) {
				a.examined++
				a.stepNets.add(leakKey{b.Phase, b.Requested}, 1)
			})
			if l.alive == nil {
				l.alive = make(map[leakKey]int64)
			} else {
				clear(l.alive)
			}
			a.stepNets.each(func(k leakKey, n int64) { l.alive[k] = n })
		} else {
			// The log's changes netted by key first: most blocks of a step
			// are handed out and freed within it, and their +1 and -1
			// cancel in the table, which the map would hash twice each.
			a.stepNets.reset()
			for _, d := range l.log {
				a.stepNets.add(d.key, d.d)
			}
			a.stepNets.each(func(k leakKey, d int64) {
				if n := l.alive[k] + d; n != 0 {
					l.alive[k] = n
				} else {
					delete(l.alive, k)
				}
			})
		}
		clear(l.log)
		l.log, l.lost = l.log[:0], false
		l.limit = max(minStepLog, sh.live.Len())
		for k, n := range l.alive {
			total[k] += n
		}
	}
	return total
}

// checkStepsLocked checks that every shard's count at the last boundary
// and log since give its live blocks now.
func (a *Allocator) checkStepsLocked(bad func(string, ...any)) {
	if !a.stepping {
		return
	}
	for _, sh := range a.shards {
		l := &sh.steps
		if l.alive == nil || l.lost {
			continue // the next boundary counts the shard
		}
		want := make(map[leakKey]int64)
		sh.live.Each(func(b *freeindex.Block) { want[leakKey{b.Phase, b.Requested}]++ })
		got := make(map[leakKey]int64, len(l.alive))
		for k, n := range l.alive {
			got[k] = n
		}
		for _, d := range l.log {
			got[d.key] += d.d
		}
		for k, n := range got {
			if n != want[k] {
				bad("shard of stream %d: %d live blocks of phase %d and %d bytes requested by its step log, %d in its table", sh.stream, n, k.phase, k.size, want[k])
			}
			delete(want, k)
		}
		for k, n := range want {
			if n != 0 {
				bad("shard of stream %d: %d live blocks of phase %d and %d bytes requested are not in its step log", sh.stream, n, k.phase, k.size)
			}
		}
	}
}

// leakNets sums changes by leakKey, for markStepLocked: a table of open
// addressing with linear probing, at most half full, reset for each log
// and kept for the next (Allocator.stepNets). It grows with the keys,
// not with the log or the live blocks it counts: their keys are few (a
// step's blocks come in few sizes).
type leakNets struct {
	slots []leakNet
	used  []int32 // the slots filled, in the order they were
	shift uint8
}

type leakNet struct {
	key  leakKey
	d    int64
	used bool
}

// reset empties the table.
func (t *leakNets) reset() {
	for _, i := range t.used {
		t.slots[i] = leakNet{}
	}
	t.used = t.used[:0]
}

// add adds d to k's sum.
func (t *leakNets) add(k leakKey, d int64) {
	if 2*(len(t.used)+1) > len(t.slots) {
		t.grow()
	}
	mask := len(t.slots) - 1
	h := (k.size ^ uint64(k.phase)<<48) * 0x9e3779b97f4a7c15
	for i := int(h >> t.shift); ; i = (i + 1) & mask {
		e := &t.slots[i]
		if !e.used {
			*e = leakNet{key: k, d: d, used: true}
			t.used = append(t.used, int32(i))
			return
		}
		if e.key == k {
			e.d += d
			return
		}
	}
}

// grow doubles the table (16 slots at first) and files its sums anew.
func (t *leakNets) grow() {
	old, used := t.slots, t.used
	n := max(16, 2*len(old))
	t.slots, t.shift, t.used = make([]leakNet, n), uint8(64-bits.TrailingZeros(uint(n))), make([]int32, 0, n/2)
	for _, i := range used {
		e := old[i]
		t.add(e.key, e.d)
	}
}

// each calls f with every key whose sum is not zero, in the order the
// keys came.
func (t *leakNets) each(f func(k leakKey, d int64)) {
	for _, i := range t.used {
		if e := &t.slots[i]; e.d != 0 {
			f(e.key, e.d)
		}
	}
}
