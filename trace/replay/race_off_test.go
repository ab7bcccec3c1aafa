//go:build !race

package replay

// raceDetector is true when the tests run under the race detector, which
// slows every memory access; tests that replay long traces shrink them.
const raceDetector = false
