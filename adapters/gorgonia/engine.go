// engine.go: Engine (a tensor.Engine over a caching allocator), Block (the
// tensor.Memory it hands out) and Memops (the device operations a caller
// may lend it).

package gorgonia

import (
	"errors"
	"fmt"
	"math"
	"sync"

	"github.com/gpumem/gpumem/allocator"
	"github.com/gpumem/gpumem/device"
	"gorgonia.org/tensor"
)

// Block is device memory from Engine.Alloc: an address and a size in bytes.
// It implements tensor.Memory.
type Block struct {
	Ptr  device.Ptr
	Size uintptr
}

// Uintptr returns the device address.
func (b Block) Uintptr() uintptr { return uintptr(b.Ptr) }

// MemSize returns the size in bytes.
func (b Block) MemSize() uintptr { return b.Size }

// Memops is the device work an Engine cannot do itself: filling and
// copying device memory, queued on stream s. A runtime implements it with
// its own kernels or driver calls (cuMemsetD8Async, cuMemcpyDtoDAsync).
type Memops interface {
	// Memset fills n bytes at p with the bytes of pattern, repeated.
	Memset(p device.Ptr, n uint64, pattern []byte, s device.Stream) error
	// Memcpy copies n bytes from src to dst.
	Memcpy(dst, src device.Ptr, n uint64, s device.Stream) error
}

// Engine is a tensor.Engine that allocates through a caching allocator on
// one stream. It is safe for concurrent use as far as the allocator and the
// Memops are.
type Engine struct {
	a   *allocator.Allocator
	s   device.Stream
	ops Memops

	mu      sync.Mutex
	lastErr error // the last Memclr failure; guarded by mu
}

// ErrNotAccessible is returned by Accessible: device memory cannot be read
// from Go.
var ErrNotAccessible = errors.New("gpumem/gorgonia: device memory is not accessible from Go")

// New returns an Engine that allocates with a for use on stream s. ops
// may be nil: Memset and Memcpy then fail with device.ErrNotSupported.
func New(a *allocator.Allocator, s device.Stream, ops Memops) (*Engine, error) {
	if a == nil {
		return nil, fmt.Errorf("gpumem/gorgonia: nil allocator: %w", device.ErrInvalidArgument)
	}
	return &Engine{a: a, s: s, ops: ops}, nil
}

// Allocator returns the Engine's allocator.
func (e *Engine) Allocator() *allocator.Allocator { return e.a }

// Stream returns the stream the Engine's memory is ordered on.
func (e *Engine) Stream() device.Stream { return e.s }

// NonStdAlloc marks the Engine as a tensor.NonStdEngine: tensors made on it
// are manually managed.
func (e *Engine) NonStdAlloc() {}

// AllocAccessible reports false: the memory is the device's.
func (e *Engine) AllocAccessible() bool { return false }

// Alloc allocates size bytes on the Engine's stream. A negative size is an
// error; 0 gives a Block at address 0, as the allocator does.
func (e *Engine) Alloc(size int64) (tensor.Memory, error) {
	if size < 0 {
		return nil, fmt.Errorf("gpumem/gorgonia: alloc of %d bytes: %w", size, device.ErrInvalidSize)
	}
	p, err := e.a.Alloc(uint64(size), e.s)
	if err != nil {
		return nil, err
	}
	return Block{Ptr: p, Size: uintptr(size)}, nil
}

// Free returns the memory at mem's address to the allocator. size is the
// caller's and is not used: the allocator knows the block's size. A nil mem
// or one at address 0 does nothing.
func (e *Engine) Free(mem tensor.Memory, size int64) error {
	if mem == nil {
		return nil
	}
	return e.a.Free(device.Ptr(mem.Uintptr()))
}

// Memset fills mem with val, a value of a fixed-size type (its bytes are
// the pattern), through the Engine's Memops.
func (e *Engine) Memset(mem tensor.Memory, val interface{}) error {
	if e.ops == nil {
		return fmt.Errorf("gpumem/gorgonia: memset: no Memops given: %w", device.ErrNotSupported)
	}
	pattern, err := bytesOf(val)
	if err != nil {
		return err
	}
	if uint64(mem.MemSize())%uint64(len(pattern)) != 0 {
		return fmt.Errorf("gpumem/gorgonia: memset: %d bytes is not a whole number of %T: %w", mem.MemSize(), val, device.ErrInvalidArgument)
	}
	return e.ops.Memset(device.Ptr(mem.Uintptr()), uint64(mem.MemSize()), pattern, e.s)
}

// Memclr fills mem with zeros through the Engine's Memops. tensor.Engine
// gives it no error to return: a failure (or no Memops) is kept, and Err
// returns it.
func (e *Engine) Memclr(mem tensor.Memory) {
	var err error
	if e.ops == nil {
		err = fmt.Errorf("gpumem/gorgonia: memclr: no Memops given: %w", device.ErrNotSupported)
	} else {
		err = e.ops.Memset(device.Ptr(mem.Uintptr()), uint64(mem.MemSize()), []byte{0}, e.s)
	}
	if err != nil {
		e.mu.Lock()
		e.lastErr = err
		e.mu.Unlock()
	}
}

// Err returns the last Memclr failure and forgets it.
func (e *Engine) Err() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	err := e.lastErr
	e.lastErr = nil
	return err
}

// Memcpy copies src to dst (the smaller of the two sizes) through the
// Engine's Memops.
func (e *Engine) Memcpy(dst, src tensor.Memory) error {
	if e.ops == nil {
		return fmt.Errorf("gpumem/gorgonia: memcpy: no Memops given: %w", device.ErrNotSupported)
	}
	return e.ops.Memcpy(device.Ptr(dst.Uintptr()), device.Ptr(src.Uintptr()), uint64(min(dst.MemSize(), src.MemSize())), e.s)
}

// Accessible fails with ErrNotAccessible: device memory cannot be read from
// Go.
func (e *Engine) Accessible(mem tensor.Memory) (tensor.Memory, error) {
	return nil, ErrNotAccessible
}

// WorksWith reports true for every data order: the Engine only allocates.
func (e *Engine) WorksWith(order tensor.DataOrder) bool { return true }

// bytesOf returns the bytes of a value of a fixed-size numeric type.
func bytesOf(v interface{}) ([]byte, error) {
	var b []byte
	put := func(x uint64, n int) {
		for i := 0; i < n; i++ {
			b = append(b, byte(x>>(8*i)))
		}
	}
	switch x := v.(type) {
	case int8:
		put(uint64(x), 1)
	case uint8:
		put(uint64(x), 1)
	case bool:
		if x {
			put(1, 1)
		} else {
			put(0, 1)
		}
	case int16:
		put(uint64(x), 2)
	case uint16:
		put(uint64(x), 2)
	case int32:
		put(uint64(x), 4)
	case uint32:
		put(uint64(x), 4)
	case float32:
		put(uint64(math.Float32bits(x)), 4)
	case int64:
		put(uint64(x), 8)
	case uint64:
		put(x, 8)
	case int:
		put(uint64(x), 8)
	case uint:
		put(uint64(x), 8)
	case float64:
		put(math.Float64bits(x), 8)
	default:
		return nil, fmt.Errorf("gpumem/gorgonia: memset with a %T: %w", v, device.ErrInvalidArgument)
	}
	return b, nil
}
