// This file holds the allocation policies: the PyTorch-faithful default
// and the opt-in low_fragmentation policy, its knobs, its state and the
// few points where it joins the ladders of DESIGN.md.

package allocator

import (
	"fmt"
	"slices"
	"strconv"

	"github.com/gpumem/gpumem/allocator/internal/freeindex"
	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/internal/quote"
)

// Policy selects how the allocator decides. The zero Policy is
// PolicyFaithful.
type Policy uint8

const (
	// PolicyFaithful makes exactly PyTorch 2.6's decisions (the default).
	PolicyFaithful Policy = iota
	// PolicyLowFragmentation wastes less than PyTorch (see DESIGN.md, "The
	// low_fragmentation policy"): expandable segments with finer pages,
	// growth placed where it maps the fewest pages, free pages unmapped
	// before the reserved high-water mark rises, and free blocks lent
	// across streams. Configuration: gpumem_policy:low_fragmentation.
	PolicyLowFragmentation
	// PolicyPlanned is PolicyLowFragmentation with one pool (every request
	// from the large pool's pages), whose growth keeps freed pages mapped
	// until the device has not the memory for a growth and maps ahead
	// without the slack's bound into half of what the device has left,
	// and that, once a step (MarkStep; in a program that marks none, a
	// period of its allocations that it finds itself) repeats the one
	// before it, or fits the largest sizes of the steps before it, plans
	// the step's allocations offline into an arena and serves the steps
	// that fit it from there, without a fit or a device call (policy_plan.go, policy_plan_auto.go). Configuration:
	// gpumem_policy:planned.
	PolicyPlanned
)

var policyNames = [...]string{
	PolicyFaithful:         "faithful",
	PolicyLowFragmentation: "low_fragmentation",
	PolicyPlanned:          "planned",
}

// String returns the policy's name in the configuration syntax.
func (p Policy) String() string {
	if int(p) < len(policyNames) {
		return policyNames[p]
	}
	return "Policy(" + strconv.Itoa(int(p)) + ")"
}

// LowFragConfig holds the knobs of the low_fragmentation policy. A zero
// field takes its default; the knobs are ignored by the faithful policy.
// DESIGN.md ("The low_fragmentation policy") says what each part does and
// POLICY.md what it gains.
type LowFragConfig struct {
	// LargePage is the page of the large pool's expandable segments, a
	// multiple of 2 MiB; default 2 MiB (PyTorch's is 20 MiB). Finer pages
	// waste less at the ends of blocks and let smaller free runs be
	// unmapped. Configuration: gpumem_large_page_mb.
	LargePage uint64

	// MapAhead is how many bytes growth may map beyond the request while
	// reserved memory stays within the slack, so that the next requests
	// find them mapped; default 20 MiB, and 40 MiB under PolicyPlanned
	// (its one pool maps 2 MiB pages for both pools' requests: 40 MiB
	// cuts its calls by a sixth on the BERT and transformer traces
	// without raising its smallest device there). Less than a page maps
	// only what the request needs.
	// Configuration: gpumem_map_ahead_mb.
	MapAhead uint64

	// Slack is the headroom, as a fraction of the peak of requested bytes,
	// that reserved memory may take before growth above the high-water
	// mark first unmaps free pages elsewhere in the pool; default 0.04.
	// Configuration: gpumem_reclaim_slack.
	Slack float64

	// Victims bounds the free blocks unmapped for one growth when no
	// single block has enough whole pages (each is a device call); if
	// that many cannot cover the growth, none is unmapped and the mark
	// rises; default 2. Configuration: gpumem_reclaim_victims.
	Victims int

	// MinAge is how long a free block stays safe from reclaim, in
	// best-fit searches of its pool since it was freed: the requests that
	// follow a free tend to reuse it, and unmapping it would be undone at
	// once; default 8. Configuration: gpumem_reclaim_min_age.
	MinAge int

	// FitWindow is how many close fits (up to an eighth larger than the
	// best) the large pool's fit compares to take the lowest address;
	// default 16, 1 is PyTorch's best fit. Configuration:
	// gpumem_fit_window.
	FitWindow int

	// NoReclaim turns off unmapping free pages before the high-water mark
	// rises. Configuration: gpumem_reclaim:False.
	NoReclaim bool

	// NoCrossStream turns off lending free blocks cached on one stream to
	// requests on another. Configuration: gpumem_cross_stream:False.
	NoCrossStream bool
}

// Defaults of LowFragConfig, and bounds of its knobs.
const (
	defaultLargePage = kSmallBuffer
	defaultMapAhead  = 20 * mib
	plannedMapAhead  = 40 * mib // PolicyPlanned's default MapAhead
	roomyShare       = 2        // PolicyPlanned maps ahead past the slack into at most 1/roomyShare of the memory the device has left (roomyLimitsLocked)
	defaultSlack     = 0.04
	defaultVictims   = 2
	defaultMinAge    = 8
	defaultFitWindow = 16
	maxLargePage     = 1 << 30
	maxMapAhead      = 1 << 40
	maxKnobCount     = 1 << 20
)

// orDefault returns v, or def when v is zero.
func orDefault[T comparable](v, def T) T {
	var zero T
	if v == zero {
		return def
	}
	return v
}

// validate checks the knobs and returns the errors found.
func (c *LowFragConfig) validate() []error {
	var errs []error
	if n := c.LargePage; n != 0 && (n%kSmallBuffer != 0 || n > maxLargePage) {
		errs = append(errs, fmt.Errorf("LowFrag.LargePage %d must be a multiple of 2 MiB up to 1 GiB", n))
	}
	if c.MapAhead > maxMapAhead {
		errs = append(errs, fmt.Errorf("LowFrag.MapAhead %d is more than 1 TiB", c.MapAhead))
	}
	if s := c.Slack; s != 0 && !(s > 0 && s <= 1) {
		errs = append(errs, fmt.Errorf("LowFrag.Slack %v must be in (0, 1]", s))
	}
	if n := c.Victims; n < 0 || n > maxKnobCount {
		errs = append(errs, fmt.Errorf("LowFrag.Victims %d must be in [0, %d]", n, maxKnobCount))
	}
	if n := c.MinAge; n < 0 || n > maxKnobCount {
		errs = append(errs, fmt.Errorf("LowFrag.MinAge %d must be in [0, %d]", n, maxKnobCount))
	}
	if n := c.FitWindow; n < 0 || n > maxKnobCount {
		errs = append(errs, fmt.Errorf("LowFrag.FitWindow %d must be in [0, %d]", n, maxKnobCount))
	}
	return errs
}

// policyState is the low_fragmentation policy's state; nil in an
// allocator with the faithful policy. It changes in the world only, which
// guards it (the policy's fit, which may run under the one shard's lock,
// reads only its knobs; shards.go), but for the planned policy's plan,
// which the fast paths of the one shard change too while it is the only
// shard (policy_plan.go).
type policyState struct {
	// The knobs, defaults applied; read-only after New.
	largePage uint64
	mapAhead  uint64
	slack     float64
	victims   int
	minAge    int64
	fitWindow int
	reclaim   bool
	lend      bool

	// hwm is the highest reserved byte count so far (never reset): below
	// it, mapping pages raises no peak. With expandable segments reserved
	// bytes never exceed it.
	hwm uint64

	// borrowed counts the allocated blocks lent to a stream other than
	// their segment's: each is marked Lent, with that stream (the
	// caller's) its Borrower, and recorded on it (Allocator.uses).
	borrowed int
	// waited is, per borrower, lender and pool, the pool's search count
	// (freeindex.Pool.GCCalls) when the last wait of the borrower on the lender's
	// work was recorded.
	waited lendWaits
	// hostWaited holds the streams RecordStream has named: never lent to
	// or from (see policy_streams.go); the cold views read it too, and
	// each shard of its own stream keeps the answer (shard.hostWaited).
	hostWaited map[device.Stream]struct{}
	waiter     device.StreamWaiter // the device's, or nil: lending waits on the host
	lending    bool                // allocWorld's takeLocked is handing out a block of another stream's cache...
	lendTo     device.Stream       // ...to this stream (lentLocked then records it as lent)

	// candidates is the list reclaim chooses its victims from
	// (victimsLocked), kept for its next call; clearCandidates empties it.
	candidates []candidate

	// lent counts blocks lent, reclaimed the free blocks unmapped by
	// reclaim: for tests and measurements.
	lent, reclaimed int64

	// plan is the planned policy's state; nil under low_fragmentation.
	plan *planState
}

func newPolicyState(cfg *Config, vm bool) *policyState {
	if cfg.Policy == PolicyFaithful {
		return nil
	}
	l := &cfg.LowFrag
	var plan *planState
	mapAhead := orDefault(l.MapAhead, defaultMapAhead)
	if cfg.Policy == PolicyPlanned {
		plan = &planState{}
		if vm { // nothing is planned without virtual memory
			plan.auto = new(autoSteps)
		}
		mapAhead = orDefault(l.MapAhead, plannedMapAhead)
	}
	return &policyState{
		plan:       plan,
		largePage:  orDefault(l.LargePage, defaultLargePage),
		mapAhead:   mapAhead,
		slack:      orDefault(l.Slack, defaultSlack),
		victims:    orDefault(l.Victims, defaultVictims),
		minAge:     int64(orDefault(l.MinAge, defaultMinAge)),
		fitWindow:  orDefault(l.FitWindow, defaultFitWindow),
		reclaim:    !l.NoReclaim,
		lend:       !l.NoCrossStream,
		hostWaited: make(map[device.Stream]struct{}),
	}
}

// userStreamLocked returns the stream b was handed out for: the stream
// that borrowed it, or its own.
func (a *Allocator) userStreamLocked(b *freeindex.Block) device.Stream {
	if a.pol != nil {
		if a.pol.lending {
			return a.pol.lendTo
		}
		if b.Lent {
			return b.Borrower
		}
	}
	return b.Stream()
}

// validatePolicy checks Policy and LowFrag.
func (c *Config) validatePolicy() []error {
	var errs []error
	if c.Policy > PolicyPlanned {
		errs = append(errs, fmt.Errorf("Policy %d is not a policy", c.Policy))
	}
	return append(errs, c.LowFrag.validate()...)
}

// policyConf renders Policy and the non-zero knobs of LowFrag in the
// configuration syntax.
func (c *Config) policyConf() []string {
	var parts []string
	if c.Policy != PolicyFaithful {
		parts = append(parts, "gpumem_policy:"+c.Policy.String())
	}
	l := &c.LowFrag
	if l.LargePage != 0 {
		parts = append(parts, fmt.Sprintf("gpumem_large_page_mb:%d", l.LargePage/mib))
	}
	if l.MapAhead != 0 {
		parts = append(parts, fmt.Sprintf("gpumem_map_ahead_mb:%d", l.MapAhead/mib))
	}
	if l.Slack != 0 {
		parts = append(parts, "gpumem_reclaim_slack:"+strconv.FormatFloat(l.Slack, 'g', -1, 64))
	}
	if l.Victims != 0 {
		parts = append(parts, fmt.Sprintf("gpumem_reclaim_victims:%d", l.Victims))
	}
	if l.MinAge != 0 {
		parts = append(parts, fmt.Sprintf("gpumem_reclaim_min_age:%d", l.MinAge))
	}
	if l.FitWindow != 0 {
		parts = append(parts, fmt.Sprintf("gpumem_fit_window:%d", l.FitWindow))
	}
	if l.NoReclaim {
		parts = append(parts, "gpumem_reclaim:False")
	}
	if l.NoCrossStream {
		parts = append(parts, "gpumem_cross_stream:False")
	}
	return parts
}

// parsePolicyKey reads the value of one of the policy keys into c; ok is
// false when key is not one of them.
//
//	gpumem_policy           faithful, low_fragmentation or planned
//	gpumem_large_page_mb    LowFragConfig.LargePage in MiB: 2, 4, 6, ... 1024
//	gpumem_map_ahead_mb     LowFragConfig.MapAhead in MiB: 1 to 2^20
//	gpumem_reclaim_slack    LowFragConfig.Slack, in (0, 1]
//	gpumem_reclaim_victims  LowFragConfig.Victims: 1 to 2^20
//	gpumem_reclaim_min_age  LowFragConfig.MinAge: 1 to 2^20
//	gpumem_fit_window       LowFragConfig.FitWindow: 1 to 2^20
//	gpumem_reclaim          True or False (LowFragConfig.NoReclaim)
//	gpumem_cross_stream     True or False (LowFragConfig.NoCrossStream)
//
// The knobs are read whatever the policy, and act only under
// low_fragmentation and planned.
func (p *confParser) parsePolicyKey(c *Config, key string) (ok bool, err error) {
	l := &c.LowFrag
	count := func(dst *int) {
		var n uint64
		if n, err = p.uintValue(key); err == nil {
			if n == 0 || n > maxKnobCount {
				err = p.errorf("%s:%d must be from 1 to %d", key, n, maxKnobCount)
				return
			}
			*dst = int(n)
		}
	}
	switch key {
	case "gpumem_policy":
		var v string
		if v, err = p.value(key); err != nil {
			return true, err
		}
		for i, name := range policyNames {
			if v == name {
				c.Policy = Policy(i)
				return true, nil
			}
		}
		return true, p.errorf("gpumem_policy:%s is not a policy: want faithful, low_fragmentation or planned", quote.Quote(v))
	case "gpumem_large_page_mb":
		var n uint64
		if n, err = p.uintValue(key); err == nil {
			if n == 0 || n%2 != 0 || n > maxLargePage/mib {
				return true, p.errorf("gpumem_large_page_mb:%d must be a multiple of 2 from 2 to %d", n, maxLargePage/mib)
			}
			l.LargePage = n * mib
		}
	case "gpumem_map_ahead_mb":
		var n uint64
		if n, err = p.uintValue(key); err == nil {
			if n == 0 || n > maxMapAhead/mib {
				return true, p.errorf("gpumem_map_ahead_mb:%d must be from 1 to %d", n, maxMapAhead/mib)
			}
			l.MapAhead = n * mib
		}
	case "gpumem_reclaim_slack":
		var f float64
		if f, err = p.floatValue(key); err == nil {
			if !(f > 0 && f <= 1) {
				return true, p.errorf("gpumem_reclaim_slack:%v must be in (0, 1]", f)
			}
			l.Slack = f
		}
	case "gpumem_reclaim_victims":
		count(&l.Victims)
	case "gpumem_reclaim_min_age":
		count(&l.MinAge)
	case "gpumem_fit_window":
		count(&l.FitWindow)
	case "gpumem_reclaim":
		var on bool
		on, err = p.boolValue(key)
		l.NoReclaim = !on
	case "gpumem_cross_stream":
		var on bool
		on, err = p.boolValue(key)
		l.NoCrossStream = !on
	default:
		return false, nil
	}
	return true, err
}

// checkPolicyLocked adds the policy's invariants to CheckInvariants:
//
//   - every lent block is allocated, in its shard's address table (its
//     segment's, the lender's), and recorded on the stream that borrowed
//     it, which is not its own; the blocks marked Lent are as many as
//     the policy counts (borrowed);
//   - a shard of a stream of its own says its stream was recorded
//     (hostWaited) exactly when the policy's set holds the stream;
//   - no block is being lent outside Alloc;
//   - with expandable segments, reserved bytes never exceed the
//     high-water mark, and every segment's page is its pool's (2 MiB in
//     the small pool, LargePage in the large one).
func (a *Allocator) checkPolicyLocked(bad func(format string, args ...any)) {
	p := a.pol
	lent := 0
	for _, seg := range a.segments {
		for b := seg.Head(); b != nil; b = b.Next() {
			if !b.Lent {
				continue
			}
			lent++
			if lb, _ := a.liveBlockLocked(b.Ptr(), nil); !b.Allocated || lb != b {
				bad("lent block %v is not an allocated block", b.Ptr())
				continue
			}
			if s := b.Borrower; s == b.Stream() || b.Uses == 0 || !slices.Contains(a.usesOf(b), s) {
				bad("lent block %v (stream %d) is not recorded on the stream %d that borrowed it", b.Ptr(), b.Stream(), s)
			}
		}
	}
	if lent != p.borrowed {
		bad("%d blocks are lent, the policy counts %d", lent, p.borrowed)
	}
	for _, sh := range a.shards {
		if !sh.cold && sh.hostWaited != p.hostWaitedLocked(sh.stream) {
			bad("shard %d of stream %d says its stream was recorded: %v, the policy: %v", sh.id, sh.stream, sh.hostWaited, !sh.hostWaited)
		}
	}
	if p.lending {
		bad("a block is being lent outside Alloc")
	}
	if p.plan != nil {
		a.checkPlanLocked(bad)
	}
	if a.vm == nil {
		return
	}
	if r := a.reservedLocked(); r > p.hwm {
		bad("reserved bytes %d are above the policy's high-water mark %d", r, p.hwm)
	}
	for _, s := range a.segments {
		want := p.largePage
		if s.Pool().Small() {
			want = kSmallBuffer
		}
		if s.Page() != want {
			bad("segment %v has pages of %d bytes, its pool's are %d", s.Ptr(), s.Page(), want)
		}
	}
}
