// config.go: the host allocator's configuration (PyTorch's pinned_* keys
// and gpumem's own rounding) and the size classes it implies.

package host

import (
	"errors"
	"fmt"
	"math/bits"

	"github.com/gpumem/gpumem/allocator"
)

// Config configures a host allocator. The zero Config is PyTorch's host
// allocator with its default settings.
//
// Pinned carries PyTorch's pinned_* keys as allocator.ParseConf reads
// them, so that one configuration string sets both allocators:
//
//	conf, _ := allocator.ParseConf("pinned_use_background_threads:True")
//	pinned, _ := host.New(dev, host.Config{Pinned: conf.Pinned})
//
// What each key does here:
//
//   - UseHostRegister (pinned_use_cuda_host_register): PyTorch allocates
//     with malloc, touches every 4 KiB page (on NumRegisterThreads threads)
//     and then registers the range with cudaHostRegister. Here the pages
//     of every new host allocation are touched the same way before the
//     block is handed out; the memory itself still comes from
//     device.HostMemory.HostAlloc (cuMemHostAlloc on CUDA), because the
//     device capability has no register call. Counts are as PyTorch's: one
//     host allocation per new block, one host free per released block.
//   - NumRegisterThreads (pinned_num_register_threads): the goroutines that
//     touch the pages of one allocation, when UseHostRegister is set and
//     the allocation has at least 4 KiB per goroutine (PyTorch's rule);
//     otherwise no effect, as in PyTorch.
//   - ReserveSegmentSize (pinned_reserve_segment_size_mb): at the first
//     request the cache cannot serve, one host allocation of this size is
//     made; blocks are then carved from it (each block's size rounded up
//     to 4 KiB) while it has room, and only then from new host
//     allocations. Carved blocks are cached like others but never returned
//     to the host one by one: EmptyCache keeps them (PyTorch forgets them,
//     which loses that part of the segment for good); Close returns the
//     whole segment once none of its blocks is in use. Must be a multiple
//     of 4 KiB.
//   - UseBackgroundThreads (pinned_use_background_threads): the events of
//     freed blocks are checked by a goroutine every 100 µs instead of at
//     the start of every Alloc; Alloc checks them itself only when the
//     cache misses. The goroutine starts at the first miss and stops on
//     Close.
//   - FreeCatchAll (pinned_free_catch_all): a device error while freeing
//     (no event could be recorded and the streams could not be
//     synchronized) is not returned by Free but counted in
//     Stats.FreeErrorsCaught; the block stays out of the cache, as in
//     PyTorch, since its stream work may still be running. A caller's
//     mistake (double free, foreign memory) is still an error: in Go an
//     error cannot end the process, which is what PyTorch guards against.
type Config struct {
	// Pinned holds PyTorch's pinned_* keys.
	Pinned allocator.PinnedConfig

	// Rounding is how a request is rounded to a block size: the zero
	// value, RoundPowerOfTwo, is PyTorch's. gpumem's own; not a
	// configuration-string key, set it here.
	Rounding Rounding
}

// Rounding is how the host allocator rounds a request to a block size.
type Rounding uint8

const (
	// RoundPowerOfTwo rounds every request up to a power of two, as
	// PyTorch does: a block may be nearly twice its request (a 65 MiB
	// buffer holds 128 MiB of pinned memory; pytorch#150517).
	RoundPowerOfTwo Rounding = iota

	// RoundEighths, gpumem's own, rounds requests up to 1 MiB as PyTorch,
	// and larger ones up to one of eight steps per power of two (from
	// 2^k: 2^k + j·2^k/8), so that a new block is at most 1/8 larger than
	// its request. A request is served by a free block of its own step or,
	// when there is none, by a free block of the smallest of the next seven
	// steps that has one, if less than twice the request (PyTorch's bound),
	// so that buffers of varied sizes still reuse each other's blocks.
	RoundEighths
)

// String returns the rounding's Go name.
func (r Rounding) String() string {
	switch r {
	case RoundPowerOfTwo:
		return "RoundPowerOfTwo"
	case RoundEighths:
		return "RoundEighths"
	}
	return fmt.Sprintf("Rounding(%d)", uint8(r))
}

const (
	pageSize        = 4 << 10 // PyTorch's page for touching and carving
	maxRegister     = 128     // PyTorch's pinned_max_register_threads
	maxReserve      = 1 << 60 // 1 EiB, as allocator.Config allows
	maxRequest      = 1 << 62 // largest request
	steps           = 8       // size classes per power of two
	eighthsFrom     = 1 << 20 // RoundEighths rounds above this as PyTorch below
	numClasses      = 64 * steps
	nextClassesUsed = steps - 1 // RoundEighths reuses up to this many steps up
)

// validate checks c and returns every problem at once.
func (c *Config) validate() error {
	var errs []error
	if n := c.Pinned.NumRegisterThreads; n != 0 && (n&(n-1) != 0 || n > maxRegister) {
		errs = append(errs, fmt.Errorf("Pinned.NumRegisterThreads %d must be a power of two up to %d", n, maxRegister))
	}
	if r := c.Pinned.ReserveSegmentSize; r > maxReserve {
		errs = append(errs, fmt.Errorf("Pinned.ReserveSegmentSize %d is more than 1 EiB", r))
	} else if r%pageSize != 0 {
		errs = append(errs, fmt.Errorf("Pinned.ReserveSegmentSize %d is not a multiple of 4 KiB", r))
	}
	if c.Rounding > RoundEighths {
		errs = append(errs, fmt.Errorf("Rounding %d is not RoundPowerOfTwo or RoundEighths", uint8(c.Rounding)))
	}
	if len(errs) > 0 {
		return fmt.Errorf("host: invalid config: %w", errors.Join(errs...))
	}
	return nil
}

// registerThreads returns the goroutines that touch the pages of a new
// allocation of n bytes: 0 when pages are not touched.
func (c *Config) registerThreads(n uint64) int {
	if !c.Pinned.UseHostRegister {
		return 0
	}
	t := max(c.Pinned.NumRegisterThreads, 1)
	if t > 1 && n < pageSize*t {
		t = 1
	}
	return int(t)
}

// class returns the block size for a request of size bytes (1 to
// maxRequest) and the index of its free list, which grows with the size.
func (c *Config) class(size uint64) (n uint64, idx int) {
	e := bits.Len64(size - 1) // size <= 1<<e
	if c.Rounding == RoundPowerOfTwo || size <= eighthsFrom {
		return 1 << e, e * steps
	}
	e-- // 1<<e < size <= 1<<(e+1)
	step := uint64(1) << e / steps
	n = (size + step - 1) / step * step
	j := int((n - 1<<e) / step) // 1..8
	if j == steps {
		return n, (e + 1) * steps
	}
	return n, e*steps + j
}

// classSize returns the block size of class i.
func classSize(i int) uint64 {
	base := uint64(1) << (i / steps)
	return base + uint64(i%steps)*(base/steps)
}
