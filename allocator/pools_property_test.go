package allocator

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"pgregory.net/rapid"

	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/device/sim"
	"github.com/gpumem/gpumem/internal/simtest"
)

// poolMachine is a rapid state machine that mixes named pools, routes,
// graph capture, pause and resume, release and the default pool's
// requests on three streams of a small simulated device, with RecordStream
// and busy streams. After every action it runs the invariant checker and
// checks the model:
//
//   - a block comes from the pool its stream is routed to (or captures
//     into), or from the default pool; a default request may get a block of
//     a pool made with UseOnOOM only;
//   - live blocks never overlap, and keep their addresses across pause and
//     resume;
//   - what the allocator says of routes, captures and paused pools is what
//     the model says, and the operations the model says must succeed do;
//   - a pool's allocated bytes are those of its allocated blocks in the
//     snapshot while it is not paused.
type poolMachine struct {
	a       *Allocator
	dev     *sim.Device
	vm      bool // the device has virtual memory
	streams []device.Stream
	busy    map[device.Stream]bool
	pools   []*Pool                 // made, in order; released ones stay
	route   map[device.Stream]*Pool // the model's routes
	capture map[device.Stream]bool
	paused  map[*Pool]bool
	live    map[device.Ptr]poolBlock
}

type poolBlock struct {
	size uint64
	pool *Pool // nil: the default pool
}

func newPoolMachine(t *rapid.T) *poolMachine {
	dev := simtest.New(t, simtest.Capacity(rapid.SampledFrom([]uint64{128 * mib, gib}).Draw(t, "capacity")))
	// Pausing needs virtual memory, with or without expandable segments.
	vm := rapid.Bool().Draw(t, "virtual memory")
	expandable := vm && rapid.Bool().Draw(t, "expandable")
	var d device.Device = dev
	if !vm {
		d = device.Compose(dev, device.Capabilities{HostMemory: dev, StreamChecker: dev, UsageReporter: dev, StreamWaiter: dev, Copier: dev})
	}
	a := onDevice(t, d, Config{ExpandableSegments: expandable})
	m := &poolMachine{a: a, dev: dev, vm: vm, busy: map[device.Stream]bool{}, route: map[device.Stream]*Pool{},
		capture: map[device.Stream]bool{}, paused: map[*Pool]bool{}, live: map[device.Ptr]poolBlock{}}
	m.streams = simtest.Streams(t, dev, 2)
	return m
}

// usable reports whether p may be routed to: made, not released, not
// paused.
func (m *poolMachine) usable(p *Pool) bool { return !p.released && !m.paused[p] }

func (m *poolMachine) pickPool(t *rapid.T) *Pool {
	if len(m.pools) == 0 {
		t.Skip("no pool")
	}
	return rapid.SampledFrom(m.pools).Draw(t, "pool")
}

func (m *poolMachine) NewPool(t *rapid.T) {
	name := fmt.Sprintf("p%d", rapid.IntRange(0, 3).Draw(t, "name"))
	o := PoolOptions{NoSplit: rapid.Bool().Draw(t, "no_split"), UseOnOOM: rapid.Bool().Draw(t, "use_on_oom")}
	taken := slices.ContainsFunc(m.pools, func(p *Pool) bool { return p.name == name && !p.released })
	p, err := m.a.NewPool(name, o)
	if taken != (err != nil) {
		t.Fatalf("NewPool(%q): name taken %v, error %v", name, taken, err)
	}
	if err == nil {
		m.pools = append(m.pools, p)
	}
}

func (m *poolMachine) Route(t *rapid.T) {
	p := m.pickPool(t)
	s := rapid.SampledFrom(m.streams).Draw(t, "stream")
	capture := rapid.Bool().Draw(t, "capture")
	var err error
	if capture {
		err = m.a.BeginCapture(p, s)
	} else {
		err = m.a.UsePool(p, s)
	}
	capturing := false
	for t2, c := range m.capture {
		capturing = capturing || c && m.route[t2] == p
	}
	ok := m.usable(p) && m.route[s] == nil && !(capture && capturing)
	if ok != (err == nil) {
		t.Fatalf("route stream %d to %q (capture %v): model says %v, error %v", s, p.name, capture, ok, err)
	}
	if err == nil {
		m.route[s], m.capture[s] = p, capture
	}
}

func (m *poolMachine) Unroute(t *rapid.T) {
	s := rapid.SampledFrom(m.streams).Draw(t, "stream")
	var err error
	end := m.capture[s]
	if end {
		err = m.a.EndCapture(s)
	} else {
		err = m.a.UseDefaultPool(s)
	}
	if (m.route[s] != nil) != (err == nil) {
		t.Fatalf("unroute stream %d: routed %v, error %v", s, m.route[s] != nil, err)
	}
	delete(m.route, s)
	delete(m.capture, s)
}

func (m *poolMachine) Alloc(t *rapid.T) {
	s := rapid.SampledFrom(m.streams).Draw(t, "stream")
	size := rapid.SampledFrom([]uint64{512, 100 << 10, 3 * mib, 30 * mib}).Draw(t, "size")
	p, err := m.a.Alloc(size, s)
	if err != nil {
		if !errors.Is(err, device.ErrOutOfMemory) {
			t.Fatalf("alloc: %v", err)
		}
		return
	}
	want := m.route[s]
	got := m.poolOf(t, p)
	if got != want && !(want == nil && got != nil && got.opts.UseOnOOM) {
		t.Fatalf("alloc on stream %d: a block of pool %q, routed to %q", s, got.Name(), want.Name())
	}
	for q, b := range m.live {
		if p < q+device.Ptr(b.size) && q < p+device.Ptr(size) {
			t.Fatalf("block %v+%d overlaps live %v+%d", p, size, q, b.size)
		}
	}
	m.live[p] = poolBlock{size, got}
}

// poolOf returns the pool whose segment holds p, by the snapshot's pool
// ids.
func (m *poolMachine) poolOf(t *rapid.T, p device.Ptr) *Pool {
	for _, s := range m.a.Snapshot() {
		if p >= s.Ptr && uint64(p-s.Ptr) < s.Size {
			if s.PoolID == 0 {
				return nil
			}
			for _, q := range m.pools {
				if q.id == s.PoolID {
					return q
				}
			}
			t.Fatalf("segment %v has pool id %d, which no pool has", s.Ptr, s.PoolID)
		}
	}
	t.Fatalf("no segment holds %v", p)
	return nil
}

func (m *poolMachine) Free(t *rapid.T) {
	if len(m.live) == 0 {
		t.Skip("nothing live")
	}
	p := rapid.SampledFrom(slices.Sorted(mapKeys(m.live))).Draw(t, "block")
	err := m.a.Free(p)
	if paused := m.paused[m.live[p].pool]; paused != (err != nil) {
		t.Fatalf("free %v: pool paused %v, error %v", p, paused, err)
	}
	if err == nil {
		delete(m.live, p)
	}
}

func mapKeys[K comparable, V any](m map[K]V) func(func(K) bool) {
	return func(yield func(K) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

func (m *poolMachine) Record(t *rapid.T) {
	if len(m.live) == 0 {
		t.Skip("nothing live")
	}
	p := rapid.SampledFrom(slices.Sorted(mapKeys(m.live))).Draw(t, "block")
	s := rapid.SampledFrom(m.streams[1:]).Draw(t, "stream")
	if !m.busy[s] {
		if err := m.dev.SetStreamBusy(s, true); err != nil {
			t.Fatal(err)
		}
		m.busy[s] = true
	}
	err := m.a.RecordStream(p, s)
	if paused := m.paused[m.live[p].pool]; paused != (err != nil) {
		t.Fatalf("record %v: pool paused %v, error %v", p, paused, err)
	}
}

func (m *poolMachine) Complete(t *rapid.T) {
	s := rapid.SampledFrom(m.streams[1:]).Draw(t, "stream")
	if err := m.dev.CompleteStream(s); err != nil {
		t.Fatal(err)
	}
	m.busy[s] = false
}

func (m *poolMachine) EmptyCache(t *rapid.T) {
	err := m.a.EmptyCache()
	if capturing := slices.Contains(slices.Collect(func(y func(bool) bool) {
		for _, c := range m.capture {
			if !y(c) {
				return
			}
		}
	}), true); capturing != (err != nil) {
		t.Fatalf("EmptyCache: capturing %v, error %v", capturing, err)
	}
}

func (m *poolMachine) Pause(t *rapid.T) {
	p := m.pickPool(t)
	backup := rapid.Bool().Draw(t, "backup")
	before := m.blocksOf(p)
	err := m.a.PausePool(p, backup)
	if err != nil {
		if !m.vm || !m.usable(p) || slices.Contains(slices.Collect(mapValues(m.route)), p) || len(m.capture) > 0 {
			return // a reason the model knows
		}
		if !strings.Contains(err.Error(), "wait for stream events") {
			t.Fatalf("pause %q: %v", p.name, err)
		}
		return
	}
	if !m.vm || !m.usable(p) {
		t.Fatalf("pause %q succeeded (virtual memory %v, backup %v, usable %v)", p.name, m.vm, backup, m.usable(p))
	}
	m.paused[p] = true
	if after := m.blocksOf(p); !slices.Equal(before, after) {
		t.Fatalf("pause %q moved its blocks: %v, then %v", p.name, before, after)
	}
}

func mapValues[K comparable, V any](m map[K]V) func(func(V) bool) {
	return func(yield func(V) bool) {
		for _, v := range m {
			if !yield(v) {
				return
			}
		}
	}
}

func (m *poolMachine) Resume(t *rapid.T) {
	p := m.pickPool(t)
	err := m.a.ResumePool(p)
	switch {
	case !m.paused[p] && err == nil:
		t.Fatalf("resume %q, not paused, succeeded", p.name)
	case m.paused[p] && err != nil && !errors.Is(err, device.ErrOutOfMemory):
		t.Fatalf("resume %q: %v", p.name, err)
	case err == nil:
		delete(m.paused, p)
	}
}

func (m *poolMachine) Release(t *rapid.T) {
	p := m.pickPool(t)
	ok := m.usable(p) && !slices.Contains(slices.Collect(mapValues(m.route)), p)
	err := m.a.ReleasePool(p)
	if ok != (err == nil) {
		t.Fatalf("release %q: model says %v, error %v", p.name, ok, err)
	}
}

// blocksOf returns the addresses of the model's live blocks of p, sorted.
func (m *poolMachine) blocksOf(p *Pool) []device.Ptr {
	var ps []device.Ptr
	for q, b := range m.live {
		if b.pool == p {
			ps = append(ps, q)
		}
	}
	slices.Sort(ps)
	return ps
}

func (m *poolMachine) Check(t *rapid.T) {
	if err := m.a.CheckInvariants(); err != nil {
		t.Fatal(err)
	}
	for _, s := range m.streams {
		p, c := m.a.Capturing(s)
		if c != m.capture[s] || c && p != m.route[s] {
			t.Fatalf("stream %d: capturing %v into %q, model %v into %q", s, c, p.Name(), m.capture[s], m.route[s].Name())
		}
	}
	byPool := map[uint64]uint64{}
	for _, s := range m.a.Snapshot() {
		for _, b := range s.Blocks {
			if b.State == BlockAllocated {
				byPool[s.PoolID] += b.Size
			}
		}
	}
	for _, p := range m.pools {
		if p.Paused() != m.paused[p] {
			t.Fatalf("pool %q: paused %v, model %v", p.name, p.Paused(), m.paused[p])
		}
		ps, err := m.a.PoolStats(p)
		if err != nil {
			if !p.released {
				t.Fatalf("stats of live pool %q: %v", p.name, err)
			}
			continue
		}
		if ps.AllocatedBytes != byPool[p.id] {
			t.Fatalf("pool %q: allocated %d, its blocks %d", p.name, ps.AllocatedBytes, byPool[p.id])
		}
	}
}

func TestPoolsStateMachine(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		t.Repeat(rapid.StateMachineActions(newPoolMachine(t)))
	})
}
