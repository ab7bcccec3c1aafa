// This file holds named pools: caches of their own that a program makes,
// routes a stream's allocations to (UsePool, BeginCapture) and releases,
// each a set of shards keyed by (stream, pool) whose blocks serve only the
// allocations routed to the pool.

package allocator

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"unicode"

	"github.com/gpumem/gpumem/allocator/internal/freeindex"
	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/stats"
)

// PoolOptions are the options of a named pool, as PyTorch's MemPool's.
type PoolOptions struct {
	// NoSplit: a block of the pool is never split; a request takes the
	// whole free block that fits it best (or a whole new segment).
	NoSplit bool
	// UseOnOOM: when a request of the default pool finds no memory, even
	// after the out-of-memory ladder released the default pool's cache,
	// it may take a free block of this pool (cached on its stream) before
	// it reports out of memory. The block stays the pool's.
	UseOnOOM bool
}

// A Pool is a named cache of an Allocator (PyTorch's MemPool, or a CUDA
// graph's private pool): its segments and blocks serve only the
// allocations routed to it (UsePool, BeginCapture), and EmptyCache leaves
// them alone until the pool is released (ReleasePool). Make one with
// Allocator.NewPool; a Pool is a handle, valid with its allocator only.
type Pool struct {
	a     *Allocator // its allocator
	id    uint64     // 1 and up, in the order of creation; 0 is the default pool's
	name  string
	opts  PoolOptions
	small *freeindex.Pool
	large *freeindex.Pool

	// Changed in the world.
	shards   []*shard // its shards, one per stream that allocated in it
	routed   int      // streams routed to it (UsePool and captures)
	released bool     // ReleasePool was called: its memory goes once no block is busy
	gone     bool     // released and its memory returned: the handle is dead
	peakRes  int64    // the peak of its reserved bytes (the ledger writes it)

	// Sleep and wake (pause.go): paused by PausePool; the runs of pages it
	// unmapped; its live blocks' bytes, with a backup; its shards' counts
	// while paused (by shard, row and pool column), which the stats leave
	// out until ResumePool.
	paused bool
	runs   []pageRun
	saved  []savedBlock
	parked [][numRows][2]int64
	// parkedPh is the phase counts of the shards while paused: by shard,
	// by phase id, bytes and blocks.
	parkedPh [][][2]int64
}

// Name returns the pool's name ("" for a nil Pool).
func (p *Pool) Name() string {
	if p == nil {
		return ""
	}
	return p.name
}

// ID returns the pool's id: 1 and up, in the order the allocator made its
// pools (0 is the default pool's, the id snapshots give its segments; and
// a nil Pool's).
func (p *Pool) ID() uint64 {
	if p == nil {
		return 0
	}
	return p.id
}

// Options returns the options the pool was made with.
func (p *Pool) Options() PoolOptions {
	if p == nil {
		return PoolOptions{}
	}
	return p.opts
}

// PoolStats are a named pool's figures.
type PoolStats struct {
	Name              string
	ID                uint64
	AllocatedBytes    uint64 // bytes of the pool's allocated blocks
	ReservedBytes     uint64 // bytes the pool holds from the device
	PeakReservedBytes uint64 // the peak of ReservedBytes since the pool was made
	Segments          int    // the pool's segments
	Released          bool   // ReleasePool was called; its memory goes once no block is busy
	Paused            bool   // PausePool: its pages are unmapped; the other figures are those it will have when resumed
}

// a route says where the allocations of a stream go instead of the default
// pool: a named pool, by UsePool or by a capture (BeginCapture).
type route struct {
	pool    *Pool
	capture bool
}

// checkPoolName returns an error if name may not name a pool: it must be
// non-empty, printable, without spaces, and not "-" (which the traces use
// for the default pool).
func checkPoolName(name string) error {
	switch {
	case name == "":
		return errors.New("allocator: a pool needs a name")
	case name == "-":
		return errors.New(`allocator: "-" names the default pool; choose another pool name`)
	case strings.IndexFunc(name, func(r rune) bool { return unicode.IsSpace(r) || !unicode.IsPrint(r) }) >= 0:
		return fmt.Errorf("allocator: pool name %q has a space or an unprintable character", name)
	}
	return nil
}

// NewPool makes a named pool (PyTorch's MemPool). Names are unique among
// the pools not yet released. Pools need the faithful policy: the
// low_fragmentation policy lends blocks across streams and does not know
// pools.
func (a *Allocator) NewPool(name string, o PoolOptions) (*Pool, error) {
	if err := checkPoolName(name); err != nil {
		return nil, err
	}
	if !a.made() {
		return nil, errNotMade
	}
	a.lockAll()
	defer a.unlockAll()
	if a.pol != nil {
		return nil, errors.New("allocator: named pools need the faithful policy; the low_fragmentation policy does not keep them")
	}
	if q := a.poolNamedLocked(name); q != nil {
		return nil, fmt.Errorf("allocator: a pool named %q exists (id %d)", name, q.id)
	}
	a.nextPool++
	p := &Pool{
		a: a, id: a.nextPool, name: name, opts: o,
		small: freeindex.NewPool(true, a.vm != nil),
		large: freeindex.NewPool(false, a.vm != nil),
	}
	a.pools = append(a.pools, p)
	return p, nil
}

// PoolNamed returns the pool named name that is not yet released, or nil.
func (a *Allocator) PoolNamed(name string) *Pool {
	if !a.made() {
		return nil
	}
	a.lockAll()
	defer a.unlockAll()
	if p := a.poolNamedLocked(name); p != nil && !p.released {
		return p
	}
	return nil
}

// Pools returns the allocator's named pools that still hold memory or are
// not released, in the order they were made.
func (a *Allocator) Pools() []*Pool {
	if !a.made() {
		return nil
	}
	a.lockAll()
	defer a.unlockAll()
	return slices.Clone(a.pools)
}

// poolNamedLocked returns the live pool named name (released ones that
// still hold memory included), or nil.
func (a *Allocator) poolNamedLocked(name string) *Pool {
	for _, p := range a.pools {
		if p.name == name && !p.released {
			return p
		}
	}
	return nil
}

// checkPoolLocked returns an error if p is not a live pool of a.
func (a *Allocator) checkPoolLocked(op string, p *Pool) error {
	switch {
	case p == nil:
		return fmt.Errorf("allocator: %s: nil pool", op)
	case p.a != a:
		return fmt.Errorf("allocator: %s: pool %q belongs to another allocator", op, p.name)
	case p.released:
		return fmt.Errorf("allocator: %s: pool %q (id %d) is released", op, p.name, p.id)
	case p.paused && op != "resume pool":
		return fmt.Errorf("allocator: %s: pool %q (id %d) is paused; resume it first", op, p.name, p.id)
	}
	return nil
}

// UsePool routes the allocations of stream s to pool p until
// UseDefaultPool(s) (PyTorch's beginAllocateToPool with a filter that
// matches s, as use_mem_pool does). Frees need no routing: a block goes
// back to the pool it came from. A stream routes to one pool at a time:
// routing a stream that is routed already, or a stream that is not the
// device's, fails and changes nothing.
func (a *Allocator) UsePool(p *Pool, s device.Stream) error {
	if !a.made() {
		return errNotMade
	}
	a.lockAll()
	defer a.unlockAll()
	return a.routeLocked("use pool", p, s, false)
}

// routeLocked routes stream s to pool p (by a capture when capture is
// set), or fails and changes nothing.
func (a *Allocator) routeLocked(op string, p *Pool, s device.Stream, capture bool) error {
	if err := a.checkPoolLocked(op, p); err != nil {
		return err
	}
	if !a.knownStreamLocked(s) {
		return fmt.Errorf("allocator: %s %q: stream %d is not a stream of device %d: %w", op, p.name, s, a.ordinal, device.ErrInvalidStream)
	}
	if r, ok := a.route[s]; ok {
		how := "routed"
		if r.capture {
			how = "capturing"
		}
		return fmt.Errorf("allocator: %s %q: stream %d is already %s to pool %q; end that first", op, p.name, s, how, r.pool.name)
	}
	if a.route == nil {
		a.route = make(map[device.Stream]route)
	}
	a.route[s] = route{pool: p, capture: capture}
	p.routed++
	a.routesChangedLocked()
	return nil
}

// UseDefaultPool routes the allocations of stream s back to the default
// pool (PyTorch's endAllocateToPool). A stream that is not routed, or
// that is capturing (EndCapture ends that), is an error.
func (a *Allocator) UseDefaultPool(s device.Stream) error {
	if !a.made() {
		return errNotMade
	}
	a.lockAll()
	defer a.unlockAll()
	r, ok := a.route[s]
	switch {
	case !ok:
		return fmt.Errorf("allocator: use default pool: stream %d is not routed to a pool", s)
	case r.capture:
		return fmt.Errorf("allocator: use default pool: stream %d is capturing into pool %q; end the capture with EndCapture", s, r.pool.name)
	}
	a.unrouteLocked(s, r)
	return nil
}

// unrouteLocked ends the route r of stream s.
func (a *Allocator) unrouteLocked(s device.Stream, r route) {
	delete(a.route, s)
	r.pool.routed--
	a.routesChangedLocked()
}

// routesChangedLocked marks the shards that may not run alone: the named
// pools' (whose blocks the world hands out and takes back) and the
// default pool's shards of routed streams (an Alloc there goes to a
// pool). Alloc's fast path then needs no test of the routes: a routed
// stream's shard is not fast.
func (a *Allocator) routesChangedLocked() {
	for _, sh := range a.shards {
		_, routed := a.route[sh.stream]
		sh.slow = sh.pool != nil || sh.idle || routed && !sh.cold
	}
}

// ReleasePool releases pool p (PyTorch's releasePool, when a MemPool or a
// CUDA graph goes): its cached segments go back to the device now, and
// those holding busy blocks once the last of them is freed. The handle is
// dead after: p is no longer routable, and its name is free. A pool that
// is routed to a stream (or capturing), or that is released already, is
// an error, and nothing changes. A device error releasing a segment
// leaves it cached; it goes with the pool's last free, or EmptyCache.
func (a *Allocator) ReleasePool(p *Pool) error {
	if !a.made() {
		return errNotMade
	}
	a.lockAll()
	defer a.unlockAll()
	if err := a.checkPoolLocked("release pool", p); err != nil {
		return err
	}
	if p.routed > 0 {
		return fmt.Errorf("allocator: release pool %q: it is in use on %d stream(s); route them back (UseDefaultPool, EndCapture) first", p.name, p.routed)
	}
	p.released = true
	a.releasing++
	var err error
	if a.captures == 0 { // else at the first free or EmptyCache after the captures
		err = a.dropPoolLocked(p)
	}
	if selfCheck {
		a.selfCheckLocked("ReleasePool")
	}
	return err
}

// dropPoolLocked returns the memory of the released pool p to the device:
// every wholly free segment (with expandable segments, the whole free
// pages); and once no block of it is busy and no segment is left, forgets
// the pool.
func (a *Allocator) dropPoolLocked(p *Pool) error {
	a.settleAllLocked()
	err := errors.Join(a.releasePoolLocked(p.large), a.releasePoolLocked(p.small))
	for _, sh := range p.shards {
		if sh.free[0].NSeg()+sh.free[1].NSeg() > 0 {
			return err
		}
	}
	p.gone = true
	a.releasing--
	a.pools = slices.DeleteFunc(a.pools, func(q *Pool) bool { return q == p })
	for _, sh := range p.shards {
		sh.pool, sh.idle = nil, true
		a.idle = append(a.idle, sh)
	}
	p.shards = nil
	return err
}

// dropReleasedLocked drops the released pools whose memory may go now.
func (a *Allocator) dropReleasedLocked() error {
	if a.captures > 0 {
		return nil // no device free while a capture is underway
	}
	var errs []error
	for _, p := range slices.Clone(a.pools) {
		if p.released && !p.gone {
			errs = append(errs, a.dropPoolLocked(p))
		}
	}
	return errors.Join(errs...)
}

// poolIndexesLocked returns the free indexes of stream s in pool p, giving
// the stream a shard of the pool the first time: an idle shard of a pool
// gone if there is one, else a new one. A pool's shards are never fast.
func (a *Allocator) poolIndexesLocked(p *Pool, s device.Stream) *[2]freeindex.Index {
	for _, sh := range p.shards {
		if sh.stream == s {
			return &sh.free
		}
	}
	var sh *shard
	if n := len(a.idle); n > 0 {
		sh, a.idle = a.idle[n-1], a.idle[:n-1]
		sh.idle = false
	} else {
		sh = &shard{id: len(*a.byID.Load()), activeImplied: true}
		a.shards = append(slices.Clip(a.shards), sh)
		a.poolShards++
		ids := append(slices.Clip(*a.byID.Load()), sh)
		a.byID.Store(&ids)
		if len(a.shards) == 2 {
			a.single.Store(nil)
			a.startRoutesLocked()
		}
	}
	sh.stream, sh.pool, sh.slow = s, p, true
	small := freeindex.KindLarge
	if a.vm == nil {
		small = freeindex.KindSmall
	}
	sh.free = [2]freeindex.Index{}
	sh.free[0].Init(sh.id, &sh.spare, s, p.small, small)
	sh.free[1].Init(sh.id, &sh.spare, s, p.large, freeindex.KindLarge)
	sh.free[0].KeepPages() // of large buckets: the small requests' index keeps its classes in pages
	p.shards = append(p.shards, sh)
	return &sh.free
}

// routedIndexesLocked returns the free indexes an allocation on stream s
// uses: those of the pool s is routed to, else indexesLocked's.
func (a *Allocator) routedIndexesLocked(s device.Stream) (*[2]freeindex.Index, *Pool) {
	if len(a.route) > 0 {
		if r, ok := a.route[s]; ok {
			return a.poolIndexesLocked(r.pool, s), r.pool
		}
	}
	return a.indexesLocked(s), nil
}

// oomPoolFitLocked is the last step before out of memory for a request of
// the default pool on stream s (rounded bytes): the best fit among the
// free blocks of the pools made with UseOnOOM, on s, in the order the
// pools were made. It returns the index and the block, or nils.
func (a *Allocator) oomPoolFitLocked(s device.Stream, rounded uint64) (*freeindex.Index, *freeindex.Block) {
	for _, p := range a.pools {
		if !p.opts.UseOnOOM || p.released || p.paused {
			continue
		}
		for _, sh := range p.shards {
			if sh.stream != s {
				continue
			}
			x := indexFor(&sh.free, rounded)
			if b := a.searchLocked(x, rounded); b != nil {
				return x, b
			}
		}
	}
	return nil, nil
}

// PoolStats returns pool p's figures. A pool released and gone is an
// error.
func (a *Allocator) PoolStats(p *Pool) (PoolStats, error) {
	if !a.made() {
		return PoolStats{}, errNotMade
	}
	a.lockAll()
	defer a.unlockAll()
	if p == nil || p.a != a {
		return PoolStats{}, errors.New("allocator: pool stats: not a pool of this allocator")
	}
	if p.gone {
		return PoolStats{}, fmt.Errorf("allocator: pool stats: pool %q (id %d) is released and its memory returned", p.name, p.id)
	}
	return a.poolStatsLocked(p), nil
}

// poolStatsLocked adds up p's figures over its shards.
func (a *Allocator) poolStatsLocked(p *Pool) PoolStats {
	ps := PoolStats{Name: p.name, ID: p.id, PeakReservedBytes: uint64(p.peakRes), Released: p.released, Paused: p.paused}
	for i, sh := range p.shards {
		if p.paused {
			ps.AllocatedBytes += uint64(p.parked[i][stats.AllocatedBytes][0] + p.parked[i][stats.AllocatedBytes][1])
			ps.ReservedBytes += uint64(p.parked[i][stats.ReservedBytes][0] + p.parked[i][stats.ReservedBytes][1])
		}
		ps.AllocatedBytes += uint64(sh.value(int(stats.AllocatedBytes), qAll))
		ps.ReservedBytes += uint64(sh.value(int(stats.ReservedBytes), qAll))
		ps.Segments += sh.free[0].NSeg() + sh.free[1].NSeg()
	}
	return ps
}

// parkedPhaseLocked returns the parked count j (bytes, blocks) of phase
// id of shard sh, and whether sh is a paused pool's.
func (a *Allocator) parkedPhaseLocked(sh *shard, id, j int) (int64, bool) {
	p := sh.pool
	if p == nil || !p.paused {
		return 0, false
	}
	i := slices.Index(p.shards, sh)
	if i < 0 || i >= len(p.parkedPh) || id >= len(p.parkedPh[i]) {
		return 0, true
	}
	return p.parkedPh[i][id][j], true
}

// parkedLocked returns the parked value of quantity row, pool column k, of
// sh, a shard of a paused pool (derived rows as shard.value derives them).
func (a *Allocator) parkedLocked(sh *shard, row, k int) int64 {
	p := sh.pool
	i := slices.Index(p.shards, sh)
	if i < 0 || i >= len(p.parked) {
		return -1
	}
	if k == qAll {
		return a.parkedLocked(sh, row, qSmall) + a.parkedLocked(sh, row, qLarge)
	}
	v := p.parked[i][row][k]
	if d := derivedFrom[row]; d != 0 {
		v += p.parked[i][d-1][k]
	}
	return v
}

// poolReservedLocked returns the bytes pool p holds from the device now.
func (a *Allocator) poolReservedLocked(p *Pool) int64 {
	var n int64
	for _, sh := range p.shards {
		n += sh.value(int(stats.ReservedBytes), qAll)
	}
	return n
}

// poolIDOf returns the id of the pool whose free index is x: 0 for the
// default pool.
func (a *Allocator) poolIDOf(x *freeindex.Index) uint64 {
	if p := a.shardOf(x).pool; p != nil {
		return p.id
	}
	return 0
}

// checkPoolsLocked checks the pools' bookkeeping: each live pool's shards
// are its own, of its pools, one per stream, never fast; the routes name
// live pools, and each pool counts its routes; idle shards hold nothing;
// the released pools still kept are counted.
func (a *Allocator) checkPoolsLocked(bad func(string, ...any)) {
	for seg := range a.mappedSegs {
		if a.segments[seg.Ptr()] != seg || seg.Expandable() || a.shardOf(seg.Free()).pool == nil {
			bad("mapped segment %v is not a plain segment of a named pool the allocator keeps", seg.Ptr())
		}
	}
	routed := map[*Pool]int{}
	for s, r := range a.route {
		routed[r.pool]++
		if r.pool.released || !slices.Contains(a.pools, r.pool) {
			bad("stream %d is routed to pool %q, which is released", s, r.pool.name)
		}
	}
	releasing, nPool := 0, 0
	for _, p := range a.pools {
		if p.gone {
			bad("pool %q is gone but kept", p.name)
		}
		if p.released {
			releasing++
		}
		if routed[p] != p.routed {
			bad("pool %q counts %d routes, has %d", p.name, p.routed, routed[p])
		}
		if r := a.poolReservedLocked(p); r > p.peakRes {
			bad("pool %q reserves %d bytes, above its peak %d", p.name, r, p.peakRes)
		}
		if p.paused != (p.parked != nil) || p.paused != (p.parkedPh != nil) || !p.paused && (p.runs != nil || p.saved != nil) || p.paused && (p.routed > 0 || len(p.parked) != len(p.shards)) {
			bad("pool %q: paused %v, with %d parked shards of %d, %d runs, %d saved blocks, %d routes", p.name, p.paused, len(p.parked), len(p.shards), len(p.runs), len(p.saved), p.routed)
		}
		seen := map[device.Stream]bool{}
		for _, sh := range p.shards {
			nPool++
			if sh.pool != p || sh.idle || !sh.slow || sh.fast.Load() || seen[sh.stream] || !slices.Contains(a.shards, sh) {
				bad("pool %q: the shard of stream %d is not its own, or fast, or twice", p.name, sh.stream)
			}
			seen[sh.stream] = true
			if sh.free[0].Pool() != p.small || sh.free[1].Pool() != p.large {
				bad("pool %q: the shard of stream %d indexes another pool", p.name, sh.stream)
			}
		}
	}
	if releasing != a.releasing {
		bad("%d released pools kept, counted %d", releasing, a.releasing)
	}
	for _, sh := range a.idle {
		nPool++
		if !sh.idle || sh.pool != nil || sh.live.Len() > 0 || sh.free[0].NSeg()+sh.free[1].NSeg() > 0 {
			bad("an idle shard of a pool gone holds memory")
		}
	}
	if nPool != a.poolShards {
		bad("%d shards of pools, counted %d", nPool, a.poolShards)
	}
	for _, sh := range a.shards {
		_, r := a.route[sh.stream]
		if want := sh.pool != nil || sh.idle || r && !sh.cold; sh.slow != want {
			bad("shard of stream %d: slow is %v, routes say %v", sh.stream, sh.slow, want)
		}
	}
}
