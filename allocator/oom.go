// This file holds the out-of-memory error and its observers.

package allocator

import (
	"fmt"
	"slices"
	"strings"

	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/stats"
)

// OutOfMemoryError is returned by Alloc when neither the cache nor the
// device can serve a request, after the allocator has released what it
// could and retried. It matches device.ErrOutOfMemory with errors.Is; use
// errors.As to read its fields.
type OutOfMemoryError struct {
	Device    int           // device ordinal
	Stream    device.Stream // stream of the request
	Requested uint64        // bytes the caller asked for
	// AllocSize is the size of the segment the allocator tried to obtain
	// from the device: the rounded request, or the 2 MiB / 20 MiB segment a
	// small request shares. PyTorch's message reports this figure.
	AllocSize uint64

	DeviceTotal uint64 // the device's total memory
	DeviceFree  uint64 // the device's free memory, as it reported after the failure
	Allowed     uint64 // the cap on reserved memory (fraction or limit); 0 if none

	Allocated           uint64 // bytes in blocks allocated to callers
	Reserved            uint64 // bytes this allocator holds from the device
	ReservedUnallocated uint64 // Reserved - Allocated: cached and pending blocks
	LargestFreeBlock    uint64 // the largest cached free block

	// Phase is the phase the request was made in (SetPhase), and
	// LiveByPhase the bytes still allocated by each phase, largest first:
	// which phase was running, and which ones hold the memory.
	Phase       string
	LiveByPhase []PhaseBytes

	// HeldElsewhere is the device memory in use that this allocator does
	// not hold: DeviceTotal - DeviceFree - Reserved, memory of other
	// processes, contexts or allocators (0 when the device does not tell).
	HeldElsewhere uint64

	// Sites lists the call sites holding the most allocated memory, largest
	// first, when an attached observer records call stacks (SiteReporter).
	Sites []SiteBytes

	// Err is the device's own error, if the device refused (nil when the
	// configured cap refused without asking the device).
	Err error

	// Hint ends the message: what to try, given the configuration of the
	// allocator that refused and whether its cap refused while the device
	// had the memory (hintFor). Error gives general advice where it is
	// empty, as in an error built by hand.
	Hint string
}

// SiteBytes is the memory allocated from one call site.
type SiteBytes struct {
	Site   string // the call site, as the reporter names it (function and file:line)
	Bytes  uint64
	Blocks int
}

// SiteReporter is an Observer that records call stacks and can say which
// call sites hold the most memory; an out-of-memory error lists them. It is
// called with the allocator's locks held, like Observe.
type SiteReporter interface {
	Observer
	LargestSites(n int) []SiteBytes
}

// LeakReporter is an Observer that records call stacks and can group the
// allocations by call site for leak detection: Allocator.Leaks returns its
// report (ok true) instead of grouping by phase. It is called with the
// allocator's locks held, like Observe.
type LeakReporter interface {
	Observer
	Leaks() (leaks []stats.Leak, ok bool)
}

// maxOOMSites is the number of call sites an out-of-memory error lists;
// maxListed the number of phases its message names.
const (
	maxOOMSites = 5
	maxListed   = 8
)

// Error returns a message modelled on PyTorch's, saying what to try.
func (e *OutOfMemoryError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "gpumem: out of memory. Tried to allocate %s. Device %d has a total capacity of %s of which %s is free. ",
		stats.FormatSize(e.AllocSize), e.Device, stats.FormatSize(e.DeviceTotal), stats.FormatSize(e.DeviceFree))
	if e.Allowed > 0 {
		fmt.Fprintf(&b, "%s allowed; ", stats.FormatSize(e.Allowed))
	}
	fmt.Fprintf(&b, "Of the allocated memory %s is allocated by gpumem, and %s is reserved by gpumem but unallocated (largest free cached block %s).",
		stats.FormatSize(e.Allocated), stats.FormatSize(e.ReservedUnallocated), stats.FormatSize(e.LargestFreeBlock))
	if e.HeldElsewhere > 0 {
		fmt.Fprintf(&b, " %s of device memory is held outside this allocator (other processes or contexts).", stats.FormatSize(e.HeldElsewhere))
	}
	if e.Phase != "" || len(e.LiveByPhase) > 0 {
		fmt.Fprintf(&b, " It failed in phase %q", e.Phase)
		if len(e.LiveByPhase) > 0 {
			b.WriteString("; allocated by phase:")
			for i, p := range e.LiveByPhase {
				if i == maxListed {
					fmt.Fprintf(&b, " and %d more", len(e.LiveByPhase)-i)
					break
				}
				sep := ","
				if i == 0 {
					sep = ""
				}
				fmt.Fprintf(&b, "%s %q %s", sep, p.Phase, stats.FormatSize(p.Bytes))
			}
		}
		b.WriteString(".")
	}
	if len(e.Sites) > 0 {
		b.WriteString(" Largest allocations by call site:")
		for i, s := range e.Sites {
			sep := ";"
			if i == 0 {
				sep = ""
			}
			fmt.Fprintf(&b, "%s %s %s in %d blocks", sep, s.Site, stats.FormatSize(s.Bytes), s.Blocks)
		}
		b.WriteString(".")
	}
	if e.Hint != "" {
		b.WriteString(e.Hint)
	} else {
		b.WriteString(hintGeneral)
	}
	return b.String()
}

// The advice an out-of-memory error ends with (hintFor). As PyTorch has
// since 2.2, it names expandable segments first for fragmentation rather
// than max_split_size_mb, which under expandable segments makes it worse.
const (
	hintGeneral = " If reserved but unallocated memory is large, try expandable_segments:True or gpumem_policy:low_fragmentation to avoid fragmentation, or call EmptyCache between phases."
	hintCap     = " The cap refused the request while the device had the memory: raise it (per_process_memory_fraction, SetMemoryFraction or MemoryLimit)."
	// With expandable segments a pool's free memory merges into ranges
	// that reach max_split_size; a request below it may not take them,
	// nor a larger request one more than max_non_split_rounding above it,
	// so the allocator maps more while that memory stays free (PyTorch
	// 2.6 does the same).
	hintSplitExpandable = " With expandable segments, max_split_size_mb keeps a request below it out of free ranges of that size or more, so free memory stays reserved and unused: unset max_split_size_mb, or call EmptyCache between phases."
	hintExpandable      = " expandable_segments is on: if reserved but unallocated memory is large, try gpumem_policy:low_fragmentation, or call EmptyCache between phases."
	hintPolicy          = " gpumem_policy:%s packs free memory closely already: if reserved but unallocated memory is large, call EmptyCache between phases; if not, the memory in use needs a larger device or a smaller workload."
	hintAsync           = " With backend:cudaMallocAsync the driver's pool keeps freed memory until it is trimmed: if reserved but unallocated memory is large, call EmptyCache between phases."
	hintUncached        = " Nothing is cached, so nothing is fragmented: the memory in use needs a larger device or a smaller workload."
)

// hintFor returns the advice of an out-of-memory error of an allocator
// with configuration cfg; capped reports that its cap refused the request
// while the device had the memory free.
func hintFor(cfg *Config, capped bool) string {
	var h string
	switch {
	case cfg.MaxSplitSize != 0 && cfg.ExpandableSegments && cfg.Policy == PolicyFaithful:
		h = hintSplitExpandable // the policies let any free range serve (splitRule.anyServes)
	case cfg.Policy != PolicyFaithful:
		h = fmt.Sprintf(hintPolicy, cfg.Policy)
	case cfg.ExpandableSegments:
		h = hintExpandable
	default:
		h = hintGeneral
	}
	if capped {
		return hintCap + h
	}
	return h
}

// Is reports whether target is device.ErrOutOfMemory.
func (e *OutOfMemoryError) Is(target error) bool { return target == device.ErrOutOfMemory }

// Unwrap returns the device's error, if any.
func (e *OutOfMemoryError) Unwrap() error { return e.Err }

// OnOutOfMemory registers f to be called, outside the allocator's locks and
// in the goroutine that called Alloc, each time Alloc returns an
// out-of-memory error. It returns a function that unregisters f.
func (a *Allocator) OnOutOfMemory(f func(*OutOfMemoryError)) (remove func()) {
	if !a.made() {
		return func() {}
	}
	a.lockAll()
	defer a.unlockAll()
	a.nextID++
	id := a.nextID
	// Copy on write: Alloc calls the observers after unlocking, from the
	// slice it read under the lock.
	a.oomObservers = append(slices.Clip(a.oomObservers), oomObserver{id: id, f: f})
	return func() {
		a.lockAll()
		defer a.unlockAll()
		a.oomObservers = slices.DeleteFunc(slices.Clone(a.oomObservers), func(o oomObserver) bool { return o.id == id })
	}
}

type oomObserver struct {
	id uint64
	f  func(*OutOfMemoryError)
}

// outOfMemoryLocked builds the error for a request that failed after the
// whole ladder, and records it in the ledger.
func (a *Allocator) outOfMemoryLocked(requested, allocSize uint64, s device.Stream, devErr error) *OutOfMemoryError {
	free, total, err := a.dev.MemInfo()
	if err != nil {
		free, total = 0, a.total
	}
	allocated, reserved := a.allocatedLocked(), a.reservedLocked()
	e := &OutOfMemoryError{
		Device:              a.ordinal,
		Stream:              s,
		Requested:           requested,
		AllocSize:           allocSize,
		DeviceTotal:         total,
		DeviceFree:          free,
		Allowed:             a.allowed,
		Allocated:           allocated,
		Reserved:            reserved,
		ReservedUnallocated: reserved - allocated,
		LargestFreeBlock:    a.largestFreeLocked(),
		Phase:               a.phases[a.phase].name,
		LiveByPhase:         a.liveByPhaseLocked(),
		Err:                 devErr,
	}
	if err == nil && total >= free && total-free > reserved {
		e.HeldElsewhere = total - free - reserved
	}
	e.Hint = hintFor(&a.cfg, devErr == nil && a.allowed > 0 && err == nil && free >= allocSize)
	for _, o := range a.observers {
		if r, ok := o.obs.(SiteReporter); ok {
			e.Sites = r.LargestSites(maxOOMSites)
			break
		}
	}
	a.outOfMemoryRecordedLocked(e)
	return e
}
