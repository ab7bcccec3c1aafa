// This file holds routes, the lock-free map from device addresses to the
// shard that owns them, which Free reads before taking any lock.

package allocator

import (
	"sync/atomic"

	"github.com/gpumem/gpumem/device"
)

// routes maps the device addresses that hold memory of a segment (a plain
// segment, or the mapped pages of an expandable one) to the shard of that
// segment's stream, so that Free can lock the one shard that holds a
// block. It is kept only while the allocator has more than one shard
// (with one, every block is the default stream's).
//
// It is a radix tree of two levels over each zone of 2^48 addresses: the
// zone's top (routeTop entries) names a leaf per 2^39 bytes, a leaf a
// list per region of 1 GiB (regionShift). A region's list holds the
// pieces of memory in that region, each a range of addresses clipped to
// the region and the shard that owns it, sorted by address, disjoint, and
// coalesced: two pieces that touch have different shards. A segment
// costs one list per region it reaches into, however large it is (a
// 4 GiB segment is 5 lists at most), and a lookup is a binary search in
// one list. The zone of the addresses below 2^48, where a device's
// memory usually is, is built in; routeZones more (virtual-memory
// reservations may lie higher: the simulated device's start at 2^56)
// are made as memory arrives in them, each for the first address of its
// zone seen, and kept. Memory in any further zone is not kept: a lookup
// there finds nothing. A lookup that finds nothing makes Free take every
// lock, so routes may say "ask everyone", never name the wrong shard;
// Free checks the shard's address table anyway.
//
// Writers hold every lock (Allocator.lockAll). Readers hold none: a list
// is never changed once published; a writer makes a new one and stores
// it whole (atomic pointer), the old one left to the readers that still
// use it. A reader looks up the address of a block it allocated, whose
// memory was registered before that allocation, hence before the lookup:
// what it reads is current for that address.
//
// In front of the tree sits a cache (cached), by 2 MiB chunk of
// addresses, each chunk in one slot, found by the chunk's number folded
// (routeSlot: ranges reserved for expandable segments start at multiples
// of 2 GiB, where the chunk's low bits alone would put the start of every
// segment in one slot): a slot holds the shard of a chunk that lies whole
// in one piece, stamped with the generation of the routes it was read
// from. Every change of the routes advances the generation (gen, stamp)
// after it has stored its lists, which makes every slot filled before it
// stale at once; a lookup fills the slot of its chunk with the stamp it
// read before it read the lists. A slot of the current stamp was so
// filled from lists at least as new as the last change before it, and no
// change has come since, so the chunk is still that shard's: the memory
// of a live block is registered before it is allocated and stays until
// it is freed. A chunk shared by two pieces (segments that are not 2 MiB
// aligned) is never cached; its lookups search the tree.
//
// A stamp is the generation's low routeStampBits: when they come round
// to zero the change empties every slot, so that a slot cannot match
// again 2^12 changes after it was filled. Only a lookup that read the
// stamp before that change and fills its slot after it can leave one
// behind; if its chunk changed hands by the time the stamp comes round,
// Free finds the block missing from that shard's address table and
// takes the world, which looks again. A wrong answer costs time, never
// correctness.
type routes struct {
	on    bool                                  // kept up to date (more than one shard)
	gen   uint64                                // the changes so far (add); written in the world
	top   [routeTop]atomic.Pointer[routeLeaf]   // the zone below 2^48, by address>>routeLeafShift
	zones [routeZones]atomic.Pointer[routeZone] // the zones above it that hold memory, in the order they came; nil from the first unused one on

	_      [64]byte      // stamp and the slots share no line with top's last pointers
	stamp  atomic.Uint64 // gen's low routeStampBits, as a slot holds them (routeStamp)
	_      [56]byte      // the slots, written on misses, share no line with stamp
	cache  [routeCacheSize]atomic.Uint64
	owners [routeCacheIDs]atomic.Pointer[shard] // the shard of each id below routeCacheIDs, set as its memory is added
}

const (
	regionShift    = 30 // a region is 1 GiB of addresses
	routeLeafShift = 39 // a leaf covers 512 regions
	routeTop       = 1 << (routeZoneShift - routeLeafShift)
	routeLeafSize  = 1 << (routeLeafShift - regionShift)
	routeZoneShift = 48 // a zone is 2^48 addresses, with a top of its own
	routeZones     = 4  // zones kept above the first
)

// routeZone is the tree of one zone of addresses above the first: its
// number (address>>routeZoneShift), set before the zone is published,
// and its top.
type routeZone struct {
	num uint64
	top [routeTop]atomic.Pointer[routeLeaf]
}

// The cache: routeCacheSize slots, the slot of the 2 MiB chunk at
// address p at routeSlot(p>>21). A slot holds, from the top: p's bits
// from 21 on (the chunk's number), the stamp (routeStampBits), a bit set
// (routeValid) that the zero value of an empty slot lacks, and the shard
// id; a shard id of routeCacheIDs or more is not cached. The tag of a
// slot, all but the id, is then p's top bits or'ed with the stamp word:
// two instructions. A slot is filled only for an address that the tree
// keeps.
const (
	routeChunkShift = 21
	routeCacheBits  = 10
	routeCacheSize  = 1 << routeCacheBits
	routeTagShift   = routeChunkShift // p's bits from here on are in the tag: the chunk's number
	routeValid      = 1 << 8
	routeCacheIDs   = routeValid // ids below it fit under the tag
	routeStampBits  = routeTagShift - 9
)

// routeSlot returns the cache slot of chunk c: its low bits folded with
// the bits above them, which tell apart the segments that start at
// multiples of 2 GiB. One shift and one xor: the cached pair on two
// streams costs 3 instructions more than with the low bits alone
// (`scripts/callgrind.sh streams-pair`: 299.2 against 296.1), a second
// fold 6, and a multiplication by a 64-bit constant, inlined into Free,
// cost the pair on one stream 4, though it never runs there.
func routeSlot(c uint64) uint64 {
	return (c ^ c>>routeCacheBits) & (routeCacheSize - 1)
}

// start turns the routes on (kept from now on) and stores the stamp word
// of their generation: until then it is zero, which an empty slot
// matches.
func (r *routes) start() {
	r.on = true
	r.stamp.Store(routeStamp(r.gen))
}

// routeStamp is the stamp word of generation gen.
func routeStamp(gen uint64) uint64 {
	return gen&(1<<routeStampBits-1)<<9 | routeValid
}

// cached returns the shard of the memory at p as the cache holds it, or
// nil when p's slot holds another chunk or generation. Small enough to be
// inlined into Free, it reads three words.
func (r *routes) cached(p device.Ptr) *shard {
	e := r.cache[routeSlot(uint64(p)>>routeChunkShift)].Load()
	if e^(uint64(p)&^(1<<routeTagShift-1)|r.stamp.Load()) < routeCacheIDs {
		return r.owners[uint8(e)].Load()
	}
	return nil
}

// routeLeaf holds the lists of 512 regions; nil: no memory there.
type routeLeaf [routeLeafSize]atomic.Pointer[[]routePiece]

// routePiece is the memory [start, end) of shard id within one region.
type routePiece struct {
	start, end uint64
	id         uint32
}

// list returns the slot of the list of the region of address p, or nil
// when its zone or leaf does not exist (grow false) or p is not kept.
func (r *routes) list(p uint64, grow bool) *atomic.Pointer[[]routePiece] {
	var top *atomic.Pointer[routeLeaf]
	if z := p >> routeZoneShift; z == 0 {
		top = &r.top[p>>routeLeafShift]
	} else if zt := r.zone(z, grow); zt != nil {
		top = &zt[p>>routeLeafShift&(routeTop-1)]
	} else {
		return nil
	}
	leaf := top.Load()
	if leaf == nil {
		if !grow {
			return nil
		}
		leaf = new(routeLeaf)
		top.Store(leaf)
	}
	return &leaf[p>>regionShift&(routeLeafSize-1)]
}

// zone returns the top of zone z (not 0), made if grow and a zone is
// free, or nil when it is not kept.
func (r *routes) zone(z uint64, grow bool) *[routeTop]atomic.Pointer[routeLeaf] {
	for i := range r.zones {
		zt := r.zones[i].Load()
		if zt == nil {
			if !grow {
				return nil
			}
			zt = &routeZone{num: z}
			r.zones[i].Store(zt)
		}
		if zt.num == z {
			return &zt.top
		}
	}
	return nil
}

// lookup returns the id of the shard that owns the memory at p, and true;
// false when no shard does (or p is not kept). It searches the tree and
// fills the cache's slot of p's chunk when one piece holds all of it.
func (r *routes) lookup(p device.Ptr) (uint32, bool) {
	stamp := r.stamp.Load() // before the lists: see routes
	x, ok := r.piece(uint64(p))
	if !ok {
		return 0, false
	}
	if c := uint64(p) >> routeChunkShift; x.holds(c) {
		r.cache[routeSlot(c)].Store(uint64(p)&^(1<<routeTagShift-1) | stamp | uint64(x.id))
	}
	return x.id, true
}

// piece returns the piece that holds address p, and true; false when
// none does.
func (r *routes) piece(p uint64) (routePiece, bool) {
	slot := r.list(p, false)
	if slot == nil {
		return routePiece{}, false
	}
	lp := slot.Load()
	if lp == nil {
		return routePiece{}, false
	}
	ps := *lp
	lo, hi := 0, len(ps)
	for lo < hi { // the first piece that ends after p
		m := int(uint(lo+hi) >> 1)
		if ps[m].end <= p {
			lo = m + 1
		} else {
			hi = m
		}
	}
	if lo < len(ps) && ps[lo].start <= p {
		return ps[lo], true
	}
	return routePiece{}, false
}

// holds reports whether x may be cached as the shard of chunk c: it
// holds all of the chunk, and its id fits in a slot.
func (x routePiece) holds(c uint64) bool {
	return x.start <= c<<routeChunkShift && (c+1)<<routeChunkShift <= x.end && x.id < routeCacheIDs
}

// checkCache calls bad for every slot of the current stamp whose chunk is
// not held whole by a piece of the shard it names, or whose shard is not
// the owner of its id.
func (r *routes) checkCache(bad func(string, ...any)) {
	stamp := r.stamp.Load()
	for i := range r.cache {
		e := r.cache[i].Load()
		if e&(1<<routeTagShift-1)&^(routeCacheIDs-1) != stamp {
			continue // another stamp, or empty
		}
		c := e >> routeTagShift
		if routeSlot(c) != uint64(i) {
			bad("the routes' cache holds the chunk at %#x in slot %d, not its own %d", c<<routeChunkShift, i, routeSlot(c))
		}
		id := uint32(e & (routeCacheIDs - 1))
		if x, ok := r.piece(c << routeChunkShift); !ok || x.id != id || !x.holds(c) {
			bad("the routes' cache names shard %d for the chunk at %#x, the routes say %v (%v)", id, c<<routeChunkShift, x, ok)
		}
		if sh := r.owners[id].Load(); sh == nil || uint32(sh.id) != id {
			bad("the routes' cache names shard %d, whose owner is missing or another", id)
		}
	}
}

// add registers the n bytes at p, memory of shard sh (a plain segment, or
// mapped pages of an expandable segment), with change +1, or unregisters
// them with change -1. Memory is registered once and unregistered once,
// in any units: pieces of one shard that touch are one piece, so a
// range of pages mapped one by one may be unmapped together.
func (r *routes) add(p device.Ptr, n uint64, sh *shard, change int32) {
	if !r.on || n == 0 {
		return
	}
	id := uint32(sh.id)
	if change > 0 && id < routeCacheIDs {
		r.owners[id].Store(sh) // before the lists: a slot names no id the owners lack
	}
	end := uint64(p) + n
	if end < n {
		return // it reaches the end of the address space: not kept (a piece's end would overflow)
	}
	for s := uint64(p); s < end; {
		e := end // the end of s's region, or of the range
		if next := (s>>regionShift + 1) << regionShift; next != 0 && next < e {
			e = next
		}
		slot := r.list(s, true)
		if slot == nil { // a zone not kept
			s = e
			continue
		}
		var old []routePiece
		if lp := slot.Load(); lp != nil {
			old = *lp
		}
		var ps []routePiece
		if change > 0 {
			ps = insertPiece(old, routePiece{s, e, id})
		} else {
			ps = removePiece(old, routePiece{s, e, id})
		}
		if len(ps) == 0 {
			slot.Store(nil)
		} else {
			slot.Store(&ps)
		}
		s = e
	}
	// After the lists: see routes.
	r.gen++
	if r.gen&(1<<routeStampBits-1) == 0 {
		for i := range r.cache {
			r.cache[i].Store(0)
		}
	}
	r.stamp.Store(routeStamp(r.gen))
}

// insertPiece returns a new list: ps with x added, merged with the pieces
// of its shard that touch it. x overlaps no piece of ps.
func insertPiece(ps []routePiece, x routePiece) []routePiece {
	i := 0
	for i < len(ps) && ps[i].start < x.start {
		i++
	}
	lo, hi := i, i
	if i > 0 && ps[i-1].end == x.start && ps[i-1].id == x.id {
		lo, x.start = i-1, ps[i-1].start
	}
	if i < len(ps) && ps[i].start == x.end && ps[i].id == x.id {
		hi, x.end = i+1, ps[i].end
	}
	out := make([]routePiece, 0, len(ps)-(hi-lo)+1)
	out = append(out, ps[:lo]...)
	out = append(out, x)
	return append(out, ps[hi:]...)
}

// removePiece returns a new list: ps without the memory of x, which lies
// within one piece of x's shard; ps itself when it does not (the
// invariant checker then finds the difference).
func removePiece(ps []routePiece, x routePiece) []routePiece {
	i := len(ps) - 1
	for i >= 0 && ps[i].start > x.start {
		i--
	}
	if i < 0 || ps[i].end < x.end || ps[i].id != x.id {
		return ps
	}
	out := make([]routePiece, 0, len(ps)+1)
	out = append(out, ps[:i]...)
	if ps[i].start < x.start {
		out = append(out, routePiece{ps[i].start, x.start, x.id})
	}
	if x.end < ps[i].end {
		out = append(out, routePiece{x.end, ps[i].end, x.id})
	}
	return append(out, ps[i+1:]...)
}

// each calls f with every region that has memory, and its pieces: the
// zones in the order they came (the first zone first), each in address
// order.
func (r *routes) each(f func(region uint64, ps []routePiece)) {
	eachInTop(0, &r.top, f)
	for i := range r.zones {
		if zt := r.zones[i].Load(); zt != nil {
			eachInTop(zt.num, &zt.top, f)
		}
	}
}

// eachInTop is each for the top of zone z.
func eachInTop(z uint64, top *[routeTop]atomic.Pointer[routeLeaf], f func(region uint64, ps []routePiece)) {
	for t := range top {
		leaf := top[t].Load()
		if leaf == nil {
			continue
		}
		for j := range leaf {
			if lp := leaf[j].Load(); lp != nil {
				f(z<<(routeZoneShift-regionShift)|uint64(t)<<(routeLeafShift-regionShift)|uint64(j), *lp)
			}
		}
	}
}
