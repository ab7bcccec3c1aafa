// Package rmm reads the logs of RAPIDS Memory Manager (RMM), the memory
// resource library of RAPIDS, as memtrace.
//
// RMM's logging_resource_adaptor wraps a memory resource and writes one CSV
// row per call: a header row naming the columns (Thread, Time, Action,
// Pointer, Size, Stream), then allocate, free and "allocate failure" rows
// with the pointer, the size and the cudaStream_t. The log starts when the
// adaptor is installed, which may be after the program began, so it is a
// window of the run.
//
// ReadLog turns such a log into a trace.Import: allocate rows become a
// lines and free rows f lines; blocks freed in the log but allocated
// before it are allocated up front, and blocks alive at its end are freed
// after it, so that the result is a self-consistent trace that replays
// (trace/replay) through any allocator.
package rmm
