//go:build race

package offline

// raceEnabled is whether the race detector is on: it slows the packing of
// 10^5 allocations tenfold, so that test is left to the plain runs.
const raceEnabled = true
