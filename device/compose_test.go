package device_test

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpumem/gpumem/device"
)

// fake implements Device and every capability; each method notes that it
// was called on this fake.
type fake struct {
	name  string
	calls []string
}

var errFake = errors.New("fake")

func (f *fake) note(m string) error                             { f.calls = append(f.calls, m); return errFake }
func (f *fake) Ordinal() int                                    { return 0 }
func (f *fake) Name() string                                    { return f.name }
func (f *fake) Malloc(uint64) (device.Ptr, error)               { return 0, f.note("Malloc") }
func (f *fake) Free(device.Ptr) error                           { return f.note("Free") }
func (f *fake) MemInfo() (uint64, uint64, error)                { return 0, 0, f.note("MemInfo") }
func (f *fake) Synchronize() error                              { return f.note("Synchronize") }
func (f *fake) NewStream() (device.Stream, error)               { return 0, f.note("NewStream") }
func (f *fake) SynchronizeStream(device.Stream) error           { return f.note("SynchronizeStream") }
func (f *fake) RecordEvent(device.Stream) (device.Event, error) { return 0, f.note("RecordEvent") }
func (f *fake) EventDone(device.Event) (bool, error)            { return false, f.note("EventDone") }
func (f *fake) SynchronizeEvent(device.Event) error             { return f.note("SynchronizeEvent") }
func (f *fake) ReleaseEvent(device.Event) error                 { return f.note("ReleaseEvent") }
func (f *fake) Granularity() uint64                             { _ = f.note("Granularity"); return 4096 }
func (f *fake) Reserve(uint64) (device.Ptr, error)              { return 0, f.note("Reserve") }
func (f *fake) Map(device.Ptr, uint64) error                    { return f.note("Map") }
func (f *fake) Unmap(device.Ptr, uint64) error                  { return f.note("Unmap") }
func (f *fake) Release(device.Ptr) error                        { return f.note("Release") }
func (f *fake) HostAlloc(uint64) ([]byte, error)                { return nil, f.note("HostAlloc") }
func (f *fake) HostFree([]byte) error                           { return f.note("HostFree") }
func (f *fake) HasStream(device.Stream) bool                    { _ = f.note("HasStream"); return true }
func (f *fake) BytesInUse() uint64                              { _ = f.note("BytesInUse"); return 7 }
func (f *fake) WaitEvent(device.Stream, device.Event) error     { return f.note("WaitEvent") }
func (f *fake) WaitStream(device.Stream, device.Stream) error   { return f.note("WaitStream") }
func (f *fake) CopyToHost([]byte, device.Ptr) error             { return f.note("CopyToHost") }
func (f *fake) CopyFromHost(device.Ptr, []byte) error           { return f.note("CopyFromHost") }
func (f *fake) MallocAsync(uint64, device.Stream) (device.Ptr, error) {
	return 0, f.note("MallocAsync")
}
func (f *fake) FreeAsync(device.Ptr, device.Stream) error { return f.note("FreeAsync") }
func (f *fake) SetReleaseThreshold(uint64) error          { return f.note("SetReleaseThreshold") }
func (f *fake) TrimPool(uint64) error                     { return f.note("TrimPool") }
func (f *fake) PoolUsage() (device.PoolUsage, error) {
	return device.PoolUsage{}, f.note("PoolUsage")
}
func (f *fake) ResetPoolPeaks() error { return f.note("ResetPoolPeaks") }
func (f *fake) Progressed(mark uint64, fn func(device.Stream)) (uint64, bool) {
	_ = f.note("Progressed")
	fn(device.Stream(mark))
	return mark + 1, true
}

// plain implements Device alone.
type plain struct{ fake }

func (p *plain) Device() device.Device {
	return struct{ device.Device }{&p.fake}
}

// numCaps is the number of optional capabilities; offered and subset
// list them in the order of device.Capabilities' fields.
const numCaps = 8

func offered(d device.Device) [numCaps]bool {
	_, vm := d.(device.VirtualMemory)
	_, h := d.(device.HostMemory)
	_, c := d.(device.StreamChecker)
	_, u := d.(device.UsageReporter)
	_, w := d.(device.StreamWaiter)
	_, cp := d.(device.Copier)
	_, so := d.(device.StreamOrderedMemory)
	_, pr := d.(device.ProgressReporter)
	return [numCaps]bool{vm, h, c, u, w, cp, so, pr}
}

// subset returns the capabilities of f that the low numCaps bits of mask
// pick, in offered's order, and which of them it picked.
func subset(mask int, f *fake) (device.Capabilities, [numCaps]bool) {
	var caps device.Capabilities
	var want [numCaps]bool
	for i := range want {
		want[i] = mask&(1<<i) != 0
	}
	if want[0] {
		caps.VirtualMemory = f
	}
	if want[1] {
		caps.HostMemory = f
	}
	if want[2] {
		caps.StreamChecker = f
	}
	if want[3] {
		caps.UsageReporter = f
	}
	if want[4] {
		caps.StreamWaiter = f
	}
	if want[5] {
		caps.Copier = f
	}
	if want[6] {
		caps.StreamOrderedMemory = f
	}
	if want[7] {
		caps.ProgressReporter = f
	}
	return caps, want
}

func TestCapabilitiesOf(t *testing.T) {
	f := &fake{}
	c := device.CapabilitiesOf(f)
	assert.Same(t, f, c.VirtualMemory.(*fake))
	assert.Same(t, f, c.HostMemory.(*fake))
	assert.Same(t, f, c.StreamChecker.(*fake))
	assert.Same(t, f, c.UsageReporter.(*fake))
	assert.Same(t, f, c.StreamWaiter.(*fake))
	assert.Same(t, f, c.Copier.(*fake))
	assert.Same(t, f, c.StreamOrderedMemory.(*fake))
	assert.Same(t, f, c.ProgressReporter.(*fake))
	assert.Equal(t, device.Capabilities{}, device.CapabilitiesOf((&plain{}).Device()))
}

// TestCompose builds a Device of every subset of capabilities from one
// fake's Device methods and another's capabilities: each passes exactly
// the type assertions of its subset, and each method reaches the fake it
// was taken from.
func TestCompose(t *testing.T) {
	for mask := range 1 << numCaps {
		base, parts := &fake{name: "base"}, &fake{name: "parts"}
		caps, want := subset(mask, parts)
		d := device.Compose(base, caps)
		require.Equal(t, want, offered(d), "subset %08b", mask)
		assert.Equal(t, "base", d.Name())

		_, _ = d.Malloc(1)
		_ = d.Free(1)
		_, _, _ = d.MemInfo()
		_ = d.Synchronize()
		_, _ = d.NewStream()
		_ = d.SynchronizeStream(0)
		_, _ = d.RecordEvent(0)
		_, _ = d.EventDone(1)
		_ = d.SynchronizeEvent(1)
		_ = d.ReleaseEvent(1)
		assert.Equal(t, []string{"Malloc", "Free", "MemInfo", "Synchronize", "NewStream", "SynchronizeStream",
			"RecordEvent", "EventDone", "SynchronizeEvent", "ReleaseEvent"}, base.calls)

		var wantParts []string
		if vm, ok := d.(device.VirtualMemory); ok {
			assert.Equal(t, uint64(4096), vm.Granularity())
			_, _ = vm.Reserve(1)
			_ = vm.Map(0, 1)
			_ = vm.Unmap(0, 1)
			_ = vm.Release(0)
			wantParts = append(wantParts, "Granularity", "Reserve", "Map", "Unmap", "Release")
		}
		if h, ok := d.(device.HostMemory); ok {
			_, _ = h.HostAlloc(1)
			_ = h.HostFree(nil)
			wantParts = append(wantParts, "HostAlloc", "HostFree")
		}
		if c, ok := d.(device.StreamChecker); ok {
			assert.True(t, c.HasStream(0))
			wantParts = append(wantParts, "HasStream")
		}
		if u, ok := d.(device.UsageReporter); ok {
			assert.Equal(t, uint64(7), u.BytesInUse())
			wantParts = append(wantParts, "BytesInUse")
		}
		if w, ok := d.(device.StreamWaiter); ok {
			_ = w.WaitEvent(0, 1)
			_ = w.WaitStream(0, 1)
			wantParts = append(wantParts, "WaitEvent", "WaitStream")
		}
		if cp, ok := d.(device.Copier); ok {
			_ = cp.CopyToHost(nil, 0)
			_ = cp.CopyFromHost(0, nil)
			wantParts = append(wantParts, "CopyToHost", "CopyFromHost")
		}
		if so, ok := d.(device.StreamOrderedMemory); ok {
			_, _ = so.MallocAsync(1, 0)
			_ = so.FreeAsync(0, 0)
			_ = so.SetReleaseThreshold(0)
			_ = so.TrimPool(0)
			_, _ = so.PoolUsage()
			_ = so.ResetPoolPeaks()
			wantParts = append(wantParts, "MallocAsync", "FreeAsync", "SetReleaseThreshold", "TrimPool",
				"PoolUsage", "ResetPoolPeaks")
		}
		if pr, ok := d.(device.ProgressReporter); ok {
			var seen []device.Stream
			now, ok := pr.Progressed(3, func(s device.Stream) { seen = append(seen, s) })
			assert.True(t, ok)
			assert.Equal(t, uint64(4), now)
			assert.Equal(t, []device.Stream{3}, seen)
			wantParts = append(wantParts, "Progressed")
		}
		assert.Equal(t, wantParts, parts.calls, "subset %08b", mask)
		assert.Len(t, base.calls, 10, "subset %08b: no capability call reached base", mask)
	}
}

func TestComposeHidesTheBasesCapabilities(t *testing.T) {
	f := &fake{}
	d := device.Compose(f, device.Capabilities{HostMemory: f})
	assert.Equal(t, [numCaps]bool{false, true}, offered(d))
	assert.Nil(t, device.Compose(nil, device.CapabilitiesOf(f)))
	// Composing again starts from the composed device's own offer.
	assert.Equal(t, [numCaps]bool{}, offered(device.Compose(d, device.Capabilities{})))
	assert.Equal(t, [numCaps]bool{false, true}, offered(device.Compose(d, device.CapabilitiesOf(d))))
}

func TestWithCapabilitiesOf(t *testing.T) {
	adaptor := &fake{name: "adaptor"}
	for mask := range 1 << numCaps {
		inner := &fake{name: "inner"}
		caps, want := subset(mask, inner)
		d := device.WithCapabilitiesOf(adaptor, device.Compose(inner, caps))
		require.Equal(t, want, offered(d), "inner subset %08b", mask)
		assert.Equal(t, "adaptor", d.Name())
		if vm, ok := d.(device.VirtualMemory); ok {
			_ = vm.Map(0, 1)
			assert.Empty(t, inner.calls, "capabilities are the adaptor's methods")
		}
	}
	// An adaptor that lacks a capability does not offer it, whatever inner
	// offers.
	p := &plain{}
	assert.Equal(t, [numCaps]bool{}, offered(device.WithCapabilitiesOf(p.Device(), adaptor)))
	assert.Nil(t, device.WithCapabilitiesOf(nil, adaptor))
	assert.Nil(t, device.WithCapabilitiesOf(adaptor, nil))
}

func TestCall(t *testing.T) {
	names := map[string]bool{}
	for c := range device.NumCalls {
		name := c.String()
		require.NotEmpty(t, name)
		require.False(t, names[name], "%q twice", name)
		names[name] = true
		got, err := device.ParseCall(name)
		require.NoError(t, err)
		assert.Equal(t, c, got)
	}
	assert.Len(t, names, 26)
	assert.Equal(t, "malloc", device.CallMalloc.String())
	assert.Equal(t, "query event", device.CallEventDone.String())
	assert.Equal(t, "host free", device.CallHostFree.String())
	assert.Equal(t, "wait event", device.CallWaitEvent.String())
	assert.Equal(t, "wait stream", device.CallWaitStream.String())
	assert.Equal(t, "copy to host", device.CallCopyToHost.String())
	assert.Equal(t, "reset pool peaks", device.CallResetPoolPeaks.String())
	assert.Equal(t, "Call(26)", device.NumCalls.String())
	assert.Equal(t, "Call(255)", device.Call(255).String())
	for _, bad := range []string{"", "Malloc", "mallocs", string(make([]byte, 1<<20))} {
		_, err := device.ParseCall(bad)
		require.ErrorIs(t, err, device.ErrInvalidArgument)
		assert.Less(t, len(err.Error()), 400, "the message quotes a bounded part of the input")
	}
}
