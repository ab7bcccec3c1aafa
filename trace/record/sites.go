// This file holds the Recorder's answer to an out-of-memory error: the
// call sites that hold the most live memory.

package record

import (
	"cmp"
	"slices"

	"github.com/gpumem/gpumem/allocator"
)

var _ allocator.SiteReporter = (*Recorder)(nil)

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
		name := "unknown"
		if f, ok := r.sites.Site(b.Stack); ok {
			name = f.String()
		}
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
