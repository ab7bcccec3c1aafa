// Package counting wraps any device.Device and counts the calls made
// through it, as RMM's statistics adaptor counts what passes through a
// memory resource.
//
// # Model
//
// New(inner) returns a Counter; Counter.Device is the device to use in
// inner's place (hand it to allocator.New, replay, ...). Every fallible
// call (each device.Call: malloc, free, memory info, device and stream
// synchronization, event record / query / synchronize / release, reserve,
// map, unmap, release, host alloc / free, wait event, copies to and from
// the host, and the stream-ordered pool's calls) is forwarded to inner and then
// counted: once in Calls whatever its outcome, once more in Failed when it
// returned an error, and, for the calls that carry a size, its bytes in
// Bytes when it succeeded. The infallible reads (Ordinal, Name,
// Granularity, HasStream, BytesInUse) are forwarded and not counted.
//
// The wrapped device offers exactly the optional capabilities of inner
// (see "Adaptors" in package device): wrapping a device without virtual
// memory does not give it virtual memory, and wrapping one with it keeps
// it, its calls counted.
//
// # Cost and concurrency
//
// Counters are atomic: counting adds two or three uncontended atomic
// additions to a call and takes no lock. A Counter is safe for concurrent
// use. Each counter is exact; a snapshot taken while calls are running
// may see one counter of a call and not yet another.
package counting

import (
	"fmt"
	"strings"
	"sync/atomic"

	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/device/internal/intercept"
)

// Counts is a snapshot of what a Counter has counted, indexed by
// device.Call.
type Counts struct {
	// Calls counts the calls of each kind, failed ones included.
	Calls [device.NumCalls]int64
	// Failed counts the calls of each kind that returned an error.
	Failed [device.NumCalls]int64
	// Bytes adds up the sizes of the successful calls that carry one:
	// Malloc, Reserve, Map, Unmap, HostAlloc and MallocAsync sizes, the
	// lengths of the slices HostFree returned and of the host buffers of
	// copies. Free, FreeAsync and Release carry no size (the device knows
	// it; the adaptor does not track it), nor do SetReleaseThreshold and
	// TrimPool (their byte counts are limits), so their Bytes stay 0.
	Bytes [device.NumCalls]uint64
}

// Total returns the number of calls of every kind.
func (c Counts) Total() int64 {
	var n int64
	for _, k := range c.Calls {
		n += k
	}
	return n
}

// Sub returns the counts made between the snapshot prev and c, c taken
// after prev.
func (c Counts) Sub(prev Counts) Counts {
	for k := range device.NumCalls {
		c.Calls[k] -= prev.Calls[k]
		c.Failed[k] -= prev.Failed[k]
		c.Bytes[k] -= prev.Bytes[k]
	}
	return c
}

// String lists the kinds that were called, in device.Call order:
// "malloc 3 (1 failed, 6291456 B), free 2".
func (c Counts) String() string {
	var b strings.Builder
	for k := range device.NumCalls {
		if c.Calls[k] == 0 {
			continue
		}
		if b.Len() > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%v %d", k, c.Calls[k])
		var notes []string
		if c.Failed[k] != 0 {
			notes = append(notes, fmt.Sprintf("%d failed", c.Failed[k]))
		}
		if c.Bytes[k] != 0 {
			notes = append(notes, fmt.Sprintf("%d B", c.Bytes[k]))
		}
		if len(notes) > 0 {
			fmt.Fprintf(&b, " (%s)", strings.Join(notes, ", "))
		}
	}
	if b.Len() == 0 {
		return "no calls"
	}
	return b.String()
}

// A Counter counts the calls made through its Device. The zero Counter is
// not usable; make one with New.
type Counter struct {
	dev    device.Device
	calls  [device.NumCalls]atomic.Int64
	failed [device.NumCalls]atomic.Int64
	bytes  [device.NumCalls]atomic.Uint64
}

// New returns a Counter whose Device forwards to inner. If inner is nil,
// Device returns nil (which allocator.New refuses with an error).
func New(inner device.Device) *Counter {
	c := &Counter{}
	c.dev = intercept.New(inner, hooks{c})
	return c
}

// Device returns the counted device, with exactly inner's capabilities.
func (c *Counter) Device() device.Device { return c.dev }

// Counts returns a snapshot of the counts.
func (c *Counter) Counts() Counts {
	var s Counts
	for k := range device.NumCalls {
		s.Calls[k] = c.calls[k].Load()
		s.Failed[k] = c.failed[k].Load()
		s.Bytes[k] = c.bytes[k].Load()
	}
	return s
}

// Calls returns the number of calls of kind k so far (0 for a k that is
// not a device.Call).
func (c *Counter) Calls(k device.Call) int64 {
	if k >= device.NumCalls {
		return 0
	}
	return c.calls[k].Load()
}

// Reset sets every count to zero. Calls running meanwhile may be counted
// before or after the reset.
func (c *Counter) Reset() {
	for k := range device.NumCalls {
		c.calls[k].Store(0)
		c.failed[k].Store(0)
		c.bytes[k].Store(0)
	}
}

// hooks counts each call once it has returned.
type hooks struct{ c *Counter }

func (hooks) Before(device.Call, uint64) error { return nil }

func (h hooks) After(k device.Call, size uint64, err error) {
	h.c.calls[k].Add(1)
	if err != nil {
		h.c.failed[k].Add(1)
	} else if size != 0 {
		h.c.bytes[k].Add(size)
	}
}
