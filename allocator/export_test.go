package allocator

// SelfCheck tells the external tests whether this build checks the
// invariants after every operation (the gpumem_invariants tag), so that
// the long ones can shrink.
const SelfCheck = selfCheck
