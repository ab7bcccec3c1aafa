// Package gorgonia makes gorgonia.org/tensor allocate device memory through
// gpumem's caching allocator: Engine is a tensor.Engine whose Alloc and Free
// are allocator.Alloc and allocator.Free on one stream, so that tensors made
// with tensor.WithEngine(e) take their memory from gpumem's cache instead of
// a first-fit arena or cuMemAlloc per tensor.
//
// # Model
//
// An Engine holds an allocator and the stream its tensors are used on
// (device.DefaultStream, or a stream the runtime adopted, see
// device/cuda.Device.AdoptStream). Alloc returns a Block, the device address
// and size, which implements tensor.Memory; Free takes any tensor.Memory
// whose address came from Alloc (a Block, or the *tensor.Dense made on it).
// The Engine is a tensor.NonStdEngine: tensors made on it are marked
// manually managed, since their memory is the device's, not Go's, and the
// caller frees them (e.Free(t, int64(t.MemSize()))).
//
// Device memory is not Go memory: AllocAccessible is false and Accessible
// fails, so tensor's Go-side operations (Data, element access) must not be
// used on these tensors. Memset, Memclr and Memcpy are device operations;
// an Engine does them through a Memops the caller gives (a runtime's own
// memset and copy kernels or driver calls), and without one Memset and
// Memcpy fail with an error wrapping device.ErrNotSupported.
//
// Errors: tensor.New panics when Alloc fails, so out-of-memory during
// tensor.New becomes a panic carrying the allocator's
// *allocator.OutOfMemoryError; call Alloc directly (and tensor.FromMemory)
// to get the error as a value.
//
// This package is a module of its own, so that gpumem's core does not
// depend on gorgonia.
package gorgonia
