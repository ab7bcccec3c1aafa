//go:build gpumem_invariants

package freeindex

// selfCheck: the index checks its preconditions and panics when one is
// broken (the gpumem_invariants build).
const selfCheck = true
