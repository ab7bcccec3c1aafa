// Package device defines what gpumem needs from a GPU: a small Device
// interface that every backend implements, optional capabilities that a
// backend may add, the value types that cross the boundary (Ptr, Stream,
// Event) and the errors a backend returns.
//
// # Model
//
// A Device hands out ranges of device memory (Malloc/Free), reports how much
// memory is free (MemInfo), and runs work on streams. The allocator never
// touches device memory itself; it only needs addresses and sizes, so a Ptr
// is an opaque integer address. A Stream is a queue of work on the device;
// DefaultStream is always valid. An Event marks a point in a stream's queue:
// it is done once all work queued on that stream before the event has
// finished. The caching allocator uses events to learn when a block that
// was used on another stream may be reused.
//
// # Capabilities
//
// Backends differ in what they can do beyond the minimum. Optional
// capabilities are separate small named interfaces, discovered with a type
// assertion, so that a backend implements only what it can:
//
//	if vm, ok := dev.(device.VirtualMemory); ok { ... }
//
// The capabilities are these:
//
//   - VirtualMemory (reserve an address range, map physical pages into it)
//     backs expandable segments. A VirtualMemory whose Granularity is 0 has
//     the methods but not the means (a CUDA device without virtual memory
//     management): callers treat it as absent.
//   - HostMemory (page-locked host memory) backs the host allocator.
//   - StreamChecker (is this stream one of the device's?) lets the caching
//     allocator refuse a foreign stream up front.
//   - UsageReporter (the bytes the device's own allocations hold) lets the
//     caching allocator's self-check compare its books with the device's.
//   - StreamWaiter (a stream waits, on the device, for an event recorded
//     on another, or for another stream's work so far) lets the caching
//     allocator's low_fragmentation policy lend a block cached on one
//     stream to a request on another without blocking the host
//     (cuStreamWaitEvent).
//   - ProgressReporter (which streams ran work since an earlier moment)
//     lets the allocators poll the events of their deferred frees on the
//     streams that ran, not on every stream with events pending.
//   - Copier (copy bytes between device and host memory) lets a pool that
//     is put to sleep keep its contents in host memory and restore them.
//   - StreamOrderedMemory (the device's own stream-ordered pool,
//     cuMemAllocFromPoolAsync / cuMemFreeAsync) backs the allocator's
//     backend:cudaMallocAsync.
//
// Capabilities are what every consumer may rely on, whatever the backend.
// What only one backend offers, such as the simulator's cost clock or its
// control over when a stream's work finishes, stays a method of that
// backend's type, reached through that type.
//
// # Adaptors
//
// An adaptor wraps a Device and adds behaviour to every call (counting in
// package device/counting, fault injection in device/faulty), as RMM's
// resource adaptors wrap a memory resource. Because support is a type
// assertion, an adaptor must offer exactly the capabilities of the device
// it wraps: one it hides would be lost (no expandable segments over a
// counted device), one it adds would be a lie (expandable segments over a
// device that cannot map pages). An adaptor therefore implements every
// capability's methods on its own type but never hands that type out;
// it hands out WithCapabilitiesOf(adaptor, inner), a Device that calls the
// adaptor's methods and passes exactly the type assertions inner passes.
// Compose builds such a Device from explicit parts, CapabilitiesOf lists
// what a device offers. Adaptors compose: each layer forwards to the one
// below, and the capabilities are those of the innermost device.
//
// There is deliberately no way down through an adaptor (no Unwrap): a
// capability found beneath an adaptor would be called around it, uncounted
// and unfailed. A caller that needs a backend's own methods, such as the
// simulator's SetStreamBusy, keeps its own reference to the backend.
// Adaptors name the kinds of fallible call with Call (CallMalloc, CallMap,
// ...), whose String is the operation name backends put in Error.Op.
//
// # Errors
//
// Backends wrap the sentinel errors of this package (ErrOutOfMemory,
// ErrInvalidPointer, ErrInvalidStream, ErrInvalidSize, ErrInvalidEvent,
// ErrInvalidArgument) so that callers test them with errors.Is, whatever the
// backend. A backend never panics on bad input; it returns one of these.
//
// # Concurrency
//
// Every Device implementation must be safe for concurrent use by multiple
// goroutines.
package device

import (
	"errors"
	"fmt"
	"strings"
)

// Ptr is a device address. The zero Ptr is the null pointer: no valid
// allocation ever starts at address zero.
type Ptr uint64

// String formats the address as hexadecimal, as CUDA tools print pointers.
func (p Ptr) String() string { return fmt.Sprintf("0x%x", uint64(p)) }

// Format implements fmt.Formatter: %v and %s print String's "0x..." (%q
// quotes it), and the integer verbs print the number, with their flags,
// width and precision: %x gives "2a", %#x "0x2a", %X "2A", %d "42".
func (p Ptr) Format(f fmt.State, verb rune) {
	switch verb {
	case 'v', 's', 'q':
		if verb == 'v' {
			verb = 's'
		}
		directive := fmt.FormatString(f, verb)
		if verb == 's' {
			// '#' means nothing to %s, and %#v of a number is its hex.
			directive = strings.Replace(directive, "#", "", 1)
		}
		fmt.Fprintf(f, directive, p.String())
	default:
		fmt.Fprintf(f, fmt.FormatString(f, verb), uint64(p))
	}
}

// Stream identifies a queue of work on one device. DefaultStream (zero) is
// the device's default (legacy) stream and is always valid. Other values
// come from Device.NewStream; their meaning is private to the backend.
type Stream uint64

// DefaultStream is the device's default stream.
const DefaultStream Stream = 0

// Event identifies a marker recorded on a stream. The zero Event is never
// returned by a backend.
type Event uint64

// Device is the minimum a backend provides. All methods are safe for
// concurrent use.
type Device interface {
	// Ordinal is the device's index among the devices of its backend.
	Ordinal() int
	// Name is a human-readable name, such as "NVIDIA H100 80GB HBM3".
	Name() string

	// Malloc reserves size bytes of device memory (size > 0). When the
	// device cannot satisfy it, the error wraps ErrOutOfMemory.
	Malloc(size uint64) (Ptr, error)
	// Free returns memory obtained from Malloc. Like cudaFree, it may
	// synchronize the device. Freeing an address that Malloc did not return,
	// or returning one twice, fails with ErrInvalidPointer.
	Free(p Ptr) error
	// MemInfo reports the device's free and total memory in bytes, as
	// cudaMemGetInfo does.
	MemInfo() (free, total uint64, err error)
	// Synchronize blocks until all work on every stream of the device has
	// finished.
	Synchronize() error

	// NewStream creates a stream. Streams live as long as the device.
	NewStream() (Stream, error)
	// SynchronizeStream blocks until the work queued on s has finished.
	SynchronizeStream(s Stream) error

	// RecordEvent records an event on stream s: the event is done once all
	// work queued on s before this call has finished.
	RecordEvent(s Stream) (Event, error)
	// EventDone reports whether the work before the event has finished,
	// without blocking (cudaEventQuery).
	EventDone(e Event) (bool, error)
	// SynchronizeEvent blocks until the event is done (cudaEventSynchronize).
	SynchronizeEvent(e Event) error
	// ReleaseEvent destroys an event. A released event must not be used
	// again.
	ReleaseEvent(e Event) error
}

// VirtualMemory is the optional capability to reserve virtual address
// ranges and map physical memory into them in units of Granularity bytes,
// as the CUDA driver's cuMemAddressReserve / cuMemCreate / cuMemMap do. The
// caching allocator builds expandable segments on it.
type VirtualMemory interface {
	// Granularity is the unit, in bytes, of reservations and mappings; 0
	// when the device cannot map memory after all (see the package doc).
	Granularity() uint64
	// Reserve reserves size bytes of address space (a multiple of
	// Granularity) and returns its base. No physical memory is used.
	Reserve(size uint64) (Ptr, error)
	// Map backs [p, p+size) inside a reservation with physical memory; p and
	// size are multiples of Granularity and the range must not be mapped.
	// When there is not enough physical memory the error wraps
	// ErrOutOfMemory and nothing is mapped.
	Map(p Ptr, size uint64) error
	// Unmap releases the physical memory behind [p, p+size), which must be
	// mapped.
	Unmap(p Ptr, size uint64) error
	// Release frees a whole reservation that Reserve returned; every page of
	// it must be unmapped.
	Release(p Ptr) error
}

// StreamChecker is the optional capability to tell whether a stream
// belongs to the device. The caching allocator uses it to reject, up front
// and with a clear error, a stream of another device or one never created;
// without it, such a stream fails only when an event is recorded on it.
type StreamChecker interface {
	HasStream(s Stream) bool
}

// ProgressReporter is the optional capability to say which streams have
// run work since an earlier moment, so that a caller holding events of many
// streams asks about the events of those streams alone (the caching
// allocators poll their deferred frees this way).
type ProgressReporter interface {
	// Progressed calls f on each stream whose recorded work has finished
	// further since mark, a value an earlier call returned (0 before the
	// first), a stream possibly more than once, and returns the mark of
	// now. ok false means that the device no longer knows what happened
	// since mark: the caller must ask about every stream.
	Progressed(mark uint64, f func(Stream)) (now uint64, ok bool)
}

// HostMemory is the optional capability to allocate page-locked (pinned)
// host memory that the device can access directly.
type HostMemory interface {
	// HostAlloc returns size bytes of pinned host memory.
	HostAlloc(size uint64) ([]byte, error)
	// HostFree releases memory that HostAlloc returned.
	HostFree(b []byte) error
}

// UsageReporter is the optional capability to report how much device
// memory the device's own allocations hold. The caching allocator's
// self-check (CheckInvariants) compares it with the bytes the allocator
// believes it has reserved.
type UsageReporter interface {
	// BytesInUse returns the bytes held by live Malloc allocations (as
	// the device charges them, rounded up to its pages) and by mapped
	// virtual-memory pages. It is a bookkeeping read: it calls no driver,
	// costs nothing and changes nothing.
	BytesInUse() uint64
}

// StreamWaiter is the optional capability to make a stream wait, on the
// device and without blocking the caller, for an event or for another
// stream's work, as the CUDA driver's cuStreamWaitEvent does: work queued
// on s after the call starts only once what it waits for is done. The
// caching allocator's low_fragmentation policy uses it to hand a block
// freed on one stream to a request on another (as RMM and CUDA's
// stream-ordered allocator do), and its cudaMallocAsync backend to order a
// free after every stream that used the block.
type StreamWaiter interface {
	// WaitEvent makes the work queued on s from now on wait until e is
	// done. Waiting on an event of s itself, or on one already done,
	// changes nothing. The event may be released right after the call;
	// the wait stays in force.
	WaitEvent(s Stream, e Event) error
	// WaitStream makes the work queued on s from now on wait until the
	// work queued on t so far is done: WaitEvent on an event just recorded
	// on t, with no event left to release (CUDA records an event the
	// backend keeps for the purpose, then waits on it). Waiting on s
	// itself changes nothing.
	WaitStream(s, t Stream) error
}

// Copier is the optional capability to copy bytes between device memory
// and host memory (cuMemcpyDtoH / cuMemcpyHtoD on CUDA). The range must lie
// inside memory the device handed out and that is backed (mapped) now.
type Copier interface {
	// CopyToHost copies len(dst) bytes starting at device address src into dst.
	CopyToHost(dst []byte, src Ptr) error
	// CopyFromHost copies src to device memory starting at dst.
	CopyFromHost(dst Ptr, src []byte) error
}

// StreamOrderedMemory is the optional capability of a stream-ordered
// allocator: the device's own memory pool, cuMemAllocFromPoolAsync /
// cuMemFreeAsync on CUDA.
type StreamOrderedMemory interface {
	// MallocAsync allocates size bytes for use on stream s, in s's order.
	MallocAsync(size uint64, s Stream) (Ptr, error)
	// FreeAsync returns p to the pool in s's order: work queued on s after
	// the free may reuse it at once; other streams only once s's work queued
	// before the free is done.
	FreeAsync(p Ptr, s Stream) error
	// SetReleaseThreshold sets how many reserved bytes the pool keeps when
	// a synchronization lets it return memory to the device.
	SetReleaseThreshold(bytes uint64) error
	// TrimPool returns reserved memory the pool does not use to the device,
	// keeping at least keep bytes reserved.
	TrimPool(keep uint64) error
	// PoolUsage reports the pool's reserved and used bytes, with their peaks.
	PoolUsage() (PoolUsage, error)
	// ResetPoolPeaks sets both peaks to the current values.
	ResetPoolPeaks() error
}

// PoolUsage is what StreamOrderedMemory.PoolUsage reports.
type PoolUsage struct {
	Reserved, ReservedPeak uint64 // bytes the pool holds from the device
	Used, UsedPeak         uint64 // bytes allocated from the pool and not yet freed
}

// Sentinel errors. Backends wrap them (fmt.Errorf("...: %w", ErrX)) and
// callers test them with errors.Is.
var (
	// ErrOutOfMemory: the device has not enough free memory.
	ErrOutOfMemory = errors.New("out of memory")
	// ErrInvalidPointer: an address the device did not hand out, or one
	// already returned.
	ErrInvalidPointer = errors.New("invalid device pointer")
	// ErrInvalidStream: a stream that does not exist on this device.
	ErrInvalidStream = errors.New("invalid stream")
	// ErrInvalidEvent: an event that does not exist or was released.
	ErrInvalidEvent = errors.New("invalid event")
	// ErrInvalidSize: a size of zero, or one too large to represent.
	ErrInvalidSize = errors.New("invalid size")
	// ErrInvalidArgument: any other argument the backend cannot accept,
	// such as a misaligned virtual-memory range.
	ErrInvalidArgument = errors.New("invalid argument")
	// ErrNotSupported: the backend lacks the operation.
	ErrNotSupported = errors.New("operation not supported")
)

// Error is the error type backends return when they have more to say than
// a sentinel: the operation, the device and the backend's own code and
// text. It wraps one of the sentinel errors, so errors.Is works through it.
type Error struct {
	Op      string // "malloc", "free", "record event", ...
	Device  int    // device ordinal
	Code    int    // backend-specific code (a CUresult for CUDA), 0 if none
	Message string // backend-specific text, "" if none
	Err     error  // the sentinel this error is a case of
}

func (e *Error) Error() string {
	s := fmt.Sprintf("device %d: %s: %v", e.Device, e.Op, e.Err)
	if e.Message != "" {
		s += " (" + e.Message
		if e.Code != 0 {
			s += fmt.Sprintf(", code %d", e.Code)
		}
		s += ")"
	}
	return s
}

// Unwrap returns the sentinel error.
func (e *Error) Unwrap() error { return e.Err }
