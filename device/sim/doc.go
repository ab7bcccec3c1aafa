// Package sim is a simulated GPU: a pure-Go, deterministic model of a
// device on which the caching allocator, its tests, trace replays and
// benchmarks run without a GPU. A *Device implements device.Device and
// every optional capability: device.VirtualMemory, device.HostMemory,
// device.StreamChecker, device.UsageReporter, device.StreamWaiter,
// device.ProgressReporter, device.Copier and device.StreamOrderedMemory.
//
// It is a model, not a mock: memory is charged in pages against a
// capacity, addresses follow one fixed rule, streams hold work until the
// test says it has run, every call costs simulated time, and faults can be
// injected into any call that can fail on a real card.
//
// # Device memory
//
// A device has a capacity and a page size (default 80 GiB and 2 MiB; the
// page size is also the virtual-memory granularity). Every Malloc is
// charged in whole pages, as a real card's cudaMemGetInfo shows: MemInfo
// returns (capacity - charged bytes, capacity). Malloc(0), and a size
// whose rounding to pages would overflow, fail with device.ErrInvalidSize;
// a Malloc charging more than is free fails with an error wrapping
// device.ErrOutOfMemory (a *device.Error naming the operation and device).
// Free of an address that is not the start of a live allocation fails
// with device.ErrInvalidPointer. A failed call changes no memory state.
//
// # The address rule
//
// Addresses are fake and sparse: no host memory backs them, so an 80 GiB
// device costs nothing. They follow one rule, fixed for good, because
// replays are compared with other allocators replayed on a device with the
// same rule (it decides, for instance, which of two equal free blocks is
// the lower):
//
//   - Device memory of ordinal o is the region [(o+1)<<44, (o+1)<<44 +
//     1<<43). Malloc takes the lowest free address of that region where
//     the charged pages fit (first fit). Every allocation starts on a page
//     boundary and occupies whole pages.
//   - Freed ranges merge with free neighbours and are reused by the same
//     rule.
//   - The region (8 TiB) is not bounded by capacity: capacity bounds the
//     sum of charged pages, physical pages need not be contiguous, and so
//     a Malloc fails for lack of free capacity, never for lack of a hole.
//     (Only a pathologically fragmented 8 TiB region could lack a hole; the
//     error then says so.)
//   - Virtual-memory reservations come from the region [1<<56 + o<<50,
//     1<<56 + (o+1)<<50), 1 PiB, by the same first-fit rule: room for the
//     address ranges of expandable segments (9/8 of the device's memory
//     per stream and pool) on the largest device.
//
// The same calls therefore give the same addresses, on any machine, in any
// run. Free ranges are kept in a treap ordered by address in which every
// node knows the largest free range below it, so first fit costs
// O(log free ranges), not a scan.
//
// # Streams and events
//
// The default stream is 0 and always valid. NewStream numbers a device's
// streams 1, 2, 3, ... in creation order; the handle of stream n is
// ordinal<<32 | n (plain n on ordinal 0), so that a stream of another
// device is never taken for one of this device. Other values fail with
// device.ErrInvalidStream. RecordEvent returns ids 1, 2, 3, ...; ids are
// never reused, and a released or unknown id fails with
// device.ErrInvalidEvent. Live events are kept in a ring of slots by id
// (eventTable), with a map only for the few held past the ring's 4096
// newest ids, so that recording, querying and releasing an event allocate
// nothing once the ring has grown to what a caller keeps outstanding.
//
// By default work finishes at once: an event recorded on a stream is done
// as soon as it is recorded. A test holds a stream with SetStreamBusy(s,
// true): events recorded on s then stay pending until CompleteStream(s),
// SynchronizeStream(s), Synchronize() or SynchronizeEvent(e) of one of
// them, which finishes the stream's work up to and including e, as a
// caller waiting on e would see. A stream stays busy after such a
// completion: events recorded later are pending again until the next one.
// SetStreamBusy(s, false) finishes the pending work and returns the
// stream to finishing at once.
//
// WaitEvent(s, e) (device.StreamWaiter, cuStreamWaitEvent) makes the work
// recorded on s from then on wait for e: while e is pending, events
// recorded later on s stay pending too, on a busy stream or not. Work that
// finishes s (CompleteStream, SynchronizeStream, SynchronizeEvent of a
// later event, SetStreamBusy(s, false)) first finishes the awaited work of
// e's stream, as the device would have run it; once e is done, s runs on.
// Waiting on an event already done, or on one of s itself, holds nothing.
// WaitStream(s, t) is WaitEvent(s, e) on an event e recorded on t at the
// call, without e: nothing is left to release, and it counts as a
// StreamWait.
//
// A stream can also be adopted: AdoptStreamHandle(h) takes a stream a runtime
// names h (on a GPU, its CUstream) and numbers it like a stream NewStream
// made; StreamHandle gives the name back, ReleaseStream forgets the handle.
// 0 and StreamLegacy name the default stream; StreamPerThread, the
// per-thread default stream, is one stream of its own here. This is the
// CUDA backend's adoption, so that programs sharing their streams with
// gpumem run on the simulated device.
//
// Free charges a device synchronization to the clock and counts it, as
// cudaFree implies one, but it does not finish held work: held work
// finishes only when the test says so, or, in a replay, when the trace's
// s and S lines do. That keeps a replay's event timing a function of the
// trace, not of how often the allocator happens to free.
//
// # Virtual memory
//
// Reserve(size) takes a range of the reservation region (size a positive
// multiple of the granularity) and charges nothing. Map(p, size) backs
// granularity-aligned pages inside one reservation, none of them mapped
// yet, charging them against the same capacity as Malloc. Mapping is
// tracked per page, as if each page were its own physical allocation: one
// Unmap may cover pages of several Maps or part of one, as long as every
// page it names is mapped. Release(p) takes a reservation's base and
// requires that nothing in it is mapped. Misuse fails with
// device.ErrInvalidArgument (size 0 with device.ErrInvalidSize) and
// changes nothing.
//
// # Host memory
//
// HostAlloc returns real Go memory (make([]byte, size)), up to
// Config.HostCapacity live at once; HostFree identifies the allocation by
// its first byte, as cudaFreeHost does by pointer.
//
// # Contents and copies
//
// Addresses are fake, but the device keeps what is copied to it
// (device.Copier), sparsely: only 4 KiB pages ever written hold bytes,
// unwritten memory reads as zeros, and freeing, unmapping or returning
// memory to the pool drops its bytes, so a 6 GiB device holding 6 GiB of
// allocations costs host memory only for what was written. A copy must
// lie inside one live Malloc allocation (its requested bytes), one mapped
// range or one live pool block, else it fails with
// device.ErrInvalidPointer. Copies cost Costs.Copy plus Costs.CopyPerGiB.
//
// # The stream-ordered pool
//
// MallocAsync and FreeAsync (device.StreamOrderedMemory) model the CUDA
// driver's default memory pool. The pool takes chunks of at least
// PoolChunk bytes from the device's capacity (charged as Malloc's pages
// are) and cuts blocks, rounded to PoolAlignment, from the lowest free
// bytes the stream may use. A free is queued on its stream as one unit of
// work: the block is reusable at once by that stream, and by other
// streams once the stream has run the free (after the events recorded on
// it before, and the work it waits for with WaitEvent). A synchronization (Synchronize,
// SynchronizeStream, SynchronizeEvent) returns idle chunks to the device
// while the pool holds more than its release threshold (default 0);
// TrimPool does the same down to a given size. A growth the device cannot
// hold fails with device.ErrOutOfMemory; FailNthMalloc and the other
// malloc faults apply to growths, FailFrees to FreeAsync.
//
// # Costs and the clock
//
// Every call adds its simulated cost (Costs; DefaultCosts are near a real
// driver) to the device clock (Clock), whether it succeeds or fails: a
// real driver spends time on a failed cudaMalloc too. Free adds the cost
// of a device synchronization on success. Test controls
// (SetStreamBusy, CompleteStream, the Fail methods) and the read-only
// methods (Counters, Clock, Allocations, ...) cost nothing. With
// Config.Sleep each call also really sleeps for its cost, after releasing
// the device's lock.
//
// # Counters
//
// Counters counts successful calls (Mallocs, Frees, Maps, ...), failed
// ones (FailedMallocs counts every Malloc that returned an error;
// FailedFrees every Free; FailedMaps the Maps that ran out of memory;
// FailedUnmaps and FailedEventQueries the injected failures), and bytes:
// BytesInUse is what is charged against capacity (Malloc pages, mapped
// pages and pool chunks), PeakBytesInUse its high-water mark.
//
// # Faults
//
// The faults below are the simulator's own, tied to its model (a Malloc
// above a size, a predicate on sizes, the countdown shared by Malloc and
// Map). To fail the Nth call of any kind on any backend, wrap the device
// with package device/faulty.
//
// FailNthMalloc, FailMallocAbove and FailMallocWhen make Malloc and Map
// fail with device.ErrOutOfMemory; FailFrees makes Free and Unmap fail
// with a given error; FailEventQueries makes EventDone and SynchronizeEvent
// fail with a given error. Arguments are checked first, so an invalid call
// fails with its own error whatever the faults. A call failed by a fault
// changes nothing but the failure counters and the clock.
//
// # Concurrency
//
// A Device is safe for concurrent use. One mutex, Device.mu, guards all
// mutable state; every exported method takes it for a short, bounded time
// and never while sleeping or calling user code (FailMallocWhen's
// predicate runs before the lock is taken). Helpers named ...Locked expect
// it held.
package sim
