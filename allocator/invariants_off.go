//go:build !gpumem_invariants

// This file leaves the per-operation self-check out of normal builds.

package allocator

// selfCheck is false in normal builds; build with -tags gpumem_invariants
// to check the invariants after every operation.
const selfCheck = false

func (a *Allocator) selfCheckLocked(string) {}
