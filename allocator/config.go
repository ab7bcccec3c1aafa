// This file holds the allocator's configuration, its rendering in PyTorch's
// PYTORCH_ALLOC_CONF syntax (conf_parse.go reads it) and the environment
// variables it is read from.

package allocator

import (
	"errors"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"

	"github.com/gpumem/gpumem/internal/quote"
)

// EnvVar is gpumem's own environment variable for the configuration, in
// PyTorch's PYTORCH_ALLOC_CONF syntax. It wins over PyTorch's variables
// (see LookupConfEnv).
const EnvVar = "GPUMEM_ALLOC_CONF"

// confEnvVars are the variables LookupConfEnv reads, in order: gpumem's
// own, then current PyTorch's name, then its older CUDA-only name.
var confEnvVars = [...]string{EnvVar, "PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF"}

// ConfEnvVars returns the environment variables that hold a
// configuration, in the order LookupConfEnv reads them: GPUMEM_ALLOC_CONF,
// PYTORCH_ALLOC_CONF, PYTORCH_CUDA_ALLOC_CONF. The slice is the caller's.
func ConfEnvVars() []string { return append([]string(nil), confEnvVars[:]...) }

// NumRoundupIntervals is the number of power-of-two size intervals that
// RoundupPower2Divisions configures: entry 0 covers sizes below 2 MiB, entry
// k (1..14) covers [2^(20+k), 2^(21+k)) bytes, entry 15 everything from 32 GiB
// up (PyTorch's kRoundUpPowerOfTwoIntervals).
const NumRoundupIntervals = 16

// Config holds every knob of the allocator. The zero Config is PyTorch 2.6's
// default configuration: the allocator then makes the same decisions as
// PyTorch's caching allocator.
type Config struct {
	// MaxSplitSize, when non-zero, makes blocks of at least this many bytes
	// "oversize": they are never split, requests below MaxSplitSize never
	// take them, and a request of at least MaxSplitSize takes a cached one
	// only if it wastes less than MaxNonSplitRounding. It also lets the
	// out-of-memory path release cached oversize blocks before flushing the
	// whole cache. It must be at least the large segment size (20 MiB
	// unless LargeSegmentSize says otherwise; PyTorch 2.6 wanted more than
	// 20 MiB). PyTorch: max_split_size_mb. Zero means unlimited.
	//
	// With expandable segments the pool's free pages merge into ranges
	// that reach MaxSplitSize, which then serve no smaller request: PyTorch
	// 2.6 maps more memory while they stay free, and so does the faithful
	// policy. The low_fragmentation and planned policies let such a range
	// serve any request (it is split like any other); there MaxSplitSize
	// only counts oversize blocks in the stats and lets the out-of-memory
	// path release them first.
	MaxSplitSize uint64

	// MaxNonSplitRounding is how much larger than the request a cached
	// oversize block may be and still be handed out whole; at least the
	// large segment size. Zero means the default, the large segment size
	// (20 MiB unless LargeSegmentSize says otherwise).
	// PyTorch: max_non_split_rounding_mb.
	MaxNonSplitRounding uint64

	// LargeSegmentSize is the size of the segment that a large-pool
	// request below 10 MiB gets from the device (it shares the rest with
	// later such requests), and with expandable segments the page size of
	// the large pool. It also sets the default of MaxNonSplitRounding and
	// the lower bound of both MaxSplitSize and MaxNonSplitRounding, as in
	// current PyTorch. It must be more than 10 MiB and a multiple of 512
	// bytes; with ExpandableSegments, a multiple of the device's mapping
	// granularity. Zero means PyTorch 2.6's 20 MiB.
	// PyTorch: large_segment_size_mb (after 2.6).
	LargeSegmentSize uint64

	// RoundupPower2Divisions rounds request sizes up to the next 1/d step of
	// their power-of-two interval, per interval (see NumRoundupIntervals);
	// 0 or 1 in an entry means plain 512-byte rounding. PyTorch:
	// roundup_power2_divisions.
	RoundupPower2Divisions [NumRoundupIntervals]uint64

	// GarbageCollectionThreshold, in (0, 1), makes the allocator release
	// the least recently reused cached blocks when reserved memory passes
	// this fraction of the allowed memory. As in PyTorch 2.6 it acts only
	// when a limit is set (MemoryFraction, or gpumem's own MemoryLimit):
	// without one it is silently inactive. PyTorch:
	// garbage_collection_threshold.
	GarbageCollectionThreshold float64

	// MemoryFraction, in (0, 1], caps the bytes this allocator reserves at
	// this fraction of the device's total memory, exactly as
	// SetMemoryFraction does. Zero means no cap. As in PyTorch, 1 is a cap
	// too (at the device's memory, which the device enforces anyway): it
	// turns GarbageCollectionThreshold on. PyTorch:
	// set_per_process_memory_fraction, and per_process_memory_fraction in
	// the configuration text. The text accepts 0 as PyTorch does, where
	// it means no cap (the zero Config's meaning), not a cap of 0 bytes.
	MemoryFraction float64

	// MemoryLimit caps the bytes this allocator reserves (gpumem's own
	// addition); combined with MemoryFraction the lower cap wins. Zero means
	// no cap.
	MemoryLimit uint64

	// ExpandableSegments makes the allocator reserve one address range per
	// stream and pool and back it with memory page by page (2 MiB pages for
	// the small pool, 20 MiB for the large one) instead of allocating
	// separate segments, so that freed memory merges across what would
	// have been segment boundaries. The device must have the VirtualMemory
	// capability. PyTorch: expandable_segments. (PolicyLowFragmentation
	// and PolicyPlanned page their pools so wherever the device can.)
	ExpandableSegments bool

	// ExpandableSegmentsReserve sizes the address range reserved for each
	// expandable segment, instead of 9/8 of the device's memory: at most
	// that much, rounded up to whole pages. A request larger than the
	// range cannot be served by an expandable segment and ends out of
	// memory, as in PyTorch. The zero Reserve keeps 9/8. It acts only with
	// expandable segments (ExpandableSegments, or the low_fragmentation
	// policy's). PyTorch: expandable_segments_reserve (after 2.6).
	ExpandableSegmentsReserve Reserve

	// ExpandableSegmentsReserveByClass is PyTorch's per-class reserves
	// (expandable_segments_reserve_by_class, after 2.6), kept in canonical
	// form: NAME:RESERVE pairs sorted by name, joined by commas, for
	// example "decode:0.25,prefill:40G". Accepted, no effect here: PyTorch
	// applies a class to the streams a program tags with it, and gpumem
	// has no such tagging; every stream is untagged and takes
	// ExpandableSegmentsReserve.
	ExpandableSegmentsReserveByClass string

	// EarlyOOM refuses a cache miss with an *OutOfMemoryError before the
	// device is asked, and without releasing cached memory and retrying,
	// when the new segment would take reserved bytes past the cap
	// (MemoryFraction or MemoryLimit) or, with no cap, past the device's
	// total memory. PyTorch: throw_on_cudamalloc_oom (after 2.6), whose
	// cap is per_process_memory_fraction (1 by default).
	EarlyOOM bool

	// ReleaseLockOnMalloc is PyTorch's release_lock_on_cudamalloc (or
	// release_lock_on_hipmalloc). Accepted, no effect here: gpumem holds
	// its lock across device calls, and the key changes only how long
	// other threads wait, not any decision.
	ReleaseLockOnMalloc bool

	// GraphCaptureRecordStreamReuse is PyTorch's
	// graph_capture_record_stream_reuse (after 2.6). Accepted, no effect
	// here: it changes when blocks recorded on other streams during a CUDA
	// graph capture may be reused, and gpumem's allocator has no graph
	// capture.
	GraphCaptureRecordStreamReuse bool

	// Pinned holds the keys of PyTorch's pinned host allocator, accepted
	// with PyTorch's rules so that a PyTorch setting carries over. No
	// effect on this (device) allocator, which has no pinned memory; the
	// host allocator reads them: host.New(dev, host.Config{Pinned:
	// conf.Pinned}) (allocator/host says what each does there).
	Pinned PinnedConfig

	// Policy selects how the allocator decides: PolicyFaithful (the zero
	// value) makes PyTorch 2.6's decisions, PolicyLowFragmentation wastes
	// less, PolicyPlanned also serves repeated steps from a plan (see
	// policy.go and policy_plan.go). gpumem's own: gpumem_policy. The
	// two policies of gpumem's own page their pools as expandable segments
	// wherever the device has virtual memory, whatever ExpandableSegments
	// says, and keep plain segments on a device without it.
	Policy Policy

	// LowFrag holds the knobs of PolicyLowFragmentation (and of
	// PolicyPlanned, which builds on it); zero fields take
	// their defaults. gpumem's own: the gpumem_* keys of policy.go.
	LowFrag LowFragConfig

	// Backend selects the allocator PyTorch's backend key names:
	// BackendNative (the zero value) is this package's caching allocator
	// (New); BackendCudaMallocAsync is the device's stream-ordered pool
	// (NewAsync, async.go), which New refuses. PyTorch: backend.
	Backend Backend
}

// Backend is the allocator behind a configuration (PyTorch's backend key).
type Backend uint8

// The backends.
const (
	BackendNative          Backend = iota // the caching allocator: backend:native
	BackendCudaMallocAsync                // the device's stream-ordered pool: backend:cudaMallocAsync
)

// String returns the backend's name in the configuration text.
func (b Backend) String() string {
	switch b {
	case BackendNative:
		return "native"
	case BackendCudaMallocAsync:
		return "cudaMallocAsync"
	}
	return fmt.Sprintf("Backend(%d)", uint8(b))
}

// PinnedConfig holds the configuration keys of PyTorch's pinned host
// allocator, as PyTorch documents them. None of them changes the device
// allocator; allocator/host gives them their effect.
type PinnedConfig struct {
	// UseHostRegister allocates pinned memory with malloc and registers
	// it instead of asking the driver for pinned memory.
	// PyTorch: pinned_use_cuda_host_register (or pinned_use_hip_host_register).
	UseHostRegister bool

	// NumRegisterThreads is how many threads register the pages of one
	// allocation, a power of two up to 128; zero means PyTorch's 1.
	// PyTorch: pinned_num_register_threads.
	NumRegisterThreads uint64

	// ReserveSegmentSize, when non-zero, is a segment of pinned memory
	// reserved up front and carved for small requests.
	// PyTorch: pinned_reserve_segment_size_mb (after 2.6).
	ReserveSegmentSize uint64

	// UseBackgroundThreads processes the events of freed pinned blocks on
	// a background thread. PyTorch: pinned_use_background_threads.
	UseBackgroundThreads bool

	// FreeCatchAll swallows an error of freeing pinned memory instead of
	// raising it. PyTorch: pinned_free_catch_all (after 2.6).
	FreeCatchAll bool
}

// Reserve is the size of the address range of an expandable segment: a
// fraction of the device's total memory, or a number of GiB. The zero
// Reserve is unset.
type Reserve struct {
	Value float64 // more than 0 when set
	GiB   bool    // Value counts GiB, not a fraction of the device's memory
}

// String renders r as the configuration text writes it: 0.5 or 40G; ""
// for the zero Reserve.
func (r Reserve) String() string {
	if r == (Reserve{}) {
		return ""
	}
	s := strconv.FormatFloat(r.Value, 'g', -1, 64)
	if r.GiB {
		s += "G"
	}
	return s
}

// bytes resolves r against a device of total bytes, saturating at the
// largest uint64.
func (r Reserve) bytes(total uint64) uint64 {
	b := r.Value * float64(total)
	if r.GiB {
		b = r.Value * (1 << 30)
	}
	if b >= math.MaxUint64 {
		return math.MaxUint64
	}
	return uint64(b)
}

func (r Reserve) valid() bool {
	return r == (Reserve{}) || r.Value > 0 && !math.IsInf(r.Value, 0)
}

// Limits that keep every size computation within 64 bits: a byte size in
// the configuration is at most 1 EiB (requests of that size or more are
// refused anyway, so a larger setting could mean nothing more), and an
// interval is divided into at most 2^20 steps (the smallest interval
// governed, 1 MiB, then has steps of one byte).
const (
	maxConfBytes = maxRequestSize
	maxDivisions = 1 << 20

	maxRegisterThreads = 128 // PyTorch's pinned_max_register_threads
)

// validate checks a Config for the caching allocator and returns an error
// naming the bad field; a backend other than native is refused.
func (c *Config) validate() error {
	if err := c.validateKeys(); err != nil {
		return err
	}
	if c.Backend != BackendNative {
		return fmt.Errorf("allocator: backend:%v is the device's stream-ordered pool, served by NewAsync, not by the caching allocator (New)", c.Backend)
	}
	return nil
}

// validateKeys checks every field's value, whatever the backend: what
// ParseConf checks, and NewAsync.
func (c *Config) validateKeys() error {
	var errs []error
	large := c.largeSegment()
	if l := c.LargeSegmentSize; l != 0 && (l <= kMinLargeAlloc || l > maxConfBytes || l%kMinBlockSize != 0) {
		errs = append(errs, fmt.Errorf("LargeSegmentSize %d must be more than %d bytes (10 MiB), at most 1 EiB and a multiple of %d", l, kMinLargeAlloc, kMinBlockSize))
	}
	if c.MaxSplitSize != 0 && c.MaxSplitSize < large {
		errs = append(errs, fmt.Errorf("MaxSplitSize %d must be at least the large segment size, %d bytes", c.MaxSplitSize, large))
	}
	if c.MaxNonSplitRounding != 0 && c.MaxNonSplitRounding < large {
		errs = append(errs, fmt.Errorf("MaxNonSplitRounding %d must be at least the large segment size, %d bytes", c.MaxNonSplitRounding, large))
	}
	if !c.ExpandableSegmentsReserve.valid() {
		errs = append(errs, fmt.Errorf("ExpandableSegmentsReserve %v must be more than 0 and finite", c.ExpandableSegmentsReserve.Value))
	}
	if err := validClasses(c.ExpandableSegmentsReserveByClass); err != nil {
		errs = append(errs, err)
	}
	if n := c.Pinned.NumRegisterThreads; n != 0 && (n&(n-1) != 0 || n > maxRegisterThreads) {
		errs = append(errs, fmt.Errorf("Pinned.NumRegisterThreads %d must be a power of two up to %d", n, maxRegisterThreads))
	}
	if c.Pinned.ReserveSegmentSize > maxConfBytes {
		errs = append(errs, fmt.Errorf("Pinned.ReserveSegmentSize %d is more than 1 EiB", c.Pinned.ReserveSegmentSize))
	}
	if c.MaxSplitSize > maxConfBytes {
		errs = append(errs, fmt.Errorf("MaxSplitSize %d is more than 1 EiB", c.MaxSplitSize))
	}
	if c.MaxNonSplitRounding > maxConfBytes {
		errs = append(errs, fmt.Errorf("MaxNonSplitRounding %d is more than 1 EiB", c.MaxNonSplitRounding))
	}
	for i, d := range c.RoundupPower2Divisions {
		if d != 0 && d&(d-1) != 0 || d > maxDivisions {
			errs = append(errs, fmt.Errorf("RoundupPower2Divisions[%d] = %d is not a power of two up to %d, or 0", i, d, maxDivisions))
		}
	}
	if g := c.GarbageCollectionThreshold; g != 0 && !(g > 0 && g < 1) {
		errs = append(errs, fmt.Errorf("GarbageCollectionThreshold %v must be in (0, 1)", g))
	}
	if f := c.MemoryFraction; f != 0 && !(f > 0 && f <= 1) {
		errs = append(errs, fmt.Errorf("MemoryFraction %v must be in (0, 1]", f))
	}
	errs = append(errs, c.validatePolicy()...)
	if c.Backend > BackendCudaMallocAsync {
		errs = append(errs, fmt.Errorf("Backend %v is not a backend", c.Backend))
	}
	if len(errs) > 0 {
		return fmt.Errorf("allocator: invalid config: %w", errors.Join(errs...))
	}
	return nil
}

// maxSplit returns the configured max split size, or maxSplitNone.
func (c *Config) maxSplit() uint64 {
	if c.MaxSplitSize == 0 {
		return maxSplitNone
	}
	return c.MaxSplitSize
}

// maxNonSplitRounding returns the configured rounding limit, or its
// default, the large segment size.
func (c *Config) maxNonSplitRounding() uint64 {
	if c.MaxNonSplitRounding == 0 {
		return c.largeSegment()
	}
	return c.MaxNonSplitRounding
}

// largeSegment returns the large segment size: LargeSegmentSize, or
// PyTorch 2.6's 20 MiB.
func (c *Config) largeSegment() uint64 {
	if c.LargeSegmentSize == 0 {
		return kLargeBuffer
	}
	return c.LargeSegmentSize
}

// validClasses checks the canonical form of
// ExpandableSegmentsReserveByClass: NAME:RESERVE pairs, names sorted,
// distinct and free of separators and white space.
func validClasses(s string) error {
	if s == "" {
		return nil
	}
	bad := func(why string) error {
		return fmt.Errorf("ExpandableSegmentsReserveByClass %s: %s", quote.Quote(s), why)
	}
	prev := ""
	for i, pair := range strings.Split(s, ",") {
		name, v, ok := strings.Cut(pair, ":")
		if !ok || name == "" || strings.ContainsAny(name, ",:[] \t\n\v\f\r") {
			return bad("want NAME:RESERVE pairs joined by commas")
		}
		if i > 0 && name <= prev {
			return bad("want the names sorted and distinct")
		}
		prev = name
		if r, ok := parseReserve(v); !ok || r.String() != v {
			return bad("want each reserve a fraction (0.5) or GiB (40G), more than 0, as String renders it")
		}
	}
	return nil
}

// String renders the Config in PYTORCH_ALLOC_CONF syntax; ParseConf of the
// result gives the same Config when every byte size it holds is a whole
// number of MiB (the text counts MiB), as every Config that ParseConf
// returns is. The zero Config renders as "".
func (c Config) String() string {
	var parts []string
	if c.MaxSplitSize != 0 {
		parts = append(parts, fmt.Sprintf("max_split_size_mb:%d", c.MaxSplitSize/mib))
	}
	if c.MaxNonSplitRounding != 0 {
		parts = append(parts, fmt.Sprintf("max_non_split_rounding_mb:%d", c.MaxNonSplitRounding/mib))
	}
	if c.LargeSegmentSize != 0 {
		parts = append(parts, fmt.Sprintf("large_segment_size_mb:%d", c.LargeSegmentSize/mib))
	}
	if c.RoundupPower2Divisions != ([NumRoundupIntervals]uint64{}) {
		var items []string
		for i, d := range c.RoundupPower2Divisions {
			items = append(items, fmt.Sprintf("%d:%d", uint64(1)<<i, d))
		}
		parts = append(parts, "roundup_power2_divisions:["+strings.Join(items, ",")+"]")
	}
	if c.GarbageCollectionThreshold != 0 {
		parts = append(parts, "garbage_collection_threshold:"+strconv.FormatFloat(c.GarbageCollectionThreshold, 'g', -1, 64))
	}
	if c.MemoryFraction != 0 {
		parts = append(parts, "per_process_memory_fraction:"+strconv.FormatFloat(c.MemoryFraction, 'g', -1, 64))
	}
	if c.MemoryLimit != 0 {
		parts = append(parts, fmt.Sprintf("memory_limit_bytes:%d", c.MemoryLimit))
	}
	if c.ExpandableSegments {
		parts = append(parts, "expandable_segments:True")
	}
	if c.ExpandableSegmentsReserve != (Reserve{}) {
		parts = append(parts, "expandable_segments_reserve:"+c.ExpandableSegmentsReserve.String())
	}
	if c.ExpandableSegmentsReserveByClass != "" {
		parts = append(parts, "expandable_segments_reserve_by_class:["+c.ExpandableSegmentsReserveByClass+"]")
	}
	flags := []struct {
		on  bool
		key string
	}{
		{c.EarlyOOM, "throw_on_cudamalloc_oom"},
		{c.ReleaseLockOnMalloc, "release_lock_on_cudamalloc"},
		{c.GraphCaptureRecordStreamReuse, "graph_capture_record_stream_reuse"},
		{c.Pinned.UseHostRegister, "pinned_use_cuda_host_register"},
		{c.Pinned.UseBackgroundThreads, "pinned_use_background_threads"},
		{c.Pinned.FreeCatchAll, "pinned_free_catch_all"},
	}
	for _, f := range flags {
		if f.on {
			parts = append(parts, f.key+":True")
		}
	}
	if c.Pinned.NumRegisterThreads != 0 {
		parts = append(parts, fmt.Sprintf("pinned_num_register_threads:%d", c.Pinned.NumRegisterThreads))
	}
	if c.Pinned.ReserveSegmentSize != 0 {
		parts = append(parts, fmt.Sprintf("pinned_reserve_segment_size_mb:%d", c.Pinned.ReserveSegmentSize/mib))
	}
	parts = append(parts, c.policyConf()...)
	if c.Backend != BackendNative {
		parts = append(parts, "backend:"+c.Backend.String())
	}
	return strings.Join(parts, ",")
}

// LookupConfEnv returns the configuration text of the first of
// GPUMEM_ALLOC_CONF, PYTORCH_ALLOC_CONF and PYTORCH_CUDA_ALLOC_CONF that is
// set and not blank, and that variable's name; ("", "") when none is. The
// order after gpumem's own variable is current PyTorch's documented one
// (PYTORCH_ALLOC_CONF first); a variable set to blanks is passed over, so
// that an empty GPUMEM_ALLOC_CONF does not hide PyTorch's settings.
func LookupConfEnv() (conf, name string) {
	for _, v := range confEnvVars {
		if s := os.Getenv(v); strings.TrimSpace(s) != "" {
			return s, v
		}
	}
	return "", ""
}

// ConfigFromEnv parses the configuration that LookupConfEnv finds; none
// gives the zero Config. An error names the variable.
func ConfigFromEnv() (Config, error) {
	s, name := LookupConfEnv()
	c, err := ParseConf(s)
	if err != nil {
		return Config{}, fmt.Errorf("%s: %w", name, err)
	}
	return c, nil
}
