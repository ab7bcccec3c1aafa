//go:build !gpumem_invariants

package plan

// selfChecks is false in builds without the gpumem_invariants tag (see
// selfcheck_on_test.go).
const selfChecks = false
