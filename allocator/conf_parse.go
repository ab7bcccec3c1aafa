// This file holds the parser of the configuration text: PyTorch's
// PYTORCH_ALLOC_CONF syntax, with every key that current PyTorch's CUDA
// allocator accepts (its CUDA and accelerator configurations together) and
// gpumem's own keys.

package allocator

import (
	"fmt"
	"math"
	"math/bits"
	"sort"
	"strconv"
	"strings"

	"github.com/gpumem/gpumem/internal/quote"
)

// ParseConf reads a configuration in PyTorch's PYTORCH_ALLOC_CONF (formerly
// PYTORCH_CUDA_ALLOC_CONF) syntax: comma-separated key:value pairs, spaces
// ignored, a trailing comma allowed, for example
//
//	max_split_size_mb:128,roundup_power2_divisions:[256:1,512:2,>:8],garbage_collection_threshold:0.6
//
// The keys, each with PyTorch's rules (see the Config field named for each
// key for what it does here):
//
//	large_segment_size_mb          integer > 10 (MiB)
//	max_split_size_mb              integer >= the large segment size in MiB (20 by default)
//	max_non_split_rounding_mb      integer >= the large segment size in MiB
//	garbage_collection_threshold   number in (0, 1)
//	roundup_power2_divisions       a power of two, or [MIB:DIV,...,>:DIV] with
//	                               MIB a power of two and DIV 0 or a power of two
//	expandable_segments            True or False
//	expandable_segments_reserve    a fraction of device memory (0.5) or GiB (40G), > 0
//	expandable_segments_reserve_by_class  [NAME:RESERVE,...]
//	per_process_memory_fraction    number in [0, 1]
//	throw_on_cudamalloc_oom        True or False
//	release_lock_on_cudamalloc     True or False (also release_lock_on_hipmalloc)
//	graph_capture_record_stream_reuse  True or False
//	backend                        native or cudaMallocAsync (also hipMallocAsync): see Config.Backend
//	pinned_use_cuda_host_register  True or False (also pinned_use_hip_host_register)
//	pinned_num_register_threads    a power of two up to 128
//	pinned_reserve_segment_size_mb integer > 0
//	pinned_use_background_threads  True or False
//	pinned_free_catch_all          True or False
//
// and gpumem's own memory_limit_bytes and policy keys (gpumem_policy:
// faithful, low_fragmentation or planned, and the knobs of LowFragConfig). Booleans are exactly True or False, as in
// PyTorch. A key given twice takes its last value, except that a second
// roundup_power2_divisions list edits the table the first one left, as in
// PyTorch. The size limits a key's value may reach are those of the field
// it sets (1 EiB for byte sizes).
//
// gpumem is stricter than PyTorch in three ways: a number is decimal digits
// (PyTorch's stoull also takes "12abc" as 12 and "-1" as 2^64-1); a bad
// expandable_segments_reserve value is an error (PyTorch warns and keeps
// its default); and any error leaves nothing half applied. Unknown keys and
// bad values are errors that say what is wrong, quoting at most
// quote.Max (100) bytes of the text.
func ParseConf(s string) (Config, error) {
	p := confParser{toks: lexConf(s)}
	var c Config
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
	// The bounds of max_split_size_mb and max_non_split_rounding_mb are
	// the large segment size, wherever large_segment_size_mb stands (PyTorch
	// reads it first).
	large := c.largeSegment() / mib
	for _, b := range p.atLeastLarge {
		if b.n < large {
			return Config{}, p.errorf("%s:%d is too small: it must be at least %d (the large segment size in MiB)", b.key, b.n, large)
		}
	}
	if err := c.validateKeys(); err != nil {
		return Config{}, err
	}
	return c, nil
}

type confParser struct {
	toks []string
	i    int

	// atLeastLarge are the values read of the keys that must be at
	// least the large segment size, checked once every key is read.
	atLeastLarge []keyMiB
}

type keyMiB struct {
	key string
	n   uint64
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

// uintValue reads a non-negative decimal integer.
func (p *confParser) uintValue(key string) (uint64, error) {
	v, err := p.value(key)
	if err != nil {
		return 0, err
	}
	n, err := parseDecimal(v)
	if err != nil {
		return 0, p.errorf("bad value %s for %q: %v", quote.Quote(v), key, err)
	}
	return n, nil
}

// parseDecimal reads decimal digits only (no sign, no base prefix, no
// underscores) into a uint64.
func parseDecimal(v string) (uint64, error) {
	for i := 0; i < len(v); i++ {
		if v[i] < '0' || v[i] > '9' {
			return 0, fmt.Errorf("want a non-negative integer")
		}
	}
	n, err := strconv.ParseUint(v, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("want an integer below 2^64")
	}
	return n, nil
}

// floatValue reads a finite decimal number.
func (p *confParser) floatValue(key string) (float64, error) {
	v, err := p.value(key)
	if err != nil {
		return 0, err
	}
	f, ok := parseNumber(v)
	if !ok {
		return 0, p.errorf("bad value %s for %q: want a decimal number", quote.Quote(v), key)
	}
	return f, nil
}

// parseNumber reads a finite number written in decimal, with an optional
// sign and exponent (no hexadecimal, no underscores, no inf or nan).
func parseNumber(v string) (float64, bool) {
	if strings.ContainsAny(v, "xX_") {
		return 0, false
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
		return 0, false
	}
	return f, true
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

// mbValue reads a size in MiB of at most 1 EiB and returns it in bytes;
// its lower bound, the large segment size, is checked by ParseConf once
// every key is read.
func (p *confParser) mbValue(key string) (uint64, error) {
	n, err := p.uintValue(key)
	if err != nil {
		return 0, err
	}
	p.atLeastLarge = append(p.atLeastLarge, keyMiB{key, n})
	if n > maxConfBytes/mib {
		return 0, p.errorf("%s:%d is too large: at most %d (1 EiB)", key, n, maxConfBytes/mib)
	}
	return n * mib, nil
}

func (p *confParser) parseKey(c *Config, key string) error {
	var err error
	switch key {
	case "large_segment_size_mb":
		var n uint64
		if n, err = p.uintValue(key); err == nil {
			if n <= kMinLargeAlloc/mib {
				return p.errorf("large_segment_size_mb:%d is too small: it must be more than %d (MiB), so that the requests below 10 MiB that share a segment fit in one", n, kMinLargeAlloc/mib)
			}
			if n > maxConfBytes/mib {
				return p.errorf("large_segment_size_mb:%d is too large: at most %d (1 EiB)", n, maxConfBytes/mib)
			}
			c.LargeSegmentSize = n * mib
		}
	case "max_split_size_mb":
		c.MaxSplitSize, err = p.mbValue(key)
	case "max_non_split_rounding_mb":
		c.MaxNonSplitRounding, err = p.mbValue(key)
	case "garbage_collection_threshold":
		var f float64
		if f, err = p.floatValue(key); err == nil {
			if !(f > 0 && f < 1) {
				return p.errorf("garbage_collection_threshold:%v must be in (0, 1): it is the fraction of the allowed memory above which cached blocks are collected", f)
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
	case "expandable_segments_reserve":
		var v string
		if v, err = p.value(key); err == nil {
			c.ExpandableSegmentsReserve, err = p.reserve(key, v)
		}
	case "expandable_segments_reserve_by_class":
		err = p.parseReserveByClass(c)
	case "throw_on_cudamalloc_oom":
		c.EarlyOOM, err = p.boolValue(key)
	case "roundup_power2_divisions":
		err = p.parseRoundup(c)
	case "backend":
		var v string
		if v, err = p.value(key); err != nil {
			return err
		}
		switch v {
		case "native":
			c.Backend = BackendNative
		case "cudaMallocAsync", "hipMallocAsync":
			c.Backend = BackendCudaMallocAsync
		default:
			return p.errorf("backend:%s is not a backend: want native or cudaMallocAsync", quote.Quote(v))
		}
	case "release_lock_on_cudamalloc", "release_lock_on_hipmalloc":
		c.ReleaseLockOnMalloc, err = p.boolValue(key)
	case "graph_capture_record_stream_reuse":
		c.GraphCaptureRecordStreamReuse, err = p.boolValue(key)
	case "pinned_use_cuda_host_register", "pinned_use_hip_host_register":
		c.Pinned.UseHostRegister, err = p.boolValue(key)
	case "pinned_use_background_threads":
		c.Pinned.UseBackgroundThreads, err = p.boolValue(key)
	case "pinned_free_catch_all":
		c.Pinned.FreeCatchAll, err = p.boolValue(key)
	case "pinned_num_register_threads":
		var n uint64
		if n, err = p.uintValue(key); err == nil {
			if n == 0 || n&(n-1) != 0 || n > maxRegisterThreads {
				return p.errorf("pinned_num_register_threads:%d must be a power of two up to %d", n, maxRegisterThreads)
			}
			c.Pinned.NumRegisterThreads = n
		}
	case "pinned_reserve_segment_size_mb":
		var n uint64
		if n, err = p.uintValue(key); err == nil {
			if n == 0 {
				return p.errorf("pinned_reserve_segment_size_mb:0 must be more than 0")
			}
			if n > maxConfBytes/mib {
				return p.errorf("pinned_reserve_segment_size_mb:%d is too large: at most %d (1 EiB)", n, maxConfBytes/mib)
			}
			c.Pinned.ReserveSegmentSize = n * mib
		}
	default:
		if ok, err := p.parsePolicyKey(c, key); ok {
			return err
		}
		return p.errorf("unrecognized key %s", quote.Quote(key))
	}
	return err
}

// reserve reads a reserve: a fraction of the device's memory ("0.5") or a
// number of GiB ("40G" or "40g"), finite and more than 0.
func (p *confParser) reserve(key, v string) (Reserve, error) {
	r, ok := parseReserve(v)
	if !ok {
		return Reserve{}, p.errorf("bad value %s for %q: want a fraction of the device's memory (0.5) or GiB (40G), more than 0", quote.Quote(v), key)
	}
	return r, nil
}

func parseReserve(v string) (Reserve, bool) {
	var r Reserve
	num := v
	if n := len(v); n > 0 && (v[n-1] == 'G' || v[n-1] == 'g') {
		num, r.GiB = v[:n-1], true
	}
	f, ok := parseNumber(num)
	if !ok || !(f > 0) {
		return Reserve{}, false
	}
	r.Value = f
	return r, true
}

// parseReserveByClass reads [NAME:RESERVE,...] (a trailing comma allowed,
// as in PyTorch) into c's canonical list: one entry per name, the last
// given winning, sorted by name.
func (p *confParser) parseReserveByClass(c *Config) error {
	const key = "expandable_segments_reserve_by_class"
	if tok := p.next(); tok != "[" {
		return p.errorf("%s: want a list [NAME:RESERVE,...], found %s", key, quote.Quote(tok))
	}
	classes := map[string]Reserve{}
	for {
		name := p.next()
		if name == "]" {
			break
		}
		if name == "" || isSep(name) {
			return p.errorf("%s: expected a class name or ']', found %s", key, quote.Quote(name))
		}
		if err := p.expect(":"); err != nil {
			return fmt.Errorf("%w in %s", err, key)
		}
		v, err := p.value(key)
		if err != nil {
			return err
		}
		r, err := p.reserve(key, v)
		if err != nil {
			return err
		}
		classes[name] = r
		if p.peek() == "," {
			p.next()
		}
	}
	c.ExpandableSegmentsReserveByClass = formatClasses(classes)
	return nil
}

// formatClasses renders reserve classes in their canonical form:
// NAME:RESERVE pairs sorted by name, joined by commas.
func formatClasses(classes map[string]Reserve) string {
	names := make([]string, 0, len(classes))
	for n := range classes {
		names = append(names, n)
	}
	sort.Strings(names)
	var b strings.Builder
	for i, n := range names {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(n)
		b.WriteByte(':')
		b.WriteString(classes[n].String())
	}
	return b.String()
}

// parseRoundup reads roundup_power2_divisions: either one power of two for
// every interval, or a bracketed list of MIB:DIV pairs, which edits the
// table as it stands (a second list edits what the first left, as in
// PyTorch). As in PyTorch 2.6, the first pair of a list also fills every
// interval below it, and ">:DIV" fills from the interval of the previous
// pair to the last interval. That includes the previous pair's own
// interval, overriding its value: a quirk of 2.6 kept for fidelity
// (current PyTorch starts after it).
func (p *confParser) parseRoundup(c *Config) error {
	const key = "roundup_power2_divisions"
	table := c.RoundupPower2Divisions
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
			mb, err := parseDecimal(tok)
			if err != nil || mb == 0 || mb&(mb-1) != 0 {
				return p.errorf("%s: interval %s must be a power of two (MiB)", key, quote.Quote(tok))
			}
			idx := min(bits.Len64(mb)-1, NumRoundupIntervals-1)
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
			if p.done() {
				return p.errorf("%s: expected ',' or ']', found the end", key)
			}
			return p.errorf("%s: expected ',' or ']', found %s", key, quote.Quote(p.peek()))
		}
	}
	c.RoundupPower2Divisions = table
	return nil
}

// lexConf splits s into tokens: the separators , : [ ] are tokens of their
// own; ASCII white space is dropped, as PyTorch's tokenizer drops it. It
// works on bytes, so a token keeps whatever bytes it was given.
func lexConf(s string) []string {
	var toks []string
	var cur []byte
	flush := func() {
		if len(cur) > 0 {
			toks = append(toks, string(cur))
			cur = cur[:0]
		}
	}
	for i := 0; i < len(s); i++ {
		switch ch := s[i]; ch {
		case ',', ':', '[', ']':
			flush()
			toks = append(toks, string(ch))
		case ' ', '\t', '\n', '\v', '\f', '\r':
		default:
			cur = append(cur, ch)
		}
	}
	flush()
	return toks
}

func isSep(t string) bool { return t == "," || t == ":" || t == "[" || t == "]" }
