//go:build !gpumem_invariants

package allocator_test

// selfChecks is true in builds with the gpumem_invariants tag, where every
// call walks the whole allocator: the soaks shrink to a few thousand
// operations then.
const selfChecks = false
