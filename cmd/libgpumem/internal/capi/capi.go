// Package capi is the Go side of libgpumem, the C library: the per-device
// caching allocators and the calls that C callers make through them, with
// C's types left at the boundary (sizes as int64, pointers and streams as
// uintptr). The cgo exports in package main only convert arguments, recover
// panics and keep the last error; everything they do is here, so it is
// tested in Go on the simulated device, without cgo or a GPU.
//
// # Model
//
// A Lib holds one caching allocator per device ordinal, made on the
// ordinal's first use from a Device that Open returns, with the Config
// given to New (the library reads it from the environment at load: see
// ConfFromEnv); with backend:cudaMallocAsync in the Config, the allocator
// is the device's stream-ordered pool (allocator.Async) instead. Streams arrive as raw driver handles (cudaStream_t) and are
// adopted on first sight (AdoptStreamHandle), so the allocator orders each
// block on the stream the caller launches on; 0 is the legacy default
// stream. Adopted streams are never released: a C caller never says when
// it is done with one.
//
// Free takes the stream too, as PyTorch's CUDAPluggableAllocator passes
// it. When it differs from the stream the block was allocated on, the
// block is recorded on it first (as recordStream would), so it is reused
// only after the work queued there by now has finished. For that a Lib
// remembers the allocation stream of every live block.
//
// # Concurrency
//
// No panic leaves a method: it is recovered and returned as an error
// wrapping ErrPanic.
//
// Every method is safe for concurrent use. The device table and a
// device's stream table are read without a lock (they are published
// whole, copied on change); the live table has a lock, held briefly around
// one table operation.
package capi

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"

	"github.com/gpumem/gpumem/allocator"
	"github.com/gpumem/gpumem/device"
	memstats "github.com/gpumem/gpumem/stats"
)

// MaxDevices is the number of device ordinals a Lib serves (0 to
// MaxDevices-1).
const MaxDevices = 64

// Device is what a Lib needs of a backend: a device.Device that adopts
// driver streams by handle (the CUDA backend's *cuda.Device, or the
// simulator's *sim.Device, whose handles are names).
type Device interface {
	device.Device
	AdoptStreamHandle(h uintptr) (device.Stream, error)
}

// Opener opens the device of an ordinal, on the first use of the ordinal.
type Opener func(ordinal int) (Device, error)

// Lib is the library's state: the allocators of the devices used so far.
type Lib struct {
	open Opener
	conf allocator.Config
	// confErr is why the configuration could not be read; every call that
	// would make an allocator fails with it.
	confErr error

	mu   sync.Mutex // guards making a device's state
	devs [MaxDevices]atomic.Pointer[dev]
}

// backend is what a Lib calls of a device's allocator: the caching
// allocator (*allocator.Allocator) or, with backend:cudaMallocAsync, the
// stream-ordered pool (*allocator.Async).
type backend interface {
	Alloc(size uint64, s device.Stream) (device.Ptr, error)
	Free(p device.Ptr) error
	RecordStream(p device.Ptr, s device.Stream) error
	EmptyCache() error
	Stats() memstats.DeviceStats
	Summary(abbreviated bool) string
}

// dev is one device's state.
type dev struct {
	d Device
	a backend

	// streams holds the adopted streams by handle. The map is never
	// changed once published: adoption (under streamMu) publishes a copy
	// with the new stream, so the lookup of every call takes no lock.
	streamMu sync.Mutex
	streams  atomic.Pointer[map[uintptr]device.Stream]

	liveMu sync.Mutex
	live   *liveTable // allocation stream of each live block; guarded by liveMu
}

// New returns a Lib that opens devices with open and makes their
// allocators with conf, or, when confErr is not nil, fails every call that
// needs an allocator with it (the library's configuration was bad).
func New(open Opener, conf allocator.Config, confErr error) *Lib {
	return &Lib{open: open, conf: conf, confErr: confErr}
}

// ConfFromEnv reads the allocator configuration as every gpumem program
// does (allocator.ConfigFromEnv): from the first of GPUMEM_ALLOC_CONF,
// PYTORCH_ALLOC_CONF and PYTORCH_CUDA_ALLOC_CONF that is set and not blank,
// in PyTorch's syntax; none set gives the zero Config. An error names the
// variable.
func ConfFromEnv() (allocator.Config, error) {
	return allocator.ConfigFromEnv()
}

// device returns the state of ordinal, making it on first use.
func (l *Lib) device(ordinal int) (*dev, error) {
	if ordinal < 0 || ordinal >= MaxDevices {
		return nil, fmt.Errorf("device %d: ordinal out of range 0..%d: %w", ordinal, MaxDevices-1, device.ErrInvalidArgument)
	}
	if d := l.devs[ordinal].Load(); d != nil {
		return d, nil
	}
	if l.confErr != nil {
		return nil, fmt.Errorf("allocator configuration: %w", l.confErr)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if d := l.devs[ordinal].Load(); d != nil {
		return d, nil
	}
	dv, err := l.open(ordinal)
	if err != nil {
		return nil, err
	}
	var a backend
	if l.conf.Backend == allocator.BackendCudaMallocAsync {
		a, err = allocator.NewAsync(dv, l.conf)
	} else {
		a, err = allocator.New(dv, l.conf)
	}
	if err != nil {
		return nil, err
	}
	d := &dev{d: dv, a: a, live: newLiveTable()}
	d.streams.Store(&map[uintptr]device.Stream{})
	l.devs[ordinal].Store(d)
	return d, nil
}

// stream returns the device.Stream of the raw handle h, adopting it on
// first sight.
func (d *dev) stream(h uintptr) (device.Stream, error) {
	if h == 0 {
		return device.DefaultStream, nil
	}
	if s, ok := (*d.streams.Load())[h]; ok {
		return s, nil
	}
	d.streamMu.Lock()
	defer d.streamMu.Unlock()
	old := *d.streams.Load()
	if s, ok := old[h]; ok { // adopted by a concurrent call meanwhile
		return s, nil
	}
	s, err := d.d.AdoptStreamHandle(h)
	if err != nil {
		return 0, err
	}
	m := make(map[uintptr]device.Stream, len(old)+1)
	for k, v := range old {
		m[k] = v
	}
	m[h] = s
	d.streams.Store(&m)
	return s, nil
}

// Malloc allocates size bytes on device ordinal for use on stream h.
// Size 0 gives 0 and no error (no memory, as PyTorch's allocator); a
// negative size is an error.
func (l *Lib) Malloc(size int64, ordinal int, h uintptr) (_ uintptr, err error) {
	defer catch(&err)
	if size < 0 {
		return 0, fmt.Errorf("malloc of %d bytes: %w", size, device.ErrInvalidSize)
	}
	d, s, err := l.deviceStream(ordinal, h)
	if err != nil {
		return 0, err
	}
	p, err := d.a.Alloc(uint64(size), s)
	if err != nil || p == 0 {
		return 0, err
	}
	d.liveMu.Lock()
	d.live.put(p, s)
	d.liveMu.Unlock()
	return uintptr(p), nil
}

// Free returns the block at p, of size bytes, to device ordinal's cache.
// h is the stream the caller frees it on: when it is not the allocation's
// stream, the block is recorded on h first. size is the caller's and is
// not used: the allocator knows the block's size. Freeing 0 does nothing;
// an address this device's allocator did not give, or gave and took back,
// fails with device.ErrInvalidPointer and changes nothing.
func (l *Lib) Free(p uintptr, size int64, ordinal int, h uintptr) (err error) {
	defer catch(&err)
	if p == 0 {
		return nil
	}
	d, s, err := l.deviceStream(ordinal, h)
	if err != nil {
		return err
	}
	ptr := device.Ptr(p)
	d.liveMu.Lock()
	from, ok := d.live.take(ptr)
	d.liveMu.Unlock()
	if ok && from != s {
		if err := d.a.RecordStream(ptr, s); err != nil {
			d.relive(ptr, from)
			return err
		}
	}
	if err := d.a.Free(ptr); err != nil {
		if ok {
			d.relive(ptr, from)
		}
		return err
	}
	return nil
}

// relive puts back the live entry of a block whose free failed.
func (d *dev) relive(p device.Ptr, s device.Stream) {
	d.liveMu.Lock()
	d.live.put(p, s)
	d.liveMu.Unlock()
}

// RecordStream marks the block at p as used on stream h too (PyTorch's
// recordStream).
func (l *Lib) RecordStream(p uintptr, ordinal int, h uintptr) (err error) {
	defer catch(&err)
	d, s, err := l.deviceStream(ordinal, h)
	if err != nil {
		return err
	}
	return d.a.RecordStream(device.Ptr(p), s)
}

// deviceStream returns the state of device ordinal and the stream of
// driver handle h on it, adopted on first sight.
func (l *Lib) deviceStream(ordinal int, h uintptr) (*dev, device.Stream, error) {
	d, err := l.device(ordinal)
	if err != nil {
		return nil, 0, err
	}
	s, err := d.stream(h)
	if err != nil {
		return nil, 0, err
	}
	return d, s, nil
}

// EmptyCache releases the unused cached memory of device ordinal.
func (l *Lib) EmptyCache(ordinal int) (err error) {
	defer catch(&err)
	d, err := l.device(ordinal)
	if err != nil {
		return err
	}
	return d.a.EmptyCache()
}

// StatsJSON returns the statistics of device ordinal as one JSON object
// with PyTorch's memory_stats names ("allocated_bytes.all.current", ...),
// keys sorted.
func (l *Lib) StatsJSON(ordinal int) (_ []byte, err error) {
	defer catch(&err)
	d, err := l.device(ordinal)
	if err != nil {
		return nil, err
	}
	st := d.a.Stats()
	return json.Marshal(st.Map()) // a map's keys are written sorted
}

// Summary returns PyTorch's memory_summary table of device ordinal.
func (l *Lib) Summary(ordinal int, abbreviated bool) (_ string, err error) {
	defer catch(&err)
	d, err := l.device(ordinal)
	if err != nil {
		return "", err
	}
	return d.a.Summary(abbreviated), nil
}

// MarkStep marks a step boundary named name on device ordinal (the start
// of a training step or of a request), as allocator.Allocator.MarkStep
// does: the steps that gpumem_policy:planned compares and plans, and the
// step counts that find leaks. The stream-ordered pool
// (backend:cudaMallocAsync) has no steps: there it does nothing.
func (l *Lib) MarkStep(ordinal int, name string) (err error) {
	defer catch(&err)
	d, err := l.device(ordinal)
	if err != nil {
		return err
	}
	if s, ok := d.a.(interface{ MarkStep(name string) }); ok {
		s.MarkStep(name)
	}
	return nil
}

// PlanStatsJSON returns the planned policy's figures of device ordinal
// (allocator.PlanStats) as one JSON object, or the JSON null under any
// other policy or backend, which has none.
func (l *Lib) PlanStatsJSON(ordinal int) (_ []byte, err error) {
	defer catch(&err)
	d, err := l.device(ordinal)
	if err != nil {
		return nil, err
	}
	if p, ok := d.a.(interface {
		PlanStats() (allocator.PlanStats, bool)
	}); ok {
		if st, ok := p.PlanStats(); ok {
			return json.Marshal(st)
		}
	}
	return []byte("null"), nil
}

// CopyOut copies src into buf as snprintf does: at most len(buf) bytes,
// NUL included (nothing when buf is empty), the copy cut short when buf is
// too small; it returns len(src), the length the whole text needs without
// its NUL.
func CopyOut(buf []byte, src []byte) uint64 {
	if len(buf) > 0 {
		n := copy(buf[:len(buf)-1], src)
		buf[n] = 0
	}
	return uint64(len(src))
}

// ErrPanic marks an error made from a recovered panic.
var ErrPanic = errors.New("internal error (recovered panic)")

// Recovered turns a recovered panic value into an error.
func Recovered(r any) error {
	return fmt.Errorf("%w: %v", ErrPanic, r)
}

// catch, deferred by every call of a Lib, turns a panic into the call's
// error, so that none reaches the C caller. A panic inside the allocator
// with its lock held would leave the lock held; the allocator does not
// panic on caller input, so this guards against bugs only.
func catch(err *error) {
	if r := recover(); r != nil {
		*err = Recovered(r)
	}
}

// CapBuffer bounds a C buffer capacity to what a Go slice may hold.
func CapBuffer(n uint64) int {
	if n > math.MaxInt32 {
		return math.MaxInt32
	}
	return int(n)
}
