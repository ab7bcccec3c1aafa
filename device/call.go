// The kinds of device call that can fail, by which adaptors count and
// inject faults.

package device

import (
	"fmt"
	"strconv"
)

// Call names a kind of fallible device call: a method of Device or of an
// optional capability that returns an error. Adaptors count calls and
// inject faults by Call. Its String is the operation name that backends
// put in Error.Op.
type Call uint8

// The fallible calls: every method of Device and of the capabilities that
// returns an error. (Ordinal, Name, Granularity, HasStream and BytesInUse
// cannot fail and are not Calls.)
const (
	CallMalloc              Call = iota // Device.Malloc
	CallFree                            // Device.Free
	CallMemInfo                         // Device.MemInfo
	CallSynchronize                     // Device.Synchronize
	CallNewStream                       // Device.NewStream
	CallSynchronizeStream               // Device.SynchronizeStream
	CallRecordEvent                     // Device.RecordEvent
	CallEventDone                       // Device.EventDone
	CallSynchronizeEvent                // Device.SynchronizeEvent
	CallReleaseEvent                    // Device.ReleaseEvent
	CallReserve                         // VirtualMemory.Reserve
	CallMap                             // VirtualMemory.Map
	CallUnmap                           // VirtualMemory.Unmap
	CallRelease                         // VirtualMemory.Release
	CallHostAlloc                       // HostMemory.HostAlloc
	CallHostFree                        // HostMemory.HostFree
	CallWaitEvent                       // StreamWaiter.WaitEvent
	CallCopyToHost                      // Copier.CopyToHost
	CallCopyFromHost                    // Copier.CopyFromHost
	CallMallocAsync                     // StreamOrderedMemory.MallocAsync
	CallFreeAsync                       // StreamOrderedMemory.FreeAsync
	CallSetReleaseThreshold             // StreamOrderedMemory.SetReleaseThreshold
	CallTrimPool                        // StreamOrderedMemory.TrimPool
	CallPoolUsage                       // StreamOrderedMemory.PoolUsage
	CallResetPoolPeaks                  // StreamOrderedMemory.ResetPoolPeaks
	CallWaitStream                      // StreamWaiter.WaitStream

	// NumCalls is the number of Calls: arrays indexed by Call have this
	// length, and Calls run from 0 to NumCalls-1.
	NumCalls
)

var callNames = [NumCalls]string{
	CallMalloc:              "malloc",
	CallFree:                "free",
	CallMemInfo:             "memory info",
	CallSynchronize:         "synchronize",
	CallNewStream:           "new stream",
	CallSynchronizeStream:   "synchronize stream",
	CallRecordEvent:         "record event",
	CallEventDone:           "query event",
	CallSynchronizeEvent:    "synchronize event",
	CallReleaseEvent:        "release event",
	CallReserve:             "reserve",
	CallMap:                 "map",
	CallUnmap:               "unmap",
	CallRelease:             "release",
	CallHostAlloc:           "host alloc",
	CallHostFree:            "host free",
	CallWaitEvent:           "wait event",
	CallCopyToHost:          "copy to host",
	CallCopyFromHost:        "copy from host",
	CallMallocAsync:         "malloc async",
	CallFreeAsync:           "free async",
	CallSetReleaseThreshold: "set release threshold",
	CallTrimPool:            "trim pool",
	CallPoolUsage:           "pool usage",
	CallResetPoolPeaks:      "reset pool peaks",
	CallWaitStream:          "wait stream",
}

// String returns the operation's name, as in Error.Op ("malloc", "query
// event", ...), or "Call(n)" for a value that is not a Call.
func (c Call) String() string {
	if c < NumCalls {
		return callNames[c]
	}
	return "Call(" + strconv.Itoa(int(c)) + ")"
}

// ParseCall returns the Call whose String is s.
func ParseCall(s string) (Call, error) {
	for c, name := range callNames {
		if name == s {
			return Call(c), nil
		}
	}
	return 0, fmt.Errorf("device: %q is not a device call: %w", truncate(s, 64), ErrInvalidArgument)
}

// truncate returns s cut to at most n bytes, so that an error message
// never echoes an unbounded input.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}
