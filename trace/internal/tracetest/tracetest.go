// Package tracetest holds what the tests of trace's subpackages (the
// converters and importers) share: reading a trace file whole, and
// checking ops against the format's live-ID rules.
//
// # Model
//
// Each helper takes the part of testing.TB it uses and fails the test
// with t.Fatalf at the first thing that is wrong; what it returns is for
// the caller's own assertions. The package imports only trace.
package tracetest

import "github.com/gpumem/gpumem/trace"

// TB is the part of testing.TB the helpers use.
type TB interface {
	Helper()
	Fatalf(format string, args ...any)
}

// ReadFile returns every op of the memtrace file at path (trace.ReadFile),
// or fails the test.
func ReadFile(t TB, path string) []trace.Op {
	t.Helper()
	ops, err := trace.ReadFile(path)
	if err != nil {
		t.Fatalf("tracetest: %v", err)
	}
	return ops
}

// Live checks ops, in order, with a trace.Validator, failing the test at
// the first op it refuses, and returns the number of IDs still live after
// the last op.
func Live(t TB, ops []trace.Op) int {
	t.Helper()
	v := trace.NewValidator()
	for i, op := range ops {
		if _, err := v.Check(op, i+1); err != nil {
			t.Fatalf("tracetest: op %d of %d: %v", i+1, len(ops), err)
		}
	}
	return v.Live()
}
