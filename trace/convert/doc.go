// Package convert turns any allocation log the project reads into
// memtrace: PyTorch memory snapshots (trace/pytorch), RMM logs
// (trace/rmm) and memtrace itself, plain or gzip.
//
// Detect tells the formats apart by their first bytes, and Convert runs
// the matching importer, checks the result against the format's rules
// with a trace.Validator and writes memtrace whose header says where it
// came from, how it was converted and a line of figures (ops,
// allocations, peak live bytes, streams). It sits above the importers so
// that each of them, and package trace, stays free of the others.
package convert
