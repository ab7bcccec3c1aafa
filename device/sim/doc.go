// Package sim is a simulated GPU: a pure-Go, deterministic model of a
// device that the caching allocator, its tests, trace replays and
// benchmarks run on without a GPU. It implements device.Device,
// device.VirtualMemory and device.HostMemory.
//
// # Memory
//
// A device has a capacity and a page size (default 80 GiB and 2 MiB).
// Every Malloc is charged in whole pages against capacity, as a real
// card's cudaMemGetInfo shows, and MemInfo reports capacity less the
// charged bytes. A Malloc that does not fit in what is free fails with an
// error wrapping device.ErrOutOfMemory.
//
// Addresses are fake and sparse: no host memory backs them, so an 80 GiB
// device costs nothing. They follow one fixed rule, which replays rely on
// to compare with other allocators replayed on a device with the same rule
// (it decides ties between equal-size free blocks):
//
//   - first fit at the lowest free address: each allocation starts on a
//     page boundary and occupies whole pages;
//   - freed ranges merge with their free neighbours and are reused;
//   - the address space is not bounded by capacity (physical pages need not
//     be contiguous), so a Malloc fails only for lack of free capacity,
//     never for lack of a contiguous hole;
//   - device memory of ordinal o starts at (o+1)<<44; virtual-memory
//     reservations come from a separate region starting at (o+1)<<44 +
//     1<<43, by the same rule.
//
// The same calls always give the same addresses.
//
// # Streams and events
//
// The default stream is 0; NewStream returns 1, 2, 3, ... in creation
// order (replays map a trace's stream N to the Nth stream created). By
// default work finishes at once: an event recorded on a stream is done
// immediately. A test can hold a stream busy (SetStreamBusy): events
// recorded on it stay pending until CompleteStream, SynchronizeStream,
// Synchronize, or SynchronizeEvent of one of them (which finishes the
// stream's work up to that event, as waiting for it would). Free charges a
// device synchronization to the clock, as cudaFree implies one, but does
// not finish held work: held work finishes only when the test (or a
// trace's s and S lines) says so.
//
// # Costs
//
// Every call adds its cost (Costs; DefaultCosts are near a real driver) to
// a simulated device clock (Clock). With Config.Sleep a call also really
// sleeps that long, outside the device's lock, for demos.
//
// # Faults
//
// FailNthMalloc, FailMallocAbove and FailMallocWhen make Malloc (and Map)
// fail with ErrOutOfMemory; FailFrees makes Free and Unmap fail;
// FailEventQueries makes EventDone and SynchronizeEvent fail. A failed
// call changes nothing but the failure counters.
//
// # Concurrency
//
// A Device is safe for concurrent use: one mutex guards its state, and it
// never sleeps while holding it.
package sim
