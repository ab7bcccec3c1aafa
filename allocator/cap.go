// This file holds the cap on the bytes the allocator reserves: a
// fraction of the device's memory (SetMemoryFraction,
// per_process_memory_fraction) or a byte limit (Config.MemoryLimit),
// the lower of the two.

package allocator

import "fmt"

// SetMemoryFraction caps the bytes the allocator may reserve at fraction of
// the device's total memory, as PyTorch's set_per_process_memory_fraction;
// 1 caps at the device's memory, which changes nothing but turns a
// garbage-collection threshold on, as in PyTorch.
func (a *Allocator) SetMemoryFraction(fraction float64) error {
	if !(fraction > 0 && fraction <= 1) {
		return fmt.Errorf("allocator: memory fraction %v must be in (0, 1]", fraction)
	}
	if !a.made() {
		return errNotMade
	}
	a.lockAll()
	defer a.unlockAll()
	a.setCapLocked(fraction)
	return nil
}

// setCapLocked sets the memory fraction and recomputes the cap on reserved
// bytes: the fraction of the device's memory or the byte limit, the lower.
func (a *Allocator) setCapLocked(fraction float64) {
	a.cfg.MemoryFraction = fraction
	var allowed uint64
	if fraction > 0 && fraction <= 1 {
		allowed = uint64(fraction * float64(a.total))
		if allowed == 0 {
			allowed = 1 // a tiny fraction still caps: nothing fits
		}
	}
	if limit := a.cfg.MemoryLimit; limit > 0 && (allowed == 0 || limit < allowed) {
		allowed = limit
	}
	a.allowed = allowed
	a.gcActive = allowed > 0 && a.cfg.GarbageCollectionThreshold > 0
	a.aging = a.gcActive || a.pol != nil
}
