// Package devicetest holds what the tests of the device adaptors share: a
// fixed script of device calls, good and bad, whose transcript shows
// whether a wrapped device behaves as the device it wraps, and a tally of
// the calls it made by kind, to check an adaptor's counts against; and
// the two checks every adaptor's tests make with them: Faithful (the
// script's transcript, the simulator's counters and clock are those of
// the bare device, for every capability subset) and SameCapabilities (an
// adaptor offers what it wraps, no more and no less). It also holds the
// event benchmark that the simulated and the CUDA device both run
// (BenchEventRecordQuery).
package devicetest

import (
	"errors"
	"fmt"
	"strings"

	"github.com/gpumem/gpumem/device"
)

// Tally counts the calls the script made, as package counting counts
// them: every call in Calls, the ones that returned an error in Failed,
// and the sizes of the successful ones that carry a size in Bytes.
type Tally struct {
	Calls  [device.NumCalls]int64
	Failed [device.NumCalls]int64
	Bytes  [device.NumCalls]uint64
}

// Result is what Run saw: one line per call, and the tally.
type Result struct {
	Lines []string
	Tally Tally
}

type run struct {
	d device.Device
	Result
}

// note records one call of kind c carrying size bytes, its outcome and a
// description.
func (r *run) note(c device.Call, size uint64, err error, format string, args ...any) {
	r.Tally.Calls[c]++
	if err != nil {
		r.Tally.Failed[c]++
	} else {
		r.Tally.Bytes[c] += size
	}
	msg := fmt.Sprint(err)
	if c == device.CallHostFree && err != nil {
		// Its message names a Go address, which differs between devices.
		msg = sentinels(err)
	}
	r.Lines = append(r.Lines, fmt.Sprintf("%v: ", c)+fmt.Sprintf(format, args...)+" err="+msg)
}

// sentinels lists the sentinel errors of package device that err wraps.
func sentinels(err error) string {
	var out []string
	for _, s := range []error{device.ErrOutOfMemory, device.ErrInvalidPointer, device.ErrInvalidStream,
		device.ErrInvalidEvent, device.ErrInvalidSize, device.ErrInvalidArgument, device.ErrNotSupported} {
		if errors.Is(err, s) {
			out = append(out, s.Error())
		}
	}
	return strings.Join(out, ", ")
}

func (r *run) line(format string, args ...any) {
	r.Lines = append(r.Lines, fmt.Sprintf(format, args...))
}

// Run makes a fixed sequence of calls on d (a fresh device with at least
// a few MiB free), the calls of each capability only if d offers it, and
// returns the transcript and the tally. Each call is made once at least
// and most are also made with bad arguments. Everything it allocates it
// frees again.
func Run(d device.Device) Result {
	r := &run{d: d}
	caps := device.CapabilitiesOf(d)
	r.line("ordinal %d, name %q, capabilities %v", d.Ordinal(), d.Name(), Offered(d))

	free, total, err := d.MemInfo()
	r.note(device.CallMemInfo, 0, err, "%d of %d", free, total)
	var live []device.Ptr
	for _, size := range []uint64{3 << 20, 1, 0, 1 << 62} {
		p, err := d.Malloc(size)
		r.note(device.CallMalloc, size, err, "%d -> %v", size, p)
		if err == nil {
			live = append(live, p)
		}
	}
	if len(live) > 0 {
		for _, p := range []device.Ptr{live[0], live[0], 0} { // the second is a double free
			err := d.Free(p)
			r.note(device.CallFree, 0, err, "%v", p)
		}
		live = live[1:]
	}
	err = d.Synchronize()
	r.note(device.CallSynchronize, 0, err, "")

	s, err := d.NewStream()
	r.note(device.CallNewStream, 0, err, "-> %d", s)
	for _, st := range []device.Stream{s, 12345} {
		err := d.SynchronizeStream(st)
		r.note(device.CallSynchronizeStream, 0, err, "%d", st)
	}
	var events []device.Event
	for _, st := range []device.Stream{s, 999, device.DefaultStream} {
		e, err := d.RecordEvent(st)
		r.note(device.CallRecordEvent, 0, err, "%d -> %d", st, e)
		if err == nil {
			events = append(events, e)
		}
	}
	bad := device.Event(1 << 40)
	for _, e := range append(events, bad) {
		done, err := d.EventDone(e)
		r.note(device.CallEventDone, 0, err, "%d -> %t", e, done)
		err = d.SynchronizeEvent(e)
		r.note(device.CallSynchronizeEvent, 0, err, "%d", e)
	}
	if w := caps.StreamWaiter; w != nil {
		for _, c := range []struct {
			s device.Stream
			e device.Event
		}{{s, bad}, {12345, bad}} {
			err := w.WaitEvent(c.s, c.e)
			r.note(device.CallWaitEvent, 0, err, "%d on %d", c.s, c.e)
		}
		for _, e := range events {
			err := w.WaitEvent(s, e)
			r.note(device.CallWaitEvent, 0, err, "%d on %d", s, e)
		}
		for _, c := range [][2]device.Stream{{s, device.DefaultStream}, {s, s}, {12345, s}, {s, 12345}} {
			err := w.WaitStream(c[0], c[1])
			r.note(device.CallWaitStream, 0, err, "%d on stream %d", c[0], c[1])
		}
	}
	for _, e := range append(events, bad) {
		err := d.ReleaseEvent(e)
		r.note(device.CallReleaseEvent, 0, err, "%d", e)
	}
	if c := caps.StreamChecker; c != nil {
		r.line("has stream %d: %t, %d: %t", s, c.HasStream(s), 12345, c.HasStream(12345))
	}
	if u := caps.UsageReporter; u != nil {
		r.line("bytes in use: %d", u.BytesInUse())
	}
	if vm := caps.VirtualMemory; vm != nil {
		r.virtualMemory(vm)
	}
	if h := caps.HostMemory; h != nil {
		r.hostMemory(h)
	}
	if c := caps.Copier; c != nil {
		r.copier(c)
	}
	if so := caps.StreamOrderedMemory; so != nil {
		r.streamOrdered(so, s)
	}
	for _, p := range live {
		err := d.Free(p)
		r.note(device.CallFree, 0, err, "%v", p)
	}
	free, total, err = d.MemInfo()
	r.note(device.CallMemInfo, 0, err, "%d of %d", free, total)
	return r.Result
}

func (r *run) virtualMemory(vm device.VirtualMemory) {
	g := vm.Granularity()
	r.line("granularity %d", g)
	if g == 0 {
		return
	}
	for _, size := range []uint64{0, g + 1} {
		p, err := vm.Reserve(size)
		r.note(device.CallReserve, size, err, "%d -> %v", size, p)
	}
	base, err := vm.Reserve(4 * g)
	r.note(device.CallReserve, 4*g, err, "%d -> %v", 4*g, base)
	if err != nil {
		return
	}
	at := func(page uint64) device.Ptr { return base + device.Ptr(page*g) }
	for _, m := range []struct{ page, pages uint64 }{{0, 2}, {1, 1}, {3, 1}} { // the second overlaps the first
		err := vm.Map(at(m.page), m.pages*g)
		r.note(device.CallMap, m.pages*g, err, "%v+%d", at(m.page), m.pages*g)
	}
	for _, m := range []struct{ page, pages uint64 }{{0, 1}, {0, 1}, {2, 1}} { // the second is not mapped any more, the third never was
		err := vm.Unmap(at(m.page), m.pages*g)
		r.note(device.CallUnmap, m.pages*g, err, "%v+%d", at(m.page), m.pages*g)
	}
	err = vm.Release(base) // pages 1 and 3 are still mapped
	r.note(device.CallRelease, 0, err, "%v", base)
	for _, page := range []uint64{1, 3} {
		err := vm.Unmap(at(page), g)
		r.note(device.CallUnmap, g, err, "%v+%d", at(page), g)
	}
	for range 2 { // the second releases it twice
		err := vm.Release(base)
		r.note(device.CallRelease, 0, err, "%v", base)
	}
}

func (r *run) hostMemory(h device.HostMemory) {
	for _, size := range []uint64{0, 4096} {
		b, err := h.HostAlloc(size)
		r.note(device.CallHostAlloc, size, err, "%d -> %d bytes", size, len(b))
		if err != nil {
			continue
		}
		for range 2 { // the second frees it twice
			err := h.HostFree(b)
			r.note(device.CallHostFree, uint64(len(b)), err, "%d bytes", len(b))
		}
	}
}

// copier copies a pattern into a new allocation of 4096 bytes and back,
// makes a copy past its end and one at the null pointer, and frees it.
func (r *run) copier(c device.Copier) {
	p, err := r.d.Malloc(4096)
	r.note(device.CallMalloc, 4096, err, "4096 -> %v", p)
	if err != nil {
		return
	}
	defer func() {
		err := r.d.Free(p)
		r.note(device.CallFree, 0, err, "%v", p)
	}()
	src := []byte("gpumem")
	err = c.CopyFromHost(p+1, src)
	r.note(device.CallCopyFromHost, uint64(len(src)), err, "%v <- %q", p+1, src)
	dst := make([]byte, 8)
	err = c.CopyToHost(dst, p)
	r.note(device.CallCopyToHost, uint64(len(dst)), err, "%v -> %q", p, dst)
	err = c.CopyToHost(dst, 0)
	r.note(device.CallCopyToHost, uint64(len(dst)), err, "null")
	err = c.CopyFromHost(p+4094, src)
	r.note(device.CallCopyFromHost, uint64(len(src)), err, "past the end")
}

// streamOrdered allocates from the pool on s and the default stream,
// frees (once twice, once on an unknown stream), reads the usage, trims
// and resets the peaks.
func (r *run) streamOrdered(so device.StreamOrderedMemory, s device.Stream) {
	var live []device.Ptr
	for _, c := range []struct {
		size uint64
		s    device.Stream
	}{{1 << 20, s}, {4096, device.DefaultStream}, {0, s}, {1, 12345}} {
		p, err := so.MallocAsync(c.size, c.s)
		r.note(device.CallMallocAsync, c.size, err, "%d on %d -> %v", c.size, c.s, p)
		if err == nil {
			live = append(live, p)
		}
	}
	usage := func() {
		u, err := so.PoolUsage()
		r.note(device.CallPoolUsage, 0, err, "%+v", u)
	}
	usage()
	err := so.SetReleaseThreshold(1 << 62)
	r.note(device.CallSetReleaseThreshold, 0, err, "%d", uint64(1<<62))
	if len(live) > 0 {
		err := so.FreeAsync(live[0], 12345)
		r.note(device.CallFreeAsync, 0, err, "%v on %d", live[0], 12345)
	}
	for i, p := range live {
		for range 1 + i%2 { // the second block is freed twice
			err := so.FreeAsync(p, s)
			r.note(device.CallFreeAsync, 0, err, "%v on %d", p, s)
		}
	}
	usage()
	err = so.TrimPool(0)
	r.note(device.CallTrimPool, 0, err, "0")
	err = so.ResetPoolPeaks()
	r.note(device.CallResetPoolPeaks, 0, err, "")
	usage()
	err = so.SetReleaseThreshold(0)
	r.note(device.CallSetReleaseThreshold, 0, err, "0")
}

// Subsets returns d composed with each of the 256 subsets of its
// capabilities (device.Compose), the one with none first; the capabilities
// d lacks stay absent.
func Subsets(d device.Device) []device.Device {
	all := device.CapabilitiesOf(d)
	out := make([]device.Device, 0, 1<<NumCapabilities)
	for mask := range 1 << NumCapabilities {
		var c device.Capabilities
		if mask&1 != 0 {
			c.VirtualMemory = all.VirtualMemory
		}
		if mask&2 != 0 {
			c.HostMemory = all.HostMemory
		}
		if mask&4 != 0 {
			c.StreamChecker = all.StreamChecker
		}
		if mask&8 != 0 {
			c.UsageReporter = all.UsageReporter
		}
		if mask&16 != 0 {
			c.StreamWaiter = all.StreamWaiter
		}
		if mask&32 != 0 {
			c.Copier = all.Copier
		}
		if mask&64 != 0 {
			c.StreamOrderedMemory = all.StreamOrderedMemory
		}
		if mask&128 != 0 {
			c.ProgressReporter = all.ProgressReporter
		}
		out = append(out, device.Compose(d, c))
	}
	return out
}

// NumCapabilities is the number of fields of device.Capabilities.
const NumCapabilities = 8

// Offered reports which capabilities d offers, in the order of the fields
// of device.Capabilities.
func Offered(d device.Device) [NumCapabilities]bool {
	c := device.CapabilitiesOf(d)
	return [NumCapabilities]bool{c.VirtualMemory != nil, c.HostMemory != nil, c.StreamChecker != nil,
		c.UsageReporter != nil, c.StreamWaiter != nil, c.Copier != nil, c.StreamOrderedMemory != nil,
		c.ProgressReporter != nil}
}
