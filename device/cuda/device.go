//go:build cuda

// device.go: the Device type, Open and Close, per-call context handling,
// and device memory (Malloc, Free, MemInfo, Synchronize).

package cuda

import (
	"errors"
	"fmt"
	"math"
	"runtime"
	"sync"
	"unsafe"

	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/device/cuda/internal/cudadrv"
	"gorgonia.org/cu"
)

// Device is one CUDA device, driven through one context: its primary
// context (Open) or a context the caller made (OpenContext). It implements
// device.Device, device.VirtualMemory, device.HostMemory, device.Copier and
// device.StreamOrderedMemory and is safe for concurrent use. Close it when
// done.
type Device struct {
	ordinal int
	dev     cu.Device
	ctx     cu.CUContext
	primary bool // ctx is the primary context, retained by Open and released by Close
	name    string
	total   uint64
	vmm     bool   // the device supports virtual memory management
	gran    uint64 // VMM granularity in bytes (2 MiB nominal when !vmm, when Granularity reports 0)

	// life is read-held by every call for its whole duration and
	// write-held by Close, so that Close never tears down under a call.
	life   sync.RWMutex
	closed bool // guarded by life

	memMu sync.Mutex
	mem   map[device.Ptr]uint64 // live Malloc results and sizes; guarded by memMu

	streamMu   sync.RWMutex
	streams    map[device.Stream]streamEntry // guarded by streamMu
	adopted    map[uintptr]device.Stream     // adopted driver streams by handle; guarded by streamMu
	nextStream device.Stream                 // guarded by streamMu

	eventMu   sync.RWMutex
	events    map[device.Event]cu.Event // guarded by eventMu
	nextEvent device.Event              // guarded by eventMu

	// waitMu guards waitEvent, the event WaitStream records on the awaited
	// stream and makes the waiting stream wait on. It is not in the event
	// table: the device creates it on the first WaitStream, reuses it for
	// every later one, and Close destroys it (Close holds life for
	// writing, so it touches waitEvent without waitMu). waitMu is held
	// across the record and the wait, so that no other WaitStream
	// re-records the event in between.
	waitMu    sync.Mutex
	waitEvent cu.Event // the zero Event until the first WaitStream; guarded by waitMu

	vmMu         sync.Mutex
	reservations []*reservation // sorted by base; guarded by vmMu

	hostMu sync.Mutex
	hosts  map[unsafe.Pointer]uint64 // pinned host allocations and sizes; guarded by hostMu

	pools   bool    // the device has memory pools (MEMORY_POOLS_SUPPORTED)
	pool    uintptr // its default CUmemoryPool when pools
	asyncMu sync.Mutex
	async   map[device.Ptr]uint64 // live MallocAsync blocks and sizes; guarded by asyncMu
}

// Open opens device ordinal: it retains the device's primary context (the
// one the CUDA runtime and other libraries in the process share) and reads
// the device's name, total memory and virtual memory support.
func Open(ordinal int) (*Device, error) {
	n, err := DeviceCount()
	if err != nil {
		return nil, err
	}
	if ordinal < 0 || ordinal >= n {
		return nil, usageError("open", ordinal, ErrNoDevice, "ordinal %d out of range: the driver sees %d devices", ordinal, n)
	}
	return open(ordinal, nil)
}

// open reads device ordinal's properties and makes its Device, on ctx when
// ctx is not nil (the caller's context, kept and never released), else on
// the primary context, retained here.
func open(ordinal int, ctx *cu.CUContext) (*Device, error) {
	dev, err := cu.GetDevice(ordinal)
	if c := codeOf(err); c != cudadrv.Success {
		return nil, driverError("open", ordinal, c, subjectNone)
	}
	name, err := dev.Name()
	if c := codeOf(err); c != cudadrv.Success {
		return nil, driverError("device name", ordinal, c, subjectNone)
	}
	total, err := dev.TotalMem()
	if c := codeOf(err); c != cudadrv.Success {
		return nil, driverError("device total memory", ordinal, c, subjectNone)
	}
	vmm, c := cudadrv.Attribute(int(dev), cudadrv.AttrVirtualMemorySupported)
	if c != cudadrv.Success {
		return nil, driverError("device attribute", ordinal, c, subjectNone)
	}
	pools, c := cudadrv.Attribute(int(dev), cudadrv.AttrMemoryPoolsSupported)
	if c != cudadrv.Success {
		return nil, driverError("device attribute", ordinal, c, subjectNone)
	}
	var pool uintptr
	if pools != 0 {
		if pool, c = cudadrv.DefaultMemPool(int(dev)); c != cudadrv.Success {
			return nil, driverError("default memory pool", ordinal, c, subjectNone)
		}
	}
	gran := uint64(2 << 20)
	if vmm != 0 {
		g, c := cudadrv.Granularity(int(dev), false)
		if c != cudadrv.Success {
			return nil, driverError("allocation granularity", ordinal, c, subjectNone)
		}
		if g != 0 {
			gran = g
		}
	}
	primary := ctx == nil
	if primary {
		pc, err := dev.RetainPrimaryCtx()
		if c := codeOf(err); c != cudadrv.Success {
			return nil, driverError("retain primary context", ordinal, c, subjectNone)
		}
		ctx = &pc
	}
	return &Device{
		ordinal: ordinal,
		dev:     dev,
		ctx:     *ctx,
		primary: primary,
		name:    name,
		total:   uint64(total),
		vmm:     vmm != 0,
		gran:    gran,
		mem:     make(map[device.Ptr]uint64),
		streams: make(map[device.Stream]streamEntry),
		adopted: make(map[uintptr]device.Stream),
		events:  make(map[device.Event]cu.Event),
		hosts:   make(map[unsafe.Pointer]uint64),
		pools:   pools != 0,
		pool:    pool,
		async:   make(map[device.Ptr]uint64),
	}, nil
}

// call runs f on a locked OS thread with the device's context pushed as
// current, pops it afterwards, and returns f's CUresult (or the
// push's, if that failed). The driver keeps the current context per OS
// thread and goroutines move between threads, so every driver call that
// needs a context goes through call; pushing and popping leaves whatever
// context the thread had before (for other code in the process) in place.
func (d *Device) call(f func() int) int {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if c := codeOf(cu.PushCurrentCtx(d.ctx)); c != cudadrv.Success {
		return c
	}
	c := f()
	if _, err := cu.PopCurrentCtx(); c == cudadrv.Success {
		c = codeOf(err)
	}
	return c
}

// enter read-locks d.life for a call of operation op and fails if the
// device is closed. On success the caller must d.life.RUnlock.
func (d *Device) enter(op string) error {
	d.life.RLock()
	if d.closed {
		d.life.RUnlock()
		return usageError(op, d.ordinal, ErrClosed, "the device was closed")
	}
	return nil
}

// Ordinal returns the device's index among the driver's devices.
func (d *Device) Ordinal() int { return d.ordinal }

// Name returns the driver's name for the device.
func (d *Device) Name() string { return d.name }

// TotalMemory returns the device's memory size in bytes (cuDeviceTotalMem).
func (d *Device) TotalMemory() uint64 { return d.total }

// Malloc allocates size bytes of device memory with cuMemAlloc.
func (d *Device) Malloc(size uint64) (device.Ptr, error) {
	if size == 0 || size > math.MaxInt64 {
		return 0, usageError("malloc", d.ordinal, device.ErrInvalidSize, "size %d", size)
	}
	if err := d.enter("malloc"); err != nil {
		return 0, err
	}
	defer d.life.RUnlock()
	var p cu.DevicePtr
	c := d.call(func() int {
		var err error
		p, err = cu.MemAlloc(int64(size))
		return codeOf(err)
	})
	if c != cudadrv.Success {
		return 0, driverError("malloc", d.ordinal, c, subjectSize)
	}
	d.memMu.Lock()
	d.mem[device.Ptr(p)] = size
	d.memMu.Unlock()
	return device.Ptr(p), nil
}

// Free releases memory from Malloc with cuMemFree. Addresses Malloc did not
// return, or already freed, fail with device.ErrInvalidPointer before the
// driver is called.
func (d *Device) Free(p device.Ptr) error {
	if err := d.enter("free"); err != nil {
		return err
	}
	defer d.life.RUnlock()
	// Forget p before the driver frees it: once freed, the driver may hand
	// the same address to a concurrent Malloc, which records it again.
	d.memMu.Lock()
	size, ok := d.mem[p]
	delete(d.mem, p)
	d.memMu.Unlock()
	if !ok {
		return usageError("free", d.ordinal, device.ErrInvalidPointer, "%v was not returned by Malloc or was already freed", p)
	}
	c := d.call(func() int { return codeOf(cu.MemFree(cu.DevicePtr(p))) })
	if c != cudadrv.Success {
		d.memMu.Lock()
		d.mem[p] = size
		d.memMu.Unlock()
		return driverError("free", d.ordinal, c, subjectPointer)
	}
	return nil
}

// MemInfo returns the device's free and total memory (cuMemGetInfo).
func (d *Device) MemInfo() (free, total uint64, err error) {
	if err := d.enter("memory info"); err != nil {
		return 0, 0, err
	}
	defer d.life.RUnlock()
	var f, t int64
	c := d.call(func() int {
		var err error
		f, t, err = cu.MemInfo()
		return codeOf(err)
	})
	if c != cudadrv.Success {
		return 0, 0, driverError("memory info", d.ordinal, c, subjectNone)
	}
	return uint64(f), uint64(t), nil
}

// Synchronize waits for all work of the context (cuCtxSynchronize).
func (d *Device) Synchronize() error {
	if err := d.enter("synchronize"); err != nil {
		return err
	}
	defer d.life.RUnlock()
	if c := d.call(func() int { return codeOf(cu.Synchronize()) }); c != cudadrv.Success {
		return driverError("synchronize", d.ordinal, c, subjectNone)
	}
	return nil
}

// Close releases everything this Device still holds: its events (those of
// RecordEvent and the one WaitStream keeps, if it made one), the streams it
// created (adopted streams are only forgotten), mapped pages and
// reservations, pinned host memory, device memory from Malloc, and finally
// its reference to the primary context (a caller's context of OpenContext
// stays the caller's). Pointers and handles it gave out become invalid.
// Calls after Close fail with ErrClosed; a second Close does nothing.
// Errors from the driver are joined, and the teardown goes on past them.
func (d *Device) Close() error {
	d.life.Lock()
	defer d.life.Unlock()
	if d.closed {
		return nil
	}
	d.closed = true
	var errs []error
	note := func(op string, c int, s subject) {
		if c != cudadrv.Success {
			errs = append(errs, driverError(op, d.ordinal, c, s))
		}
	}
	d.call(func() int {
		for h, ev := range d.events {
			note("release event", codeOf(cu.DestroyEvent(&ev)), subjectEvent)
			delete(d.events, h)
		}
		// WaitStream's event exists only if WaitStream ever created it;
		// DestroyEvent sets it back to the zero Event.
		if d.waitEvent != (cu.Event{}) {
			note("release event", codeOf(cu.DestroyEvent(&d.waitEvent)), subjectEvent)
		}
		for h, e := range d.streams {
			if !e.adopted {
				note("destroy stream", codeOf(e.cs.Destroy()), subjectStream)
			}
			delete(d.streams, h)
		}
		clear(d.adopted)
		for _, r := range d.reservations {
			for i := range r.pages {
				if r.mapped[i] {
					addr := uint64(r.base) + uint64(i)*d.gran
					note("unmap", cudadrv.Unmap(addr, d.gran), subjectRange)
					note("unmap", cudadrv.Release(r.pages[i]), subjectRange)
					r.mapped[i] = false
				}
			}
			note("release reservation", cudadrv.AddressFree(uint64(r.base), r.size), subjectRange)
		}
		d.reservations = nil
		for p := range d.hosts {
			note("host free", cudadrv.HostFree(p), subjectPointer)
			delete(d.hosts, p)
		}
		for p := range d.mem {
			note("free", codeOf(cu.MemFree(cu.DevicePtr(p))), subjectPointer)
			delete(d.mem, p)
		}
		for p := range d.async {
			note("free async", cudadrv.FreeAsync(uint64(p), 0), subjectPointer)
			delete(d.async, p)
		}
		return cudadrv.Success
	})
	if d.primary {
		note("release primary context", codeOf(d.dev.ReleasePrimaryCtx()), subjectNone)
	}
	return errors.Join(errs...)
}

// String describes the device for logs.
func (d *Device) String() string {
	return fmt.Sprintf("cuda:%d (%s, %d MiB)", d.ordinal, d.name, d.total>>20)
}
