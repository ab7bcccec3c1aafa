//go:build gpumem_invariants

package replay

// selfChecks is true in builds with the gpumem_invariants tag, where the
// allocator checks all its invariants after every call; tests that replay
// long traces shrink them then.
const selfChecks = true
