// This file holds the Allocator: construction, Alloc, Free, RecordStream,
// EmptyCache and the allocation and free ladders described in doc.go.

package allocator

import (
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/google/btree"

	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/stats"
)

// Allocator is a caching allocator for one device. It is safe for concurrent
// use by multiple goroutines.
type Allocator struct {
	dev     device.Device
	cfg     Config
	ordinal int
	total   uint64 // device memory, from MemInfo at New

	// Read-only after New.
	maxSplit            uint64
	maxNonSplitRounding uint64
	vm                  device.VirtualMemory // set when expandable segments are on

	mu sync.Mutex // guards everything below

	small, large *pool
	live         ptrTable                // allocated blocks by address
	segments     map[device.Ptr]*segment // every segment by base address
	reserved     uint64                  // bytes obtained from the device (PyTorch's total_allocated_memory)
	allowed      uint64                  // cap on reserved; 0 means none
	st           counters

	uses    map[*block][]device.Stream // streams other than its own that an allocated block was recorded on
	queues  []*eventQueue              // per stream, sorted by stream, for deferred frees
	pending int                        // events outstanding across queues

	streams   []device.Stream   // streams known to be valid
	spare     []*block          // recycled block structs
	key       block             // best-fit search key (scratch)
	found     *block            // result of the last index search (scratch)
	foundFunc func(*block) bool // records the first item visited
	gcActive  bool              // a garbage-collection threshold and a cap are both set
	roundup   bool              // some RoundupPower2Divisions entry is set (read-only after New)
	collected []*block          // scratch list for release passes

	observers    []observerEntry
	oomObservers []oomObserver
	nextID       uint64
}

// An eventQueue holds the events recorded on one stream for deferred frees,
// oldest first. Events on one stream complete in order, so only the front
// needs querying.
type eventQueue struct {
	stream device.Stream
	events []pendingEvent
	head   int
}

type pendingEvent struct {
	ev     device.Event
	stream device.Stream
	b      *block
}

// New returns an allocator for dev with configuration cfg (the zero Config
// is PyTorch's default). It asks the device for its total memory once.
func New(dev device.Device, cfg Config) (*Allocator, error) {
	if dev == nil {
		return nil, errors.New("allocator: nil device")
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	_, total, err := dev.MemInfo()
	if err != nil {
		return nil, fmt.Errorf("allocator: reading device memory: %w", err)
	}
	var vm device.VirtualMemory
	if cfg.ExpandableSegments {
		var ok bool
		if vm, ok = dev.(device.VirtualMemory); !ok {
			return nil, fmt.Errorf("allocator: expandable_segments needs a device with virtual memory; %s has none: %w", dev.Name(), device.ErrNotSupported)
		}
		if g := vm.Granularity(); g == 0 || kSmallBuffer%g != 0 {
			return nil, fmt.Errorf("allocator: expandable_segments needs a mapping granularity dividing 2 MiB; the device's is %d: %w", g, device.ErrNotSupported)
		}
	}
	a := &Allocator{
		dev:                 dev,
		vm:                  vm,
		cfg:                 cfg,
		ordinal:             dev.Ordinal(),
		total:               total,
		maxSplit:            cfg.maxSplit(),
		maxNonSplitRounding: cfg.maxNonSplitRounding(),
		small:               newPool(true),
		large:               newPool(false),
		segments:            make(map[device.Ptr]*segment),
	}
	a.foundFunc = func(b *block) bool { a.found = b; return false }
	a.allowed = a.computeAllowed(cfg.MemoryFraction, cfg.MemoryLimit)
	a.gcActive = a.allowed > 0 && cfg.GarbageCollectionThreshold > 0
	a.roundup = cfg.RoundupPower2Divisions != [NumRoundupIntervals]uint64{}
	if vm != nil {
		a.small.unmapped = btree.NewG(32, addrLess)
		a.large.unmapped = btree.NewG(32, addrLess)
	}
	a.st.MaxSplitSize = -1
	if a.maxSplit != maxSplitNone {
		a.st.MaxSplitSize = int64(a.maxSplit)
	}
	return a, nil
}

func (a *Allocator) computeAllowed(fraction float64, limit uint64) uint64 {
	var allowed uint64
	if fraction > 0 && fraction <= 1 {
		allowed = uint64(fraction * float64(a.total))
		if allowed == 0 {
			allowed = 1 // a tiny fraction still caps: nothing fits
		}
	}
	if limit > 0 && (allowed == 0 || limit < allowed) {
		allowed = limit
	}
	return allowed
}

// Device returns the device the allocator manages.
func (a *Allocator) Device() device.Device { return a.dev }

// Config returns the allocator's configuration.
func (a *Allocator) Config() Config {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.cfg
}

// SetMemoryFraction caps the bytes the allocator may reserve at fraction of
// the device's total memory, as PyTorch's set_per_process_memory_fraction;
// 1 removes the cap (gpumem's byte limit, if configured, still applies).
func (a *Allocator) SetMemoryFraction(fraction float64) error {
	if !(fraction > 0 && fraction <= 1) {
		return fmt.Errorf("allocator: memory fraction %v must be in (0, 1]", fraction)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if fraction == 1 {
		fraction = 0
	}
	a.cfg.MemoryFraction = fraction
	a.allowed = a.computeAllowed(fraction, a.cfg.MemoryLimit)
	a.gcActive = a.allowed > 0 && a.cfg.GarbageCollectionThreshold > 0
	return nil
}

// Alloc returns the address of a block of at least size bytes for use on
// stream s. Size 0 returns the zero Ptr and no error without touching the
// device, as PyTorch does. When neither the cache nor the device can serve
// the request, even after releasing cached memory, the error is an
// *OutOfMemoryError (which matches device.ErrOutOfMemory with errors.Is).
func (a *Allocator) Alloc(size uint64, s device.Stream) (device.Ptr, error) {
	if size == 0 {
		return 0, nil
	}
	if size >= maxRequestSize {
		// PyTorch raises its out-of-memory error here (without counting it
		// in num_ooms); the error matches both, so that a replay counts it
		// as PyTorch's does while a caller sees a size it should not ask.
		return 0, fmt.Errorf("allocator: cannot allocate %d bytes (more than 1 EiB; a negative size converted to uint64?): %w (%w)", size, device.ErrInvalidSize, device.ErrOutOfMemory)
	}
	a.mu.Lock()
	if !a.knownStreamLocked(s) {
		a.mu.Unlock()
		return 0, fmt.Errorf("allocator: stream %d is not a stream of device %d: %w", s, a.ordinal, device.ErrInvalidStream)
	}
	if a.pending > 0 {
		a.processEventsLocked()
	}
	rounded := a.roundSize(size)
	p := a.large
	if rounded <= kSmallSize {
		p = a.small
	}
	b := a.getFreeBlockLocked(p, rounded, s)
	fresh := false // whether b is outside the free index
	if b == nil {
		var oom *OutOfMemoryError
		var err error
		b, fresh, oom, err = a.allocSlowLocked(p, rounded, size, s)
		if err != nil || oom != nil {
			if selfCheck {
				a.selfCheckLocked("a failed Alloc")
			}
			obs := a.oomObservers
			a.mu.Unlock()
			if oom != nil {
				for _, o := range obs {
					o.f(oom)
				}
				return 0, oom
			}
			return 0, err
		}
	}
	b = a.allocFoundLocked(b, p, rounded, size, fresh)
	ptr := b.ptr
	if len(a.observers) > 0 {
		a.notifyLocked(Action{Kind: ActionAlloc, Ptr: ptr, Size: b.size, Requested: size, Stream: s})
	}
	if selfCheck {
		a.selfCheckLocked("Alloc")
	}
	a.mu.Unlock()
	return ptr, nil
}

// knownStreamLocked reports whether s is a stream of the device. The
// default stream always is; others are asked of the device once, when it
// can tell (device.StreamChecker), and remembered.
func (a *Allocator) knownStreamLocked(s device.Stream) bool {
	if s == device.DefaultStream {
		return true
	}
	for _, k := range a.streams {
		if k == s {
			return true
		}
	}
	if c, ok := a.dev.(device.StreamChecker); ok && !c.HasStream(s) {
		return false
	}
	a.streams = append(a.streams, s)
	return true
}

// roundSize rounds a request up to the size of the block that serves it.
func (a *Allocator) roundSize(size uint64) uint64 {
	if size < kMinBlockSize {
		return kMinBlockSize
	}
	if a.roundup {
		d := a.cfg.RoundupPower2Divisions[roundupIndex(size)]
		if d > 1 && size > kMinBlockSize*d {
			return roundupPower2NextDivision(size, d)
		}
	}
	return (size + kMinBlockSize - 1) / kMinBlockSize * kMinBlockSize
}

// allocationSize is the size of the segment that a request of the given
// rounded size gets from the device.
func allocationSize(size uint64) uint64 {
	switch {
	case size <= kSmallSize:
		return kSmallBuffer
	case size < kMinLargeAlloc:
		return kLargeBuffer
	default:
		return (size + kRoundLarge - 1) / kRoundLarge * kRoundLarge
	}
}

// getFreeBlockLocked finds the best-fitting free block of p on stream s for
// a request of size bytes; nil if none fits. The block stays in the index:
// allocFoundLocked takes it out or shrinks it in place.
func (a *Allocator) getFreeBlockLocked(p *pool, size uint64, s device.Stream) *block {
	if a.gcActive {
		p.gcCalls++
	}
	a.key.stream, a.key.size, a.key.ptr = s, size, 0
	var b *block
	if first, ok := p.free.Min(); ok && !freeLess(first, &a.key) {
		b = first // the smallest free block already fits: no search needed
	} else if ok {
		p.free.AscendGreaterOrEqual(&a.key, a.foundFunc)
		b, a.found = a.found, nil
	}
	if b == nil || b.stream != s {
		return nil
	}
	if b.seg.expandable() {
		b = a.expandableBestFitLocked(p, b)
	}
	// Never hand an oversize block to a request below max_split_size, and
	// hand one to an oversize request only if little of it is wasted.
	if size < a.maxSplit && b.size >= a.maxSplit {
		return nil
	}
	if size >= a.maxSplit && b.size >= size+a.maxNonSplitRounding {
		return nil
	}
	return b
}

// shouldSplit reports whether serving size bytes from b leaves a remainder
// worth keeping as a free block.
func (a *Allocator) shouldSplit(b *block, size uint64) bool {
	rest := b.size - size
	if b.pool.small || a.vm != nil { // PyTorch 2.6 tests the global expandable_segments setting here
		return rest >= kMinBlockSize
	}
	return size < a.maxSplit && rest > kSmallSize
}

// allocSlowLocked runs the ladder after a cache miss: garbage collection,
// a device allocation, then releasing cached oversize blocks and retrying,
// then releasing the whole cache and retrying. It returns the new segment's
// block, or an out-of-memory error, or another device error.
func (a *Allocator) allocSlowLocked(p *pool, size, orig uint64, s device.Stream) (b *block, fresh bool, oom *OutOfMemoryError, err error) {
	if a.gcActive {
		a.garbageCollectLocked()
	}
	allocSize := allocationSize(size)
	var devErr error
	b, fresh, devErr, err = a.allocBlockLocked(p, size, allocSize, s, false)
	if b == nil && err == nil && a.releaseAvailableLocked(p, size, s) {
		b, fresh, devErr, err = a.allocBlockLocked(p, size, allocSize, s, false)
	}
	if b == nil && err == nil {
		_ = a.releaseCachedLocked() // a failed release leaves those blocks cached; the retry decides
		b, fresh, devErr, err = a.allocBlockLocked(p, size, allocSize, s, true)
	}
	if err != nil {
		return nil, false, nil, err
	}
	if b != nil {
		return b, fresh, nil, nil
	}
	return nil, false, a.outOfMemoryLocked(orig, allocSize, s, devErr), nil
}

// allocBlockLocked obtains memory for a request of rounded bytes from the
// device: a new segment of size bytes, or with expandable segments, pages
// mapped into one (the block returned is then in the free index: fresh is
// false). A refusal for lack of memory (by the device or by the configured
// cap, which counts size bytes either way, as PyTorch does) returns a nil
// block and nil error, with the device's error in devErr; any other device
// failure is returned as err.
func (a *Allocator) allocBlockLocked(p *pool, rounded, size uint64, s device.Stream, retry bool) (b *block, fresh bool, devErr, err error) {
	if retry {
		a.st.NumAllocRetries++
	}
	if a.allowed > 0 && a.reserved+size > a.allowed {
		return nil, false, nil, nil
	}
	if a.vm != nil {
		b, devErr, err = a.allocExpandableLocked(p, rounded, s)
		return b, false, devErr, err
	}
	ptr, err := a.dev.Malloc(size)
	if err != nil {
		if errors.Is(err, device.ErrOutOfMemory) {
			return nil, false, err, nil
		}
		return nil, false, nil, fmt.Errorf("allocator: device %d: allocating a %d-byte segment: %w", a.ordinal, size, err)
	}
	a.reserved += size
	seg := &segment{ptr: ptr, size: size, stream: s, pool: p}
	b = a.newBlock()
	*b = block{ptr: ptr, size: size, stream: s, pool: p, seg: seg}
	seg.head = b
	a.segments[ptr] = seg
	a.st.Segment.Increase(p.stat, 1)
	a.st.ReservedBytes.Increase(p.stat, int64(size))
	if size >= a.maxSplit {
		a.st.OversizeSegments.Increase(1)
	}
	a.st.NumDeviceAlloc++
	if len(a.observers) > 0 {
		a.notifyLocked(Action{Kind: ActionSegmentAlloc, Ptr: ptr, Size: size, Stream: s})
	}
	return b, true, nil, nil
}

// allocFoundLocked hands out b for a request of size rounded bytes (orig
// as asked), splitting off the rest of the block when it is worth keeping.
// A block found in the cache is still in the free index (fresh is false);
// a new segment's block is not (fresh is true).
func (a *Allocator) allocFoundLocked(b *block, p *pool, size, orig uint64, fresh bool) *block {
	alreadySplit := b.isSplit()
	if a.shouldSplit(b, size) {
		// The front of b is handed out as a new block; b keeps the rest
		// and stays (or goes) in the index under its new, smaller key.
		rest := b
		b = a.newBlock() // zeroed
		b.ptr, b.size, b.stream = rest.ptr, size, rest.stream
		b.pool, b.seg, b.prev, b.next = p, rest.seg, rest.prev, rest
		if b.prev != nil {
			b.prev.next = b
		} else {
			b.seg.head = b
		}
		inPlace := !fresh && a.canShrinkInPlace(p, rest, size)
		if !fresh && !inPlace {
			p.remove(rest)
		}
		rest.prev = b
		rest.ptr += device.Ptr(size)
		rest.size -= size
		if inPlace {
			rest.gcCountBase = p.gcCalls
		} else {
			p.insert(rest)
		}
		switch {
		case b.seg.expandable(): // expandable blocks are never "inactive split"
		case alreadySplit:
			a.st.InactiveSplitBytes.Decrease(p.stat, int64(size))
		default:
			a.st.InactiveSplitBytes.Increase(p.stat, int64(rest.size))
			a.st.InactiveSplit.Increase(p.stat, 1)
		}
	} else {
		if !fresh {
			p.remove(b)
		}
		if alreadySplit && !b.seg.expandable() {
			a.st.InactiveSplitBytes.Decrease(p.stat, int64(b.size))
			a.st.InactiveSplit.Decrease(p.stat, 1)
		}
	}
	b.allocated = true
	b.requested = orig
	a.live.put(b)
	a.st.Allocation.Increase(p.stat, 1)
	a.st.AllocatedBytes.Increase(p.stat, int64(b.size))
	a.st.Active.Increase(p.stat, 1)
	a.st.ActiveBytes.Increase(p.stat, int64(b.size))
	a.st.RequestedBytes.Increase(p.stat, int64(orig))
	if b.size >= a.maxSplit {
		a.st.OversizeAllocations.Increase(1)
	}
	return b
}

// canShrinkInPlace reports whether b, found by the best-fit search for
// size bytes, can lose its first size bytes without leaving its place in
// the free index (its key only decreases, so it must stay above its
// predecessor). It answers only what it can tell without a search: when
// the rest is at least size bytes (every block before b is smaller than
// the request) or b is the smallest block. A search for the predecessor
// would fail most of the time (96% of the splits of random_mixed) and then
// cost more than the delete and insert it tries to save.
func (a *Allocator) canShrinkInPlace(p *pool, b *block, size uint64) bool {
	if b.size-size >= size && !b.seg.expandable() {
		// (An expandable block may have been chosen past the lower bound.)
		return true
	}
	first, _ := p.free.Min()
	return first == b
}

// canGrowInPlace reports whether x, a block in the free index, can take a
// larger key without leaving its place: it can when x is the largest
// block. As for shrinking, a search for the successor is not worth it.
func (a *Allocator) canGrowInPlace(p *pool, x *block) bool {
	last, _ := p.free.Max()
	return last == x
}

// Free returns a block obtained from Alloc. Freeing the zero Ptr does
// nothing. If the block was recorded on other streams (RecordStream), it
// becomes reusable only after the work queued on those streams so far has
// finished; until then it is "pending free": active but not allocated.
// Freeing an address that is not an allocated block of this allocator
// (never allocated, or already freed) fails with an error wrapping
// device.ErrInvalidPointer and changes nothing.
func (a *Allocator) Free(p device.Ptr) error {
	if p == 0 {
		return nil
	}
	a.mu.Lock()
	err := a.freeLocked(p)
	if selfCheck {
		a.selfCheckLocked("Free")
	}
	a.mu.Unlock()
	return err
}

func (a *Allocator) freeLocked(p device.Ptr) error {
	b := a.live.remove(p)
	if b == nil {
		return a.invalidPointerLocked("free", p)
	}
	var events []pendingEvent
	if b.recorded {
		var err error
		events, err = a.recordUsesLocked(b)
		if err != nil {
			a.live.put(b) // nothing changed
			return err
		}
	}
	b.allocated = false
	a.st.Allocation.Decrease(b.pool.stat, 1)
	a.st.AllocatedBytes.Decrease(b.pool.stat, int64(b.size))
	if b.size >= a.maxSplit {
		a.st.OversizeAllocations.Decrease(1)
	}
	if len(a.observers) > 0 {
		a.notifyLocked(Action{Kind: ActionFreeRequested, Ptr: p, Size: b.size, Requested: b.requested, Stream: b.stream})
	}
	if b.recorded {
		delete(a.uses, b)
		b.recorded = false
	}
	if len(events) > 0 {
		for _, e := range events {
			a.enqueueLocked(e)
		}
		b.eventCount = int32(len(events))
		return nil
	}
	a.freeBlockLocked(b)
	return nil
}

// invalidPointerLocked builds the error for a pointer that is not an
// allocated block, saying what it is if the allocator knows.
func (a *Allocator) invalidPointerLocked(op string, p device.Ptr) error {
	what := "not allocated by this allocator"
	for _, q := range a.queues {
		for _, e := range q.events[q.head:] {
			if e.b.ptr == p {
				what = "already freed (its free is waiting for stream events): double free"
			}
		}
	}
	if seg := a.segmentOfLocked(p); seg != nil && what == "not allocated by this allocator" {
		what = "inside a cached segment but not the start of an allocated block: double free or bad pointer"
	}
	return fmt.Errorf("allocator: %s %v on device %d: %s: %w", op, p, a.ordinal, what, device.ErrInvalidPointer)
}

// segmentOfLocked returns the segment containing p, or nil. Only used on
// error paths: it scans every segment.
func (a *Allocator) segmentOfLocked(p device.Ptr) *segment {
	for _, s := range a.segments {
		if p >= s.ptr && uint64(p-s.ptr) < s.size {
			return s
		}
	}
	return nil
}

// recordUsesLocked records an event on every stream b was used on. If the
// device cannot record one, the events recorded so far are released and the
// streams are synchronized instead, which is just as safe; if even that
// fails, the error is returned and nothing has changed.
func (a *Allocator) recordUsesLocked(b *block) ([]pendingEvent, error) {
	uses := a.uses[b]
	events := make([]pendingEvent, 0, len(uses))
	for _, s := range uses {
		ev, err := a.dev.RecordEvent(s)
		if err != nil {
			for _, e := range events {
				_ = a.dev.ReleaseEvent(e.ev)
			}
			for _, s := range uses {
				if serr := a.dev.SynchronizeStream(s); serr != nil {
					return nil, fmt.Errorf("allocator: free %v on device %d: recording an event on stream %d: %w (synchronizing instead failed too: %v)", b.ptr, a.ordinal, s, err, serr)
				}
			}
			return nil, nil
		}
		events = append(events, pendingEvent{ev: ev, stream: s, b: b})
	}
	return events, nil
}

func (a *Allocator) enqueueLocked(e pendingEvent) {
	stream := e.stream
	i, found := slices.BinarySearchFunc(a.queues, stream, func(q *eventQueue, s device.Stream) int {
		switch {
		case q.stream < s:
			return -1
		case q.stream > s:
			return 1
		}
		return 0
	})
	if !found {
		a.queues = slices.Insert(a.queues, i, &eventQueue{stream: stream})
	}
	q := a.queues[i]
	q.events = append(q.events, e)
	a.pending++
}

// freeBlockLocked completes the free of b: merges it with free neighbours
// and puts the result in its pool's free index (PyTorch's free_block). The
// merged block keeps the place of a neighbour already in the index when
// its larger key still fits there, which saves a delete and an insert.
func (a *Allocator) freeBlockLocked(b *block) {
	ptr, size, requested := b.ptr, b.size, b.requested
	p, seg := b.pool, b.seg
	prev, next := b.prev, b.next
	mergePrev := prev != nil && prev.isFree()
	mergeNext := next != nil && next.isFree()
	var netBlocks, netBytes int64
	if mergePrev {
		netBlocks--
		netBytes -= int64(prev.size)
	}
	if mergeNext {
		netBlocks--
		netBytes -= int64(next.size)
	}
	// The survivor is the struct that ends up as the merged block.
	var merged *block
	switch {
	case !mergePrev && !mergeNext:
		merged = b
		b.requested = 0
		p.insert(b)
	case mergePrev:
		if mergeNext {
			p.remove(next)
		}
		total := prev.size + b.size
		if mergeNext {
			total += next.size
		}
		inPlace := a.canGrowInPlace(p, prev)
		if !inPlace {
			p.remove(prev)
		}
		after := b.next
		if mergeNext {
			after = next.next
		}
		prev.size = total
		prev.next = after
		if after != nil {
			after.prev = prev
		}
		a.recycle(b)
		if mergeNext {
			a.recycle(next)
		}
		merged = prev
		if inPlace {
			prev.gcCountBase = p.gcCalls
		} else {
			p.insert(prev)
		}
	default: // only the next neighbour is free
		total := b.size + next.size
		inPlace := a.canGrowInPlace(p, next)
		if !inPlace {
			p.remove(next)
		}
		next.ptr = b.ptr
		next.size = total
		next.prev = b.prev
		if next.prev != nil {
			next.prev.next = next
		} else {
			next.seg.head = next
		}
		a.recycle(b)
		merged = next
		if inPlace {
			next.gcCountBase = p.gcCalls
		} else {
			p.insert(next)
		}
	}
	if merged.isSplit() {
		netBlocks++
		netBytes += int64(merged.size)
	}
	if !seg.expandable() { // expandable blocks are never "inactive split"
		switch {
		case netBlocks > 0:
			a.st.InactiveSplit.Increase(p.stat, netBlocks)
		case netBlocks < 0:
			a.st.InactiveSplit.Decrease(p.stat, -netBlocks)
		}
		switch {
		case netBytes > 0:
			a.st.InactiveSplitBytes.Increase(p.stat, netBytes)
		case netBytes < 0:
			a.st.InactiveSplitBytes.Decrease(p.stat, -netBytes)
		}
	}
	a.st.Active.Decrease(p.stat, 1)
	a.st.ActiveBytes.Decrease(p.stat, int64(size))
	a.st.RequestedBytes.Decrease(p.stat, int64(requested))
	if len(a.observers) > 0 {
		a.notifyLocked(Action{Kind: ActionFreeCompleted, Ptr: ptr, Size: size, Requested: requested, Stream: merged.stream})
	}
}

// RecordStream marks the allocated block at p as used on stream s too, as
// PyTorch's recordStream: when the block is freed, it is reused only after
// the work queued on s by then has finished. Recording the block's own
// stream does nothing.
func (a *Allocator) RecordStream(p device.Ptr, s device.Stream) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	b := a.live.get(p)
	if b == nil {
		return a.invalidPointerLocked("record stream for", p)
	}
	if !a.knownStreamLocked(s) {
		return fmt.Errorf("allocator: record stream for %v: stream %d is not a stream of device %d: %w", p, s, a.ordinal, device.ErrInvalidStream)
	}
	if s == b.stream {
		return nil
	}
	if a.uses == nil {
		a.uses = make(map[*block][]device.Stream)
	}
	if u := a.uses[b]; !slices.Contains(u, s) {
		a.uses[b] = append(u, s)
	}
	b.recorded = true
	if len(a.observers) > 0 {
		a.notifyLocked(Action{Kind: ActionRecordStream, Ptr: p, Size: b.size, Requested: b.requested, Stream: s})
	}
	return nil
}

// processEventsLocked completes the deferred frees whose events are done
// (PyTorch's process_events). Events of one stream complete in order, so
// each queue is read from the front until an event is not done yet. A
// device error on a query is treated as "not done": the block stays
// pending, which is safe.
func (a *Allocator) processEventsLocked() {
	for _, q := range a.queues {
		for q.head < len(q.events) {
			e := q.events[q.head]
			done, err := a.dev.EventDone(e.ev)
			if err != nil || !done {
				break
			}
			a.completeEventLocked(q)
		}
	}
	a.compactQueuesLocked()
}

// completeEventLocked pops the front event of q, whose work is done.
func (a *Allocator) completeEventLocked(q *eventQueue) {
	e := q.events[q.head]
	q.events[q.head] = pendingEvent{}
	q.head++
	a.pending--
	_ = a.dev.ReleaseEvent(e.ev) // the event is done; failing to destroy it leaks only the handle
	e.b.eventCount--
	if e.b.eventCount == 0 {
		a.freeBlockLocked(e.b)
	}
}

// compactQueuesLocked drops empty queues.
func (a *Allocator) compactQueuesLocked() {
	a.queues = slices.DeleteFunc(a.queues, func(q *eventQueue) bool {
		if q.head == len(q.events) {
			return true
		}
		if q.head > 64 && q.head*2 > len(q.events) {
			q.events = append(q.events[:0], q.events[q.head:]...)
			q.head = 0
		}
		return false
	})
}

// synchronizeAndFreeEventsLocked waits for every outstanding event and
// completes the frees waiting on them (PyTorch's
// synchronize_and_free_events; counted in NumSyncAllStreams).
func (a *Allocator) synchronizeAndFreeEventsLocked() error {
	a.st.NumSyncAllStreams++
	var errs []error
	for _, q := range a.queues {
		for q.head < len(q.events) {
			if err := a.dev.SynchronizeEvent(q.events[q.head].ev); err != nil {
				errs = append(errs, fmt.Errorf("allocator: device %d: waiting for stream %d: %w", a.ordinal, q.stream, err))
				break
			}
			a.completeEventLocked(q)
		}
	}
	a.compactQueuesLocked()
	return errors.Join(errs...)
}

// EmptyCache waits for outstanding stream events, then returns every cached
// segment that is wholly free to the device (PyTorch's emptyCache).
// Segments holding any allocated or pending block stay. An error from the
// device leaves the blocks it concerns cached; the others are released.
func (a *Allocator) EmptyCache() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.observers) > 0 {
		a.notifyLocked(Action{Kind: ActionEmptyCache})
	}
	err := a.releaseCachedLocked()
	if selfCheck {
		a.selfCheckLocked("EmptyCache")
	}
	return err
}

// releaseCachedLocked synchronizes events and releases every unsplit free
// block of both pools.
func (a *Allocator) releaseCachedLocked() error {
	err := a.synchronizeAndFreeEventsLocked()
	err2 := a.releaseBlocksLocked(a.large)
	err3 := a.releaseBlocksLocked(a.small)
	return errors.Join(err, err2, err3)
}

// releaseBlocksLocked releases every free block of p that fills its
// segment.
func (a *Allocator) releaseBlocksLocked(p *pool) error {
	list := a.collected[:0]
	var unmap []*block
	p.free.Ascend(func(b *block) bool {
		switch {
		case b.seg.expandable():
			unmap = append(unmap, b)
		case !b.isSplit():
			list = append(list, b)
		}
		return true
	})
	var errs []error
	for _, b := range list {
		if err := a.releaseBlockLocked(b); err != nil {
			errs = append(errs, err)
		}
	}
	clear(list)
	a.collected = list[:0]
	for _, b := range unmap {
		if err := a.unmapBlockLocked(b); err != nil {
			errs = append(errs, err)
			continue
		}
		if !b.isSplit() && b.unmapped {
			if err := a.releaseExpandableLocked(b); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// releaseBlockLocked returns the segment of the free, unsplit block b to
// the device. On a device error nothing changes.
func (a *Allocator) releaseBlockLocked(b *block) error {
	if err := a.dev.Free(b.ptr); err != nil {
		return fmt.Errorf("allocator: device %d: releasing segment %v: %w", a.ordinal, b.ptr, err)
	}
	p := b.pool
	a.st.NumDeviceFree++
	a.reserved -= b.size
	a.st.Segment.Decrease(p.stat, 1)
	a.st.ReservedBytes.Decrease(p.stat, int64(b.size))
	if b.size >= a.maxSplit {
		a.st.OversizeSegments.Decrease(1)
	}
	p.remove(b)
	delete(a.segments, b.ptr)
	if len(a.observers) > 0 {
		a.notifyLocked(Action{Kind: ActionSegmentFree, Ptr: b.ptr, Size: b.size, Stream: b.stream})
	}
	a.recycle(b)
	return nil
}

// releaseAvailableLocked frees cached oversize blocks of p on stream s to
// make room for a request of size bytes (PyTorch's
// release_available_cached_blocks): the smallest single block of at least
// max(size, max_split_size) if there is one, else oversize blocks from the
// largest down until that many bytes are released. It does nothing without
// max_split_size.
func (a *Allocator) releaseAvailableLocked(p *pool, size uint64, s device.Stream) bool {
	if a.maxSplit == maxSplitNone {
		return false
	}
	want := max(size, a.maxSplit)
	a.key.stream, a.key.size, a.key.ptr = s, want, 0
	a.found = nil
	p.free.AscendGreaterOrEqual(&a.key, a.foundFunc)
	b := a.found
	a.found = nil
	if b != nil && b.stream == s && !b.seg.expandable() {
		return a.releaseBlockLocked(b) == nil
	}
	// No single block is large enough: release oversize blocks from the
	// largest down (expandable ones are passed over, not released).
	list := a.collected[:0]
	var total uint64
	p.free.DescendLessOrEqual(&a.key, func(c *block) bool {
		if total >= want || c.size < a.maxSplit || c.stream != s {
			return false
		}
		if !c.seg.expandable() {
			list = append(list, c)
			total += c.size
		}
		return true
	})
	var released uint64
	for _, c := range list {
		n := c.size
		if a.releaseBlockLocked(c) == nil {
			released += n
		}
	}
	clear(list)
	a.collected = list[:0]
	return released >= want
}

// garbageCollectLocked releases cached large blocks that have gone unused
// longest when reserved memory passes the threshold (PyTorch's
// garbage_collect_cached_blocks). Each pass releases every unsplit block at
// least as old as the average, until enough is reclaimed.
func (a *Allocator) garbageCollectLocked() {
	threshold := uint64(a.cfg.GarbageCollectionThreshold * float64(a.allowed))
	if a.reserved <= threshold {
		return
	}
	target := a.reserved - threshold
	p := a.large
	var totalAge int64
	count := 0
	p.free.Ascend(func(b *block) bool {
		if !b.isSplit() {
			totalAge += p.gcCalls - b.gcCountBase
			count++
		}
		return true
	})
	if count == 0 {
		return
	}
	var reclaimed uint64
	freed := true
	for reclaimed < target && freed && count > 0 {
		ageThreshold := float64(totalAge) / float64(count)
		freed = false
		list := a.collected[:0]
		p.free.Ascend(func(b *block) bool {
			if !b.isSplit() && !b.seg.expandable() && float64(p.gcCalls-b.gcCountBase) >= ageThreshold {
				list = append(list, b)
			}
			return true
		})
		for _, b := range list {
			age, n := p.gcCalls-b.gcCountBase, b.size
			if a.releaseBlockLocked(b) != nil {
				continue
			}
			freed = true
			reclaimed += n
			totalAge -= age
			count--
		}
		clear(list)
		a.collected = list[:0]
	}
}

// newBlock returns a zeroed block struct, recycled when possible. New
// structs come in slabs of blockSlab, so that blocks created together sit
// together in memory, which helps the free index's comparisons.
func (a *Allocator) newBlock() *block {
	if len(a.spare) == 0 {
		slab := make([]block, blockSlab)
		for i := range slab {
			a.spare = append(a.spare, &slab[len(slab)-1-i])
		}
	}
	n := len(a.spare)
	b := a.spare[n-1]
	a.spare[n-1] = nil
	a.spare = a.spare[:n-1]
	return b
}

const blockSlab = 64

// recycle keeps a dead block struct for reuse.
func (a *Allocator) recycle(b *block) {
	*b = block{}
	if len(a.spare) < 4096 {
		a.spare = append(a.spare, b)
	}
}

// Stats returns a copy of the allocator's statistics.
func (a *Allocator) Stats() stats.DeviceStats {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.st.stats()
}

// ResetPeakStats makes every peak equal to its current value
// (torch.cuda.reset_peak_memory_stats).
func (a *Allocator) ResetPeakStats() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.st.resetPeak()
}

// ResetAccumulatedStats zeroes the cumulative sums and counters
// (torch.cuda.reset_accumulated_memory_stats).
func (a *Allocator) ResetAccumulatedStats() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.st.resetAccumulated()
}

// LargestFreeBlock returns the size of the largest cached free block.
func (a *Allocator) LargestFreeBlock() uint64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.largestFreeLocked()
}

func (a *Allocator) largestFreeLocked() uint64 {
	var largest uint64
	for _, p := range [2]*pool{a.small, a.large} {
		p.free.Ascend(func(b *block) bool {
			largest = max(largest, b.size)
			return true
		})
	}
	return largest
}
