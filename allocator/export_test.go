package allocator

import "github.com/gpumem/gpumem/device"

// SelfCheck tells the external tests whether this build checks the
// invariants after every operation (the gpumem_invariants tag), so that
// the long ones can shrink.
const SelfCheck = selfCheck

// liveBlock returns the allocated block at p, or nil, for tests that
// reach into the allocator (which must not run concurrently with them).
func (a *Allocator) liveBlock(p device.Ptr) *block {
	b, _ := a.liveBlockLocked(p)
	return b
}
