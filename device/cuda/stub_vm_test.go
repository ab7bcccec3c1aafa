//go:build cuda

// stub_vm_test.go: tests of virtual memory, host memory and the model of
// device memory against the stub driver (device/cuda/internal/cudastub);
// they skip unless the stub is the loaded libcuda.

package cuda

import (
	"errors"
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/device/cuda/internal/cudastub"
)

func TestStubVirtualMemory(t *testing.T) {
	d := openStub(t)
	g := d.Granularity()
	for _, size := range []uint64{0, g / 2, g + 512} {
		_, err := d.Reserve(size)
		requireDeviceError(t, err, device.ErrInvalidSize, 0)
	}
	base, err := d.Reserve(10 * g)
	require.NoError(t, err)
	assert.Equal(t, 1, cudastub.Live("reservation"))

	free0, _, err := d.MemInfo()
	require.NoError(t, err)
	require.NoError(t, d.Map(base, 4*g))
	assert.Equal(t, 4, cudastub.Live("mapping"), "one physical allocation per page")
	assert.Equal(t, 4, cudastub.Live("handle"))
	free1, _, err := d.MemInfo()
	require.NoError(t, err)
	assert.Equal(t, free0-4*g, free1)

	bad := []struct {
		p    device.Ptr
		size uint64
	}{
		{base, 4 * g},                   // already mapped
		{base + device.Ptr(3*g), 2 * g}, // overlaps a mapped page
		{base + device.Ptr(9*g), 2 * g}, // runs past the reservation
		{base - device.Ptr(g), g},       // before it
		{base + 512, g},                 // misaligned
		{base + device.Ptr(4*g), 0},     // empty
		{base + device.Ptr(4*g), g + 1}, // not a multiple
		{device.Ptr(math.MaxUint64 - g + 1), g},
	}
	for _, b := range bad {
		requireDeviceError(t, d.Map(b.p, b.size), device.ErrInvalidArgument, 0)
	}
	assert.Equal(t, 4, cudastub.Live("mapping"))

	// Any page-aligned sub-range can be unmapped.
	require.NoError(t, d.Unmap(base+device.Ptr(g), 2*g))
	assert.Equal(t, 2, cudastub.Live("mapping"))
	assert.Equal(t, 2, cudastub.Live("handle"), "unmapped pages' memory is released")
	requireDeviceError(t, d.Unmap(base+device.Ptr(g), g), device.ErrInvalidArgument, 0)
	requireDeviceError(t, d.Unmap(base, 2*g), device.ErrInvalidArgument, 0)
	requireDeviceError(t, d.Release(base), device.ErrInvalidArgument, 0)
	requireDeviceError(t, d.Release(base+device.Ptr(g)), device.ErrInvalidPointer, 0)

	// Remapping a hole works.
	require.NoError(t, d.Map(base+device.Ptr(g), g))
	require.NoError(t, d.Unmap(base, 2*g))
	require.NoError(t, d.Unmap(base+device.Ptr(3*g), g))
	assert.Equal(t, 0, cudastub.Live("mapping"))
	assert.Equal(t, uint64(0), cudastub.Used())
	require.NoError(t, d.Release(base))
	assert.Equal(t, 0, cudastub.Live("reservation"))
	requireDeviceError(t, d.Release(base), device.ErrInvalidPointer, 0)
	requireDeviceError(t, d.Map(base, g), device.ErrInvalidArgument, 0)
}

func TestStubMapRollsBack(t *testing.T) {
	d := openStub(t)
	g := d.Granularity()
	base, err := d.Reserve(8 * g)
	require.NoError(t, err)

	// The third page's map fails: the first two are unmapped and released.
	require.True(t, cudastub.Fail("cuMemMap", 1, 2, 1))
	requireDeviceError(t, d.Map(base, 4*g), device.ErrInvalidArgument, 1)
	assert.Equal(t, 0, cudastub.Live("mapping"))
	assert.Equal(t, 0, cudastub.Live("handle"))
	assert.Equal(t, uint64(0), cudastub.Used())

	// Access fails after all pages are mapped: all are undone.
	cudastub.FailNext("cuMemSetAccess", 801)
	requireDeviceError(t, d.Map(base, 4*g), device.ErrNotSupported, 801)
	assert.Equal(t, 0, cudastub.Live("mapping"))
	assert.Equal(t, 0, cudastub.Live("handle"))

	// Not enough physical memory: nothing mapped.
	cudastub.SetCapacity(3 * g)
	requireDeviceError(t, d.Map(base, 4*g), device.ErrOutOfMemory, 2)
	assert.Equal(t, 0, cudastub.Live("mapping"))
	assert.Equal(t, uint64(0), cudastub.Used())

	// The range is still free to map.
	require.NoError(t, d.Map(base, 3*g))
	assert.Equal(t, 3, cudastub.Live("mapping"))
}

func TestStubNoVirtualMemory(t *testing.T) {
	d := openStub(t, func() { cudastub.SetVirtualMemory(false) })
	assert.False(t, d.VirtualMemorySupported())
	assert.Zero(t, d.Granularity(), "no granularity: the capability is absent")
	_, err := d.Reserve(2 * mib)
	requireDeviceError(t, err, device.ErrNotSupported, 0)
	requireDeviceError(t, d.Map(2*mib, 2*mib), device.ErrNotSupported, 0)
	requireDeviceError(t, d.Unmap(2*mib, 2*mib), device.ErrNotSupported, 0)
	requireDeviceError(t, d.Release(2*mib), device.ErrNotSupported, 0)
	assert.Zero(t, cudastub.Calls("cuMemAddressReserve"))
}

func TestStubHostMemory(t *testing.T) {
	d := openStub(t)
	b, err := d.HostAlloc(4096)
	require.NoError(t, err)
	require.Len(t, b, 4096)
	for i := range b {
		b[i] = byte(i)
	}
	assert.Equal(t, byte(255), b[255])
	assert.Equal(t, 1, cudastub.Live("host"))
	require.NoError(t, d.HostFree(b[:10]), "a reslice from the start frees")
	assert.Equal(t, 0, cudastub.Live("host"))

	requireDeviceError(t, d.HostFree(b), device.ErrInvalidPointer, 0)
	requireDeviceError(t, d.HostFree(nil), device.ErrInvalidPointer, 0)
	requireDeviceError(t, d.HostFree(make([]byte, 10)), device.ErrInvalidPointer, 0)
	_, err = d.HostAlloc(0)
	requireDeviceError(t, err, device.ErrInvalidSize, 0)

	c, err := d.HostAlloc(100)
	require.NoError(t, err)
	requireDeviceError(t, d.HostFree(c[1:]), device.ErrInvalidPointer, 0)
	cudastub.FailNext("cuMemFreeHost", 700)
	requireDeviceError(t, d.HostFree(c), ErrDriver, 700)
	require.NoError(t, d.HostFree(c), "a failed HostFree leaves the memory live")
}

// TestStubMallocFreeModel checks random sequences of Malloc and Free (with
// bad pointers among them) against a model of the live set.
func TestStubMallocFreeModel(t *testing.T) {
	d := openStub(t, func() { cudastub.SetCapacity(256 * mib) })
	rapid.Check(t, func(rt *rapid.T) {
		live := map[device.Ptr]uint64{}
		var used uint64
		defer func() {
			for p := range live {
				_ = d.Free(p)
			}
		}()
		for i, n := 0, rapid.IntRange(1, 60).Draw(rt, "n"); i < n; i++ {
			switch rapid.IntRange(0, 2).Draw(rt, "op") {
			case 0:
				size := rapid.Uint64Range(1, 64*mib).Draw(rt, "size")
				p, err := d.Malloc(size)
				if used+size > 256*mib {
					if !errors.Is(err, device.ErrOutOfMemory) {
						rt.Fatalf("Malloc(%d) with %d used: %v, want out of memory", size, used, err)
					}
					continue
				}
				if err != nil {
					rt.Fatalf("Malloc(%d): %v", size, err)
				}
				if _, dup := live[p]; dup {
					rt.Fatalf("Malloc returned live pointer %v", p)
				}
				live[p] = size
				used += size
			case 1:
				if len(live) == 0 {
					continue
				}
				var p device.Ptr
				k := rapid.IntRange(0, len(live)-1).Draw(rt, "which")
				for q := range live {
					if k == 0 {
						p = q
						break
					}
					k--
				}
				if err := d.Free(p); err != nil {
					rt.Fatalf("Free(%v): %v", p, err)
				}
				used -= live[p]
				delete(live, p)
			case 2:
				p := device.Ptr(rapid.Uint64().Draw(rt, "bad"))
				if _, ok := live[p]; ok {
					continue
				}
				if err := d.Free(p); !errors.Is(err, device.ErrInvalidPointer) {
					rt.Fatalf("Free(%v) of an unknown pointer: %v", p, err)
				}
			}
			if got := cudastub.Live("mem"); got != len(live) {
				rt.Fatalf("stub has %d live allocations, model %d", got, len(live))
			}
			if got := cudastub.Used(); got != used {
				rt.Fatalf("stub uses %d bytes, model %d", got, used)
			}
		}
	})
}
