// The stream-ordered memory capability: a model of the CUDA driver's
// default memory pool (cuMemAllocFromPoolAsync, cuMemFreeAsync).

package sim

import (
	"cmp"
	"slices"
	"time"

	"github.com/gpumem/gpumem/device"
)

// Limits of the stream-ordered pool.
const (
	// PoolAlignment is the unit the pool rounds each allocation up to.
	PoolAlignment = 512
	// PoolChunk is the least the pool takes from the device when it grows
	// (less only when the device has no room for it but has room for the
	// request rounded up to pages).
	PoolChunk = 32 << 20
)

// asyncPool is the stream-ordered pool. It holds chunks of device memory
// charged against capacity like Malloc's pages; each chunk is cut into
// fragments, live blocks and free ones, that cover it in address order.
// A free fragment remembers the stream that freed it and the free's
// position in that stream's queue: the same stream may reuse it at once,
// others once the stream has run the free (stream-ordered reuse, as
// CUDA's pools allow by default). Guarded by Device.mu.
//
// Invariants (checked by checkPoolLocked in the tests): the fragments of
// a chunk cover it without gap or overlap; used is the sum of live
// fragments, reserved the sum of chunks; every live fragment is in blocks
// and every block is a live fragment; peaks are at least the currents.
type asyncPool struct {
	chunks       []*poolChunk // by base address
	blocks       map[device.Ptr]*poolChunk
	threshold    uint64
	reserved     uint64
	used         uint64
	reservedPeak uint64
	usedPeak     uint64
}

// poolChunk is one range the pool took from the device.
type poolChunk struct {
	base, size uint64
	free       uint64     // bytes in free fragments: a chunk with less than a request is skipped
	pending    int        // free fragments still tagged with a stream (stream >= 0)
	frags      []poolFrag // cover [base, base+size) in address order; no two neighbours free with the same tag
}

// poolFrag is part of a chunk: a live block or free bytes.
type poolFrag struct {
	addr, size uint64
	live       bool
	// For free bytes: the index of the stream that freed them and the
	// free's position in its queue; stream -1 once every stream may reuse
	// them.
	stream int
	seq    uint64
}

// PoolChunkInfo describes one chunk of the stream-ordered pool, for checkers.
type PoolChunkInfo struct {
	Ptr  device.Ptr
	Size uint64
	Used uint64 // bytes of live blocks in it
}

// readyLocked reports whether stream i may reuse the free fragment f.
func (d *Device) readyLocked(f *poolFrag, i int) bool {
	return f.stream < 0 || f.stream == i || d.streams[f.stream].completed >= f.seq
}

// tidyLocked marks the free fragments whose freeing work is done as free
// for every stream, and merges neighbouring free fragments that every
// stream may reuse, or that one stream freed. A chunk without tagged
// fragments is tidy already (frees merge with their neighbours as they
// happen), so it costs nothing then.
func (d *Device) tidyLocked(c *poolChunk) {
	if c.pending == 0 {
		return
	}
	out := c.frags[:0]
	c.pending = 0
	for _, f := range c.frags {
		if !f.live && f.stream >= 0 && d.streams[f.stream].completed >= f.seq {
			f.stream, f.seq = -1, 0
		}
		if n := len(out); n > 0 && !f.live && !out[n-1].live && out[n-1].stream == f.stream {
			out[n-1].size += f.size
			out[n-1].seq = max(out[n-1].seq, f.seq)
			continue
		}
		if !f.live && f.stream >= 0 {
			c.pending++
		}
		out = append(out, f)
	}
	c.frags = out
}

// mergeAtLocked merges the free fragment j of c with its free neighbours
// of the same tag.
func mergeAtLocked(c *poolChunk, j int) {
	same := func(a, b *poolFrag) bool { return !a.live && !b.live && a.stream == b.stream }
	if j+1 < len(c.frags) && same(&c.frags[j], &c.frags[j+1]) {
		c.frags[j].size += c.frags[j+1].size
		c.frags[j].seq = max(c.frags[j].seq, c.frags[j+1].seq)
		if c.frags[j].stream >= 0 {
			c.pending--
		}
		c.frags = slices.Delete(c.frags, j+1, j+2)
	}
	if j > 0 && same(&c.frags[j-1], &c.frags[j]) {
		c.frags[j-1].size += c.frags[j].size
		c.frags[j-1].seq = max(c.frags[j-1].seq, c.frags[j].seq)
		if c.frags[j].stream >= 0 {
			c.pending--
		}
		c.frags = slices.Delete(c.frags, j, j+1)
	}
}

// idleLocked reports whether the chunk holds no block and every stream may
// reuse all of it: the pool may return it to the device.
func (d *Device) idleLocked(c *poolChunk) bool {
	d.tidyLocked(c)
	return len(c.frags) == 1 && !c.frags[0].live && c.frags[0].stream < 0
}

// MallocAsync allocates size bytes from the device's stream-ordered pool
// for use on stream s (device.StreamOrderedMemory, cuMemAllocFromPoolAsync).
// The size is rounded up to PoolAlignment. It takes the lowest free bytes
// that s may use (its own frees at once, other streams' once their work
// before the free is done); when none fit, the pool grows by a chunk of at
// least PoolChunk bytes charged against capacity. Size 0, or one whose
// rounding overflows, fails with device.ErrInvalidSize, an unknown stream
// with device.ErrInvalidStream, and a growth the device cannot hold (or
// that an injected fault fails: the growth is an allocating call, as
// Malloc is) with device.ErrOutOfMemory; a failed call changes nothing.
func (d *Device) MallocAsync(size uint64, s device.Stream) (device.Ptr, error) {
	injected := d.predicateSays(size)
	d.mu.Lock()
	p, t, err := d.mallocAsyncLocked(size, s, injected)
	d.mu.Unlock()
	nap(t)
	return p, err
}

func (d *Device) mallocAsyncLocked(size uint64, s device.Stream, injected bool) (device.Ptr, time.Duration, error) {
	const op = "malloc async"
	t := d.payLocked(d.costs.MallocAsync)
	if size == 0 || size > ^uint64(0)-(d.page-1) {
		d.c.FailedAsyncMallocs++
		return 0, t, d.fail(op, device.ErrInvalidSize, "size %d", size)
	}
	rounded := (size + PoolAlignment - 1) &^ (PoolAlignment - 1)
	i, ok := d.streamIndex(s)
	if !ok {
		d.c.FailedAsyncMallocs++
		_, err := d.streamLocked(op, s)
		return 0, t, err
	}
	pl := &d.pool
	for _, c := range pl.chunks {
		if c.free < rounded {
			continue
		}
		if p, ok := d.carveLocked(c, rounded, i); ok {
			d.c.AsyncMallocs++
			return p, t, nil
		}
	}
	// Grow by a chunk.
	pages, _ := d.pagesFor(rounded)
	chunk := max(pages, PoolChunk)
	if chunk > d.capacity-d.used {
		chunk = pages
	}
	t += d.payLocked(d.costs.malloc(chunk))
	if why := d.faults.mallocFault(size, injected); why != "" {
		d.c.FailedAsyncMallocs++
		return 0, t, d.fail(op, device.ErrOutOfMemory, "%s requested; injected fault: %s", formatBytes(size), why)
	}
	if chunk > d.capacity-d.used {
		d.c.FailedAsyncMallocs++
		return 0, t, d.fail(op, device.ErrOutOfMemory, "%s requested (the pool grows by %s), %s free of %s; the pool holds %s, %s of it in use",
			formatBytes(size), formatBytes(chunk), formatBytes(d.capacity-d.used), formatBytes(d.capacity),
			formatBytes(pl.reserved), formatBytes(pl.used))
	}
	a, ok := d.mem.take(chunk)
	if !ok {
		d.c.FailedAsyncMallocs++
		return 0, t, d.fail(op, device.ErrOutOfMemory, "%s requested: the 8 TiB address region is too fragmented", formatBytes(size))
	}
	c := &poolChunk{base: a, size: chunk, free: chunk, frags: []poolFrag{{addr: a, size: chunk, stream: -1}}}
	at, _ := slices.BinarySearchFunc(pl.chunks, a, func(c *poolChunk, a uint64) int { return cmp.Compare(c.base, a) })
	pl.chunks = slices.Insert(pl.chunks, at, c)
	d.chargeLocked(chunk)
	pl.reserved += chunk
	pl.reservedPeak = max(pl.reservedPeak, pl.reserved)
	d.c.PoolGrowths++
	p, _ := d.carveLocked(c, rounded, i)
	d.c.AsyncMallocs++
	return p, t, nil
}

// carveLocked takes the lowest run of free fragments of c that stream i
// may reuse and that holds size bytes, and makes its first size bytes a
// live block.
func (d *Device) carveLocked(c *poolChunk, size uint64, i int) (device.Ptr, bool) {
	d.tidyLocked(c)
	for from := 0; from < len(c.frags); from++ {
		var run uint64
		for to := from; to < len(c.frags); to++ {
			f := &c.frags[to]
			if f.live || !d.readyLocked(f, i) {
				from = to // the next run starts after this fragment
				break
			}
			run += f.size
			if run < size {
				continue
			}
			start := c.frags[from].addr
			last := c.frags[to]
			for k := from; k <= to; k++ {
				if c.frags[k].stream >= 0 {
					c.pending--
				}
			}
			repl := []poolFrag{{addr: start, size: size, live: true}}
			if rest := run - size; rest > 0 {
				repl = append(repl, poolFrag{addr: start + size, size: rest, stream: last.stream, seq: last.seq})
				if last.stream >= 0 {
					c.pending++
				}
			}
			c.frags = slices.Replace(c.frags, from, to+1, repl...)
			pl := &d.pool
			if pl.blocks == nil {
				pl.blocks = make(map[device.Ptr]*poolChunk)
			}
			pl.blocks[device.Ptr(start)] = c
			c.free -= size
			pl.used += size
			pl.usedPeak = max(pl.usedPeak, pl.used)
			return device.Ptr(start), true
		}
	}
	return 0, false
}

// blockLocked returns the chunk and the index of the live block at p.
func (d *Device) blockLocked(p device.Ptr) (*poolChunk, int, bool) {
	c, ok := d.pool.blocks[p]
	if !ok {
		return nil, 0, false
	}
	j, found := slices.BinarySearchFunc(c.frags, uint64(p), func(f poolFrag, a uint64) int { return cmp.Compare(f.addr, a) })
	return c, j, found && c.frags[j].live
}

// poolCoversLocked reports whether [lo, hi) lies inside one live block.
func (d *Device) poolCoversLocked(lo, hi uint64) bool {
	at, found := slices.BinarySearchFunc(d.pool.chunks, lo, func(c *poolChunk, a uint64) int { return cmp.Compare(c.base, a) })
	if !found {
		at--
	}
	if at < 0 {
		return false
	}
	c := d.pool.chunks[at]
	if lo >= c.base+c.size {
		return false
	}
	j, found := slices.BinarySearchFunc(c.frags, lo, func(f poolFrag, a uint64) int { return cmp.Compare(f.addr, a) })
	if !found {
		j--
	}
	f := c.frags[j]
	return f.live && hi <= f.addr+f.size
}

// FreeAsync returns the block at p to the pool in stream s's order
// (device.StreamOrderedMemory, cuMemFreeAsync): s may reuse it at once,
// other streams once s has run the free, which is queued on s as one unit
// of work after what s holds (events recorded on it, and what it waits for
// with WaitEvent): at once on a stream that is not busy and waits for
// nothing, else when that work finishes. Its contents are dropped. An address
// that is not a live block's start fails with device.ErrInvalidPointer, an
// unknown stream with device.ErrInvalidStream, and changes nothing.
// FailFrees applies.
func (d *Device) FreeAsync(p device.Ptr, s device.Stream) error {
	const op = "free async"
	d.mu.Lock()
	t := d.payLocked(d.costs.FreeAsync)
	err := d.freeAsyncLocked(op, p, s)
	if err != nil {
		d.c.FailedAsyncFrees++
	}
	d.mu.Unlock()
	nap(t)
	return err
}

func (d *Device) freeAsyncLocked(op string, p device.Ptr, s device.Stream) error {
	c, j, ok := d.blockLocked(p)
	if !ok {
		return d.fail(op, device.ErrInvalidPointer, "%v is not a block MallocAsync returned, or it was freed already", p)
	}
	if _, err := d.streamLocked(op, s); err != nil {
		return err
	}
	if err := d.faults.freeErr; err != nil {
		return d.fail(op, err, "%v: injected fault", p)
	}
	i, _ := d.streamIndex(s)
	d.queueLocked(i) // the free is work on s, after what s holds
	f := &c.frags[j]
	f.live, f.stream, f.seq = false, i, d.streams[i].queued
	if d.streams[i].completed >= f.seq {
		f.stream, f.seq = -1, 0 // run at once: free for every stream
	} else {
		c.pending++
	}
	delete(d.pool.blocks, p)
	d.pool.used -= f.size
	c.free += f.size
	d.dropLocked(f.addr, f.addr+f.size)
	mergeAtLocked(c, j)
	d.c.AsyncFrees++
	return nil
}

// releasePoolLocked returns idle chunks to the device, the highest first,
// while the pool holds more than keep bytes, never going below keep.
func (d *Device) releasePoolLocked(keep uint64) time.Duration {
	var t time.Duration
	pl := &d.pool
	for k := len(pl.chunks) - 1; k >= 0 && pl.reserved > keep; k-- {
		c := pl.chunks[k]
		if pl.reserved-c.size < keep || !d.idleLocked(c) {
			continue
		}
		pl.chunks = slices.Delete(pl.chunks, k, k+1)
		d.mem.give(c.base, c.size)
		d.unchargeLocked(c.size)
		d.dropLocked(c.base, c.base+c.size)
		pl.reserved -= c.size
		d.c.PoolReleases++
		t += d.payLocked(d.costs.Free)
	}
	return t
}

// settlePoolLocked is what a synchronization does to the pool: it returns
// idle chunks above the release threshold to the device.
func (d *Device) settlePoolLocked() time.Duration {
	if d.pool.reserved <= d.pool.threshold {
		return 0
	}
	return d.releasePoolLocked(d.pool.threshold)
}

// SetReleaseThreshold sets how many reserved bytes the pool keeps when a
// synchronization (Synchronize, SynchronizeStream, SynchronizeEvent) lets
// it return idle chunks to the device (device.StreamOrderedMemory). The
// default is 0, as CUDA's: every synchronization returns all idle chunks.
// It costs nothing.
func (d *Device) SetReleaseThreshold(bytes uint64) error {
	d.mu.Lock()
	d.pool.threshold = bytes
	d.mu.Unlock()
	return nil
}

// TrimPool returns idle chunks to the device, the highest first, keeping
// at least keep bytes reserved (device.StreamOrderedMemory,
// cuMemPoolTrimTo). A chunk holding a block, or bytes whose free another
// stream's work still orders, stays. Each chunk returned costs Costs.Free.
func (d *Device) TrimPool(keep uint64) error {
	d.mu.Lock()
	t := d.releasePoolLocked(keep)
	d.c.PoolTrims++
	d.mu.Unlock()
	nap(t)
	return nil
}

// PoolUsage reports the pool's reserved and used bytes with their peaks
// (device.StreamOrderedMemory). Used counts each block at its rounded
// size. It costs nothing.
func (d *Device) PoolUsage() (device.PoolUsage, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	pl := &d.pool
	return device.PoolUsage{Reserved: pl.reserved, ReservedPeak: pl.reservedPeak, Used: pl.used, UsedPeak: pl.usedPeak}, nil
}

// ResetPoolPeaks sets both peaks of the pool to the current values
// (device.StreamOrderedMemory). It costs nothing.
func (d *Device) ResetPoolPeaks() error {
	d.mu.Lock()
	d.pool.reservedPeak, d.pool.usedPeak = d.pool.reserved, d.pool.used
	d.mu.Unlock()
	return nil
}

// PoolChunks returns the chunks of the stream-ordered pool in address
// order.
func (d *Device) PoolChunks() []PoolChunkInfo {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make([]PoolChunkInfo, len(d.pool.chunks))
	for k, c := range d.pool.chunks {
		out[k] = PoolChunkInfo{Ptr: device.Ptr(c.base), Size: c.size}
		for _, f := range c.frags {
			if f.live {
				out[k].Used += f.size
			}
		}
	}
	return out
}
