// Package tracetest holds what the tests of trace's subpackages (the
// converters and importers) share: reading a trace file whole, checking
// ops against the format's live-ID rules, and gzip-compressing a trace's
// text.
//
// # Model
//
// Each helper takes the part of testing.TB it uses and fails the test
// with t.Fatalf at the first thing that is wrong; what it returns is for
// the caller's own assertions. The package imports only trace.
package tracetest

import (
	"bytes"
	"compress/gzip"

	"github.com/gpumem/gpumem/trace"
)

// Gzip returns s compressed with gzip, as a .gz trace file holds it.
func Gzip(t TB, s string) []byte {
	t.Helper()
	var b bytes.Buffer
	zw := gzip.NewWriter(&b)
	if _, err := zw.Write([]byte(s)); err != nil {
		t.Fatalf("tracetest: gzip: %v", err)
	}
	if err := zw.Close(); err != nil {
		t.Fatalf("tracetest: gzip: %v", err)
	}
	return b.Bytes()
}

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
