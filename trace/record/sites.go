// This file holds the Recorder's answer to an out-of-memory error: the
// call sites that hold the most live memory.

package record

import (
	"cmp"
	"slices"

	"github.com/gpumem/gpumem/allocator"
	"github.com/gpumem/gpumem/stats"
)

var (
	_ allocator.SiteReporter = (*Recorder)(nil)
	_ allocator.LeakReporter = (*Recorder)(nil)
)

// siteKey groups live blocks for leak detection: call site and requested
// size.
type siteKey struct {
	site string
	size uint64
}

// siteOfLocked names the call site of a live block.
func (r *Recorder) siteOfLocked(b *LiveBlock) string {
	if f, ok := r.sites.Site(b.Stack); ok {
		return f.String()
	}
	return "unknown"
}

// countSitesLocked records, at a step boundary, how many live blocks each
// (call site, size) group holds.
func (r *Recorder) countSitesLocked() {
	alive := make(map[siteKey]int64)
	for _, b := range r.stacks {
		alive[siteKey{r.siteOfLocked(b), b.Size}]++
	}
	r.steps.Record(alive)
}

// Leaks implements allocator.LeakReporter: with Options.Stacks, the groups
// of allocations by call site and requested size whose number alive grew
// at each of the last two step boundaries (Allocator.MarkStep) or more,
// largest first; ok is false without Options.Stacks. Allocator.Leaks
// returns these when such a Recorder is attached.
func (r *Recorder) Leaks() (leaks []stats.Leak, ok bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.keep {
		return nil, false
	}
	r.steps.Growing(2, func(k siteKey, alive []int64, grew int) {
		leaks = append(leaks, stats.Leak{Site: k.site, Size: k.size, Alive: alive, Grew: grew})
	})
	stats.SortLeaks(leaks)
	return leaks, true
}

// LargestSites implements allocator.SiteReporter: it groups the live
// allocations by call site, the first frame of their stack outside this
// library ("function (file.go:line)"), and returns the n sites that hold
// the most bytes (block sizes, as allocated_bytes counts them), largest
// first. It needs Options.Stacks; without it, or for n <= 0, it returns
// nil. The allocator calls it, with its lock held, when it builds an
// out-of-memory error.
func (r *Recorder) LargestSites(n int) []allocator.SiteBytes {
	r.mu.Lock()
	defer r.mu.Unlock()
	if n <= 0 || len(r.stacks) == 0 {
		return nil
	}
	bySite := make(map[string]*allocator.SiteBytes)
	for _, b := range r.stacks {
		name := r.siteOfLocked(b)
		s, ok := bySite[name]
		if !ok {
			s = &allocator.SiteBytes{Site: name}
			bySite[name] = s
		}
		s.Bytes += b.BlockSize
		s.Blocks++
	}
	out := make([]allocator.SiteBytes, 0, len(bySite))
	for _, s := range bySite {
		out = append(out, *s)
	}
	slices.SortFunc(out, func(x, y allocator.SiteBytes) int {
		if c := cmp.Compare(y.Bytes, x.Bytes); c != 0 {
			return c
		}
		return cmp.Compare(x.Site, y.Site)
	})
	if len(out) > n {
		out = out[:n:n]
	}
	return out
}
