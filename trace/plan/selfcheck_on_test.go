//go:build gpumem_invariants

package plan

// selfChecks is true in builds with the gpumem_invariants tag, where the
// allocator walks its whole state after every call: tests whose subject
// is not the allocator's state, and that replay traces dozens of times,
// leave it to the untagged runs then.
const selfChecks = true
