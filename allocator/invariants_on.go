//go:build gpumem_invariants

// This file turns on the self-check after every operation, for builds
// with the gpumem_invariants tag.

package allocator

import "fmt"

// selfCheck is true in builds with the gpumem_invariants tag: every
// operation that changes the allocator ends with CheckInvariants' walk.
const selfCheck = true

// selfCheckLocked panics when the allocator's state is inconsistent. A
// panic here is a bug in gpumem, never a caller's mistake: it exists only
// in builds with the gpumem_invariants tag, for tests and debugging.
func (a *Allocator) selfCheckLocked(op string) {
	if err := a.checkLocked(); err != nil {
		panic(fmt.Sprintf("gpumem: allocator invariants broken after %s: %v", op, err))
	}
}
