// This file holds the allocator's configuration and the parser of PyTorch's
// PYTORCH_CUDA_ALLOC_CONF syntax.

package allocator

import (
	"errors"
	"fmt"
	"math"
	"math/bits"
	"os"
	"strconv"
	"strings"

	"github.com/gpumem/gpumem/internal/quote"
)

// EnvVar is the environment variable that ConfigFromEnv reads. Its syntax is
// PyTorch's PYTORCH_CUDA_ALLOC_CONF.
const EnvVar = "GPUMEM_ALLOC_CONF"

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
	// whole cache. PyTorch: max_split_size_mb (which must be > 20 MiB).
	// Zero means unlimited.
	MaxSplitSize uint64

	// MaxNonSplitRounding is how much larger than the request a cached
	// oversize block may be and still be handed out whole. Zero means the
	// default, 20 MiB. PyTorch: max_non_split_rounding_mb.
	MaxNonSplitRounding uint64

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
	// this fraction of the device's total memory. Zero means no cap. As in
	// PyTorch, 1 is a cap too (at the device's memory, which the device
	// enforces anyway): it turns GarbageCollectionThreshold on. PyTorch:
	// set_per_process_memory_fraction.
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
	// capability. PyTorch: expandable_segments.
	ExpandableSegments bool

	// Policy selects how the allocator decides: PolicyFaithful (the zero
	// value) makes PyTorch 2.6's decisions, PolicyLowFragmentation wastes
	// less (see policy.go). gpumem's own: gpumem_policy.
	Policy Policy

	// LowFrag holds the knobs of PolicyLowFragmentation; zero fields take
	// their defaults. gpumem's own: the gpumem_* keys of policy.go.
	LowFrag LowFragConfig
}

// Limits that keep every size computation within 64 bits: a byte size in
// the configuration is at most 1 EiB (requests of that size or more are
// refused anyway, so a larger setting could mean nothing more), and an
// interval is divided into at most 2^20 steps (the smallest interval
// governed, 1 MiB, then has steps of one byte).
const (
	maxConfBytes = maxRequestSize
	maxDivisions = 1 << 20
)

// validate checks a Config and returns an error naming the bad field.
func (c *Config) validate() error {
	var errs []error
	if c.MaxSplitSize != 0 && c.MaxSplitSize <= kLargeBuffer {
		errs = append(errs, fmt.Errorf("MaxSplitSize %d must be more than %d bytes (20 MiB)", c.MaxSplitSize, kLargeBuffer))
	}
	if c.MaxNonSplitRounding != 0 && c.MaxNonSplitRounding <= kLargeBuffer {
		errs = append(errs, fmt.Errorf("MaxNonSplitRounding %d must be more than %d bytes (20 MiB)", c.MaxNonSplitRounding, kLargeBuffer))
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

func (c *Config) maxNonSplitRounding() uint64 {
	if c.MaxNonSplitRounding == 0 {
		return kLargeBuffer
	}
	return c.MaxNonSplitRounding
}

// String renders the Config in PYTORCH_CUDA_ALLOC_CONF syntax; ParseConf of
// the result gives the same Config. The zero Config renders as "".
func (c Config) String() string {
	var parts []string
	if c.MaxSplitSize != 0 {
		parts = append(parts, fmt.Sprintf("max_split_size_mb:%d", c.MaxSplitSize/mib))
	}
	if c.MaxNonSplitRounding != 0 {
		parts = append(parts, fmt.Sprintf("max_non_split_rounding_mb:%d", c.MaxNonSplitRounding/mib))
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
	parts = append(parts, c.policyConf()...)
	return strings.Join(parts, ",")
}

// ConfigFromEnv parses the GPUMEM_ALLOC_CONF environment variable; an unset
// or empty variable gives the zero Config.
func ConfigFromEnv() (Config, error) {
	return ParseConf(os.Getenv(EnvVar))
}

// ParseConf reads a configuration in PyTorch's PYTORCH_CUDA_ALLOC_CONF
// syntax: comma-separated key:value pairs, spaces ignored, for example
//
//	max_split_size_mb:128,roundup_power2_divisions:[256:1,512:2,>:8],garbage_collection_threshold:0.6
//
// Keys: max_split_size_mb, max_non_split_rounding_mb, roundup_power2_divisions
// (a single power of two, or a list of MiB-interval:divisions pairs with ">"
// for every interval after the last one given), garbage_collection_threshold,
// expandable_segments (True or False), per_process_memory_fraction, and
// gpumem's memory_limit_bytes. PyTorch's keys for its host allocator and
// backend (backend:native, release_lock_on_cudamalloc,
// pinned_use_cuda_host_register, pinned_num_register_threads,
// pinned_use_background_threads) are accepted and ignored so that PyTorch
// settings carry over. gpumem's policy keys (gpumem_policy and the knobs of
// the low_fragmentation policy, see LowFragConfig) are read too. Unknown
// keys and bad values are errors that name them.
func ParseConf(s string) (Config, error) {
	var c Config
	p := confParser{toks: lexConf(s)}
	for !p.done() {
		key := p.next()
		if isSep(key) {
			return Config{}, p.errorf("expected a key, found %s", quote.Quote(key))
		}
		if err := p.expect(":"); err != nil {
			return Config{}, fmt.Errorf("%w after key %s", err, quote.Quote(key))
		}
		if err := p.parseKey(&c, key); err != nil {
			return Config{}, err
		}
		if !p.done() {
			if err := p.expect(","); err != nil {
				return Config{}, fmt.Errorf("%w after the value of %s", err, quote.Quote(key))
			}
		}
	}
	if err := c.validate(); err != nil {
		return Config{}, err
	}
	return c, nil
}

type confParser struct {
	toks []string
	i    int
}

func (p *confParser) done() bool { return p.i >= len(p.toks) }

func (p *confParser) next() string {
	if p.done() {
		return ""
	}
	t := p.toks[p.i]
	p.i++
	return t
}

func (p *confParser) peek() string {
	if p.done() {
		return ""
	}
	return p.toks[p.i]
}

func (p *confParser) expect(tok string) error {
	if got := p.next(); got != tok {
		if got == "" {
			return p.errorf("expected %q, found the end", tok)
		}
		return p.errorf("expected %q, found %s", tok, quote.Quote(got))
	}
	return nil
}

func (p *confParser) errorf(format string, args ...any) error {
	return fmt.Errorf("allocator: parsing config: "+format, args...)
}

// value returns the next token, which must be a value (not a separator).
func (p *confParser) value(key string) (string, error) {
	v := p.next()
	if v == "" || isSep(v) {
		return "", p.errorf("missing value for %q", key)
	}
	return v, nil
}

func (p *confParser) uintValue(key string) (uint64, error) {
	v, err := p.value(key)
	if err != nil {
		return 0, err
	}
	n, err := strconv.ParseUint(v, 10, 64)
	if err != nil {
		return 0, p.errorf("bad value %s for %q: want a non-negative integer", quote.Quote(v), key)
	}
	return n, nil
}

func (p *confParser) floatValue(key string) (float64, error) {
	v, err := p.value(key)
	if err != nil {
		return 0, err
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || math.IsNaN(f) {
		return 0, p.errorf("bad value %s for %q: want a number", quote.Quote(v), key)
	}
	return f, nil
}

func (p *confParser) boolValue(key string) (bool, error) {
	v, err := p.value(key)
	if err != nil {
		return false, err
	}
	switch v {
	case "True":
		return true, nil
	case "False":
		return false, nil
	}
	return false, p.errorf("bad value %s for %q: want True or False", quote.Quote(v), key)
}

func (p *confParser) mbValue(key string) (uint64, error) {
	n, err := p.uintValue(key)
	if err != nil {
		return 0, err
	}
	if n <= kLargeBuffer/mib {
		return 0, p.errorf("%s:%d is too small: it must be more than %d", key, n, kLargeBuffer/mib)
	}
	if n > maxConfBytes/mib {
		return 0, p.errorf("%s:%d is too large: at most %d (1 EiB)", key, n, maxConfBytes/mib)
	}
	return n * mib, nil
}

func (p *confParser) parseKey(c *Config, key string) error {
	var err error
	switch key {
	case "max_split_size_mb":
		c.MaxSplitSize, err = p.mbValue(key)
	case "max_non_split_rounding_mb":
		c.MaxNonSplitRounding, err = p.mbValue(key)
	case "garbage_collection_threshold":
		var f float64
		if f, err = p.floatValue(key); err == nil {
			if !(f > 0 && f < 1) {
				return p.errorf("garbage_collection_threshold:%v must be in (0, 1)", f)
			}
			c.GarbageCollectionThreshold = f
		}
	case "per_process_memory_fraction":
		var f float64
		if f, err = p.floatValue(key); err == nil {
			if !(f >= 0 && f <= 1) {
				return p.errorf("per_process_memory_fraction:%v must be in [0, 1]", f)
			}
			c.MemoryFraction = f
		}
	case "memory_limit_bytes":
		c.MemoryLimit, err = p.uintValue(key)
	case "expandable_segments":
		c.ExpandableSegments, err = p.boolValue(key)
	case "roundup_power2_divisions":
		err = p.parseRoundup(c)
	case "backend":
		var v string
		if v, err = p.value(key); err == nil && v != "native" {
			return p.errorf("backend:%s is not supported: gpumem is the native caching allocator", quote.Quote(v))
		}
	case "release_lock_on_cudamalloc", "release_lock_on_hipmalloc",
		"pinned_use_cuda_host_register", "pinned_use_hip_host_register",
		"pinned_use_background_threads":
		_, err = p.boolValue(key)
	case "pinned_num_register_threads":
		var n uint64
		if n, err = p.uintValue(key); err == nil && (n == 0 || n&(n-1) != 0 || n > 128) {
			return p.errorf("pinned_num_register_threads:%d must be a power of two up to 128", n)
		}
	default:
		if ok, err := p.parsePolicyKey(c, key); ok {
			return err
		}
		return p.errorf("unrecognized key %s", quote.Quote(key))
	}
	return err
}

// parseRoundup reads roundup_power2_divisions: either one power of two for
// every interval, or a bracketed list of MIB:DIV pairs. As in PyTorch 2.6,
// the first pair also fills every interval below it, and ">:DIV" fills from
// the interval of the previous pair (inclusive, so it overrides that pair's
// own value, a quirk of 2.6 kept for fidelity) to the last interval.
func (p *confParser) parseRoundup(c *Config) error {
	const key = "roundup_power2_divisions"
	var table [NumRoundupIntervals]uint64
	if p.peek() != "[" {
		n, err := p.uintValue(key)
		if err != nil {
			return err
		}
		if n == 0 || n&(n-1) != 0 || n > maxDivisions {
			return p.errorf("%s:%d must be a power of two up to %d", key, n, maxDivisions)
		}
		for i := range table {
			table[i] = n
		}
		c.RoundupPower2Divisions = table
		return nil
	}
	p.next() // "["
	first := true
	last := 0
	for {
		tok := p.next()
		if tok == "]" {
			break
		}
		if tok == "" || isSep(tok) {
			return p.errorf("%s: expected an interval or ']', found %s", key, quote.Quote(tok))
		}
		if err := p.expect(":"); err != nil {
			return fmt.Errorf("%w in %s", err, key)
		}
		div, err := p.uintValue(key)
		if err != nil {
			return err
		}
		if div != 0 && div&(div-1) != 0 || div > maxDivisions {
			return p.errorf("%s: divisions %d must be a power of two up to %d, or 0", key, div, maxDivisions)
		}
		if tok == ">" {
			for i := last; i < NumRoundupIntervals; i++ {
				table[i] = div
			}
		} else {
			mb, err := strconv.ParseUint(tok, 10, 64)
			if err != nil || mb == 0 || mb&(mb-1) != 0 {
				return p.errorf("%s: interval %s must be a power of two (MiB)", key, quote.Quote(tok))
			}
			idx := bits.Len64(mb) - 1
			if idx >= NumRoundupIntervals {
				idx = NumRoundupIntervals - 1
			}
			if first {
				for i := 0; i < idx; i++ {
					table[i] = div
				}
				first = false
			}
			table[idx] = div
			last = idx
		}
		if p.peek() == "," {
			p.next()
		} else if p.peek() != "]" {
			return p.errorf("%s: expected ',' or ']', found %s", key, quote.Quote(p.peek()))
		}
	}
	c.RoundupPower2Divisions = table
	return nil
}

// lexConf splits s into tokens: the separators , : [ ] are tokens of their
// own; spaces are dropped.
func lexConf(s string) []string {
	var toks []string
	var cur strings.Builder
	flush := func() {
		if cur.Len() > 0 {
			toks = append(toks, cur.String())
			cur.Reset()
		}
	}
	for _, r := range s {
		switch r {
		case ',', ':', '[', ']':
			flush()
			toks = append(toks, string(r))
		case ' ', '\t', '\n', '\r':
		default:
			cur.WriteRune(r)
		}
	}
	flush()
	return toks
}

func isSep(t string) bool { return t == "," || t == ":" || t == "[" || t == "]" }
