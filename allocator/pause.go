// This file holds sleep and wake: pausing a named pool returns its
// physical memory to the device and keeps its address reservations, so
// that its live blocks keep their addresses (PausePool); resuming maps
// fresh pages at the same addresses and, by choice, restores the blocks'
// bytes from pinned host memory (ResumePool).

package allocator

import (
	"errors"
	"fmt"

	"github.com/gpumem/gpumem/allocator/internal/freeindex"
	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/stats"
)

// pageRun is a run of mapped pages of an expandable segment, or the whole
// of a mapped segment.
type pageRun struct {
	seg *freeindex.Segment
	ptr device.Ptr
	n   uint64
}

// savedBlock is a live block's bytes, kept in pinned host memory while
// its pool is paused.
type savedBlock struct {
	ptr device.Ptr
	buf []byte
}

// PausePool puts pool p to sleep: its cached free pages go back to the
// device (as EmptyCache would return them), then the pages under its live
// blocks are unmapped too, keeping the address reservations, so that the
// device can lend the memory elsewhere. The live blocks stay live, at the
// same addresses, but cannot be freed or recorded on a stream until
// ResumePool; the pool counts in no stat while paused (its counts are
// parked, and come back on resume with the peaks they raise; the
// cumulative figures, .allocated and .freed, count the pause as no free
// and the resume as no allocation; its blocks leave their phases'
// current counts likewise, as PhaseStats shows; num_device_free and
// num_device_alloc count the unmaps and maps made), and it cannot be
// routed to or released. With backup, the live blocks' bytes are copied to
// pinned host memory first and restored by ResumePool; without it their
// contents are lost.
//
// Pausing needs a device with virtual memory: the pool's segments are
// then expandable ones (expandable_segments:True), or plain segments
// reserved and mapped whole rather than allocated (pool_mapped.go);
// backup needs a device that copies to and from the host and has pinned
// host memory. Otherwise, and for a pool routed to a stream, a capture
// underway, a pool already paused, or blocks of the pool whose free waits
// for stream events, PausePool fails and changes nothing. A device error
// midway leaves the pool as it was (not paused): the pages unmapped so far
// are mapped again, with their bytes restored when there is a backup; the
// pool's cached free pages returned before the error stay returned.
func (a *Allocator) PausePool(p *Pool, backup bool) error {
	if !a.made() {
		return errNotMade
	}
	a.lockAll()
	defer a.unlockAll()
	if err := a.pausableLocked(p); err != nil {
		return err
	}
	var cp device.Copier
	var hm device.HostMemory
	if backup {
		var ok1, ok2 bool
		cp, ok1 = a.dev.(device.Copier)
		hm, ok2 = a.dev.(device.HostMemory)
		if !ok1 || !ok2 {
			return fmt.Errorf("allocator: pause pool %q with a backup: device %s cannot copy to and from pinned host memory: %w", p.name, a.dev.Name(), device.ErrNotSupported)
		}
	}
	a.settleAllLocked()
	for _, sh := range p.shards {
		// Unmapping does not wait for the device: finish the pool's work.
		if err := a.dev.SynchronizeStream(sh.stream); err != nil {
			return fmt.Errorf("allocator: pause pool %q: synchronizing stream %d: %w", p.name, sh.stream, err)
		}
	}
	if err := errors.Join(a.releasePoolLocked(p.large), a.releasePoolLocked(p.small)); err != nil {
		return fmt.Errorf("allocator: pause pool %q: returning its cached pages: %w", p.name, err)
	}
	runs := a.poolRunsLocked(p)
	var saved []savedBlock
	if backup {
		var err error
		if saved, err = a.backupLocked(p, cp, hm); err != nil {
			return err
		}
	}
	for i, r := range runs {
		if err := a.pvm.Unmap(r.ptr, r.n); err != nil {
			err = fmt.Errorf("allocator: pause pool %q: unmapping %d bytes at %v: %w", p.name, r.n, r.ptr, err)
			if rerr := a.remapLocked(runs[:i], saved, cp); rerr != nil {
				err = fmt.Errorf("%w; mapping the pages back failed too, the pool is partly mapped: %w", err, rerr)
			}
			return errors.Join(err, a.freeSavedLocked(saved, hm))
		}
	}
	for _, r := range runs {
		a.routePagesLocked(r.seg, r.ptr, r.n, -1)
	}
	a.poolPausedLocked(p, runs)
	p.paused, p.runs, p.saved = true, runs, saved
	if selfCheck {
		a.selfCheckLocked("PausePool")
	}
	return nil
}

// pausableLocked returns why pool p cannot be paused now, or nil.
func (a *Allocator) pausableLocked(p *Pool) error {
	if err := a.checkPoolLocked("pause pool", p); err != nil {
		return err
	}
	switch {
	case p.paused:
		return fmt.Errorf("allocator: pause pool %q: it is paused already", p.name)
	case p.routed > 0:
		return fmt.Errorf("allocator: pause pool %q: it is in use on %d stream(s); route them back (UseDefaultPool, EndCapture) first", p.name, p.routed)
	case a.captures > 0:
		return fmt.Errorf("allocator: pause pool %q: a graph capture is underway (no page may be unmapped during one)", p.name)
	case a.pvm == nil:
		return fmt.Errorf("allocator: pause pool %q: pausing unmaps the pool's pages, which needs a device with virtual memory (paged at a granularity dividing 2 MiB); %s has none: %w", p.name, a.dev.Name(), device.ErrNotSupported)
	}
	for _, seg := range a.segments {
		if a.shardOf(seg.Free()).pool == p && !a.pageable(seg) {
			return fmt.Errorf("allocator: pause pool %q: its segment %v of %d bytes is not a multiple of the device's mapping granularity, %d bytes, so it was allocated, not mapped, and cannot be unmapped (expandable_segments:True pages every segment): %w", p.name, seg.Ptr(), seg.Size(), a.pvm.Granularity(), device.ErrNotSupported)
		}
	}
	for _, sh := range p.shards {
		for k := range sh.st[0].pool {
			if sh.st[stats.Active].pool[k].Value() != 0 { // pending blocks
				return fmt.Errorf("allocator: pause pool %q: blocks of the pool wait for stream events before their free completes; synchronize the streams they were recorded on, then allocate or empty the cache, first", p.name)
			}
		}
	}
	return nil
}

// poolRunsLocked returns the runs of mapped pages of pool p's segments.
func (a *Allocator) poolRunsLocked(p *Pool) []pageRun {
	var runs []pageRun
	for _, seg := range a.segments {
		if a.shardOf(seg.Free()).pool != p {
			continue
		}
		if !seg.Expandable() { // a mapped segment: one run
			runs = append(runs, pageRun{seg, seg.Ptr(), seg.Size()})
			continue
		}
		seg.MappedRuns(func(ptr device.Ptr, n uint64) { runs = append(runs, pageRun{seg, ptr, n}) })
	}
	return runs
}

// backupLocked copies the bytes of pool p's live blocks to pinned host
// memory. On an error it frees what it took and returns the error.
func (a *Allocator) backupLocked(p *Pool, cp device.Copier, hm device.HostMemory) ([]savedBlock, error) {
	var saved []savedBlock
	for _, sh := range p.shards {
		var err error
		sh.live.Each(func(b *freeindex.Block) {
			if err != nil {
				return
			}
			var buf []byte
			if buf, err = hm.HostAlloc(b.Size()); err != nil {
				err = fmt.Errorf("allocator: pause pool %q: pinned host memory for the %d bytes of %v: %w", p.name, b.Size(), b.Ptr(), err)
				return
			}
			saved = append(saved, savedBlock{b.Ptr(), buf})
			if err = cp.CopyToHost(buf, b.Ptr()); err != nil {
				err = fmt.Errorf("allocator: pause pool %q: copying %v to the host: %w", p.name, b.Ptr(), err)
			}
		})
		if err != nil {
			return nil, errors.Join(err, a.freeSavedLocked(saved, hm))
		}
	}
	return saved, nil
}

// freeSavedLocked frees the host buffers of saved; one the device does
// not free is kept, for EmptyCache to free later.
func (a *Allocator) freeSavedLocked(saved []savedBlock, hm device.HostMemory) error {
	if hm == nil {
		return nil
	}
	var errs []error
	for _, s := range saved {
		if err := hm.HostFree(s.buf); err != nil {
			a.strayHost = append(a.strayHost, s.buf)
			errs = append(errs, fmt.Errorf("allocator: freeing the host copy of %v: %w", s.ptr, err))
		}
	}
	return errors.Join(errs...)
}

// freeStrayHostLocked frees the host buffers a failed HostFree left.
func (a *Allocator) freeStrayHostLocked() error {
	if len(a.strayHost) == 0 {
		return nil
	}
	hm, _ := a.dev.(device.HostMemory)
	left := a.strayHost
	a.strayHost = nil
	saved := make([]savedBlock, len(left))
	for i, b := range left {
		saved[i].buf = b
	}
	return a.freeSavedLocked(saved, hm)
}

// remapLocked maps the runs again, after a failed pause, and restores the
// saved bytes that lie in them. It maps every run it can and returns the
// errors.
func (a *Allocator) remapLocked(runs []pageRun, saved []savedBlock, cp device.Copier) error {
	var errs []error
	for _, r := range runs {
		if err := a.pvm.Map(r.ptr, r.n); err != nil {
			errs = append(errs, fmt.Errorf("mapping %d bytes at %v: %w", r.n, r.ptr, err))
		}
	}
	if len(errs) == 0 {
		errs = append(errs, a.restoreLocked(saved, cp))
	}
	return errors.Join(errs...)
}

// restoreLocked copies the saved bytes back to their blocks.
func (a *Allocator) restoreLocked(saved []savedBlock, cp device.Copier) error {
	for _, s := range saved {
		if err := cp.CopyFromHost(s.ptr, s.buf); err != nil {
			return fmt.Errorf("copying the bytes of %v back from the host: %w", s.ptr, err)
		}
	}
	return nil
}

// ResumePool wakes the paused pool p: it maps fresh pages at the
// addresses the pool had, so that every live block has its pointer of
// before, restores the blocks' bytes when the pause backed them up, and
// counts the pool in the stats again. When the device is full (or the
// memory cap is reached) it runs the out-of-memory ladder as Alloc does:
// it waits for the stream events and releases the default pool's cached
// memory (and released pools'), and tries again (but while a graph
// capture is underway, when it may neither wait nor free); if that fails
// too it returns an *OutOfMemoryError (counted in num_ooms, and told to the
// OnOutOfMemory observers). Any error leaves the pool paused as it was,
// with its backup. A pool that is not paused is an error.
func (a *Allocator) ResumePool(p *Pool) error {
	if !a.made() {
		return errNotMade
	}
	a.lockAll()
	if err := a.checkPoolLocked("resume pool", p); err != nil {
		a.unlockAll()
		return err
	}
	if !p.paused {
		a.unlockAll()
		return fmt.Errorf("allocator: resume pool %q: it is not paused", p.name)
	}
	cp, _ := a.dev.(device.Copier)
	hm, _ := a.dev.(device.HostMemory)
	var total uint64
	for _, r := range p.runs {
		total += r.n
	}
	err := a.mapRunsLocked(p, total)
	if refused(err) && a.captures == 0 { // no device free while a capture is underway
		_ = a.releaseCachedLocked() // a failed release leaves those blocks cached; the retry decides
		a.retriedLocked()
		err = a.mapRunsLocked(p, total)
	}
	if refused(err) {
		if err == errOverCap {
			err = nil
		}
		s := device.DefaultStream
		if len(p.shards) > 0 {
			s = p.shards[0].stream
		}
		return a.allocFailedLocked(a.outOfMemoryLocked(total, total, s, err))
	}
	if err == nil {
		if err = a.restoreLocked(p.saved, cp); err != nil {
			err = fmt.Errorf("allocator: resume pool %q: %w", p.name, err)
			for _, r := range p.runs {
				if uerr := a.pvm.Unmap(r.ptr, r.n); uerr != nil {
					err = fmt.Errorf("%w; unmapping the pages again failed too, the pool is partly mapped: %w", err, uerr)
				}
			}
		}
	}
	if err != nil {
		a.unlockAll()
		return err
	}
	for _, r := range p.runs {
		a.routePagesLocked(r.seg, r.ptr, r.n, +1)
	}
	a.poolResumedLocked(p, p.runs)
	saved := p.saved
	p.paused, p.runs, p.saved = false, nil, nil
	_ = a.freeSavedLocked(saved, hm) // a buffer the device keeps is freed by EmptyCache
	if selfCheck {
		a.selfCheckLocked("ResumePool")
	}
	a.unlockAll()
	return nil
}

// mapRunsLocked maps the runs of the paused pool p (total bytes), within
// the memory cap. On an error it unmaps what it mapped and returns the
// error: a refusal for lack of memory wraps device.ErrOutOfMemory.
func (a *Allocator) mapRunsLocked(p *Pool, total uint64) error {
	if a.allowed > 0 && a.reservedLocked()+total > a.allowed {
		return errOverCap
	}
	for i, r := range p.runs {
		if err := a.pvm.Map(r.ptr, r.n); err != nil {
			if !refused(err) {
				err = fmt.Errorf("allocator: resume pool %q: mapping %d bytes at %v: %w", p.name, r.n, r.ptr, err)
			}
			for _, m := range p.runs[:i] {
				if uerr := a.pvm.Unmap(m.ptr, m.n); uerr != nil {
					err = fmt.Errorf("%w; unmapping the pages mapped before failed too, the pool is partly mapped: %w", err, uerr)
				}
			}
			return err
		}
	}
	return nil
}

// Paused reports whether pool p is paused (false for a nil Pool).
func (p *Pool) Paused() bool {
	if p == nil || p.a == nil {
		return false
	}
	p.a.lockAll()
	defer p.a.unlockAll()
	return p.paused
}
