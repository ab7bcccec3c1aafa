// This file tests the Reporter: memory lines every N steps, peaks with
// their phase and step, the limits on peaks, out-of-memory records, and
// that nothing is logged under the allocator's locks.

package memlog

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"math"
	"strconv"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpumem/gpumem/allocator"
	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/gpumemtest"
)

const mib = 1 << 20

// logBuffer is a JSON slog handler's output, read back as records.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *logBuffer) logger() *slog.Logger {
	return slog.New(slog.NewJSONHandler(l, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// records returns the records logged so far and forgets them.
func (l *logBuffer) records(t *testing.T) []map[string]any {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []map[string]any
	dec := json.NewDecoder(&l.buf)
	for dec.More() {
		var m map[string]any
		require.NoError(t, dec.Decode(&m))
		out = append(out, m)
	}
	l.buf.Reset()
	return out
}

func newAllocator(t *testing.T, capacity uint64, cfg allocator.Config) *allocator.Allocator {
	t.Helper()
	return gpumemtest.New(t, gpumemtest.WithCapacity(capacity), gpumemtest.WithConfig(cfg))
}

func alloc(t *testing.T, a *allocator.Allocator, size uint64) device.Ptr {
	t.Helper()
	p, err := a.Alloc(size, device.DefaultStream)
	require.NoError(t, err)
	return p
}

func free(t *testing.T, a *allocator.Allocator, ps ...device.Ptr) {
	t.Helper()
	for _, p := range ps {
		require.NoError(t, a.Free(p))
	}
}

func num(m map[string]any, key string) int64 {
	f, _ := m[key].(float64)
	return int64(f)
}

func memory(m map[string]any, key string) int64 {
	g, _ := m["memory"].(map[string]any)
	return num(g, key)
}

// byMsg returns the records with message msg.
func byMsg(recs []map[string]any, msg string) []map[string]any {
	var out []map[string]any
	for _, r := range recs {
		if r["msg"] == msg {
			out = append(out, r)
		}
	}
	return out
}

// report attaches a Reporter with the options to a, logging into a new
// logBuffer, and closes it when the test ends.
func report(t *testing.T, a *allocator.Allocator, opt Options) (*Reporter, *logBuffer) {
	t.Helper()
	lb := &logBuffer{}
	rep, err := New(a, lb.logger(), opt)
	require.NoError(t, err)
	t.Cleanup(rep.Close)
	return rep, lb
}

func TestLinesEveryNSteps(t *testing.T) {
	a := newAllocator(t, 0, allocator.Config{})
	rep, lb := report(t, a, Options{Every: 2, NoPeaks: true})

	var kept []device.Ptr
	for i := range 5 {
		rep.Step("step" + strconv.Itoa(i))
		a.SetPhase("forward")
		kept = append(kept, alloc(t, a, 4*mib))
		recs := lb.records(t)
		if (i+1)%2 != 0 {
			assert.Empty(t, recs, "boundary %d", i+1)
			continue
		}
		require.Len(t, recs, 1, "boundary %d", i+1)
		r := recs[0]
		assert.Equal(t, "gpu memory", r["msg"])
		assert.Equal(t, "INFO", r["level"])
		assert.Equal(t, "step"+strconv.Itoa(i), r["step"])
		assert.EqualValues(t, i+1, num(r, "steps"))
		// The phase current at the boundary: the one set in the step before.
		assert.Equal(t, "forward", r["phase"])
		assert.EqualValues(t, 0, num(r, "device"))
		st := a.Stats()
		assert.Equal(t, st.Allocated()-4*mib, memory(r, "allocated"), "read when the line is written, before this step's allocation")
		assert.Equal(t, st.Reserved(), memory(r, "reserved"))
		assert.Contains(t, r["line"], "allocated ")
	}
	free(t, a, kept...)
}

func TestLineSkippedWhenNotFlushed(t *testing.T) {
	a := newAllocator(t, 0, allocator.Config{})
	rep, lb := report(t, a, Options{Every: 1, NoPeaks: true})
	for i := range 3 {
		a.MarkStep(strconv.Itoa(i)) // the allocator's own: nothing logged yet
	}
	assert.Empty(t, lb.records(t))
	rep.Flush()
	recs := lb.records(t)
	require.Len(t, recs, 1)
	assert.Equal(t, "2", recs[0]["step"])
	assert.EqualValues(t, 3, num(recs[0], "steps"))
	assert.EqualValues(t, 2, num(recs[0], "skipped"))
}

func TestPeakPhaseAndStep(t *testing.T) {
	a := newAllocator(t, 0, allocator.Config{})
	rep, lb := report(t, a, Options{Every: -1})

	rep.Step("0")
	assert.Empty(t, lb.records(t), "no memory yet, no peak")
	a.SetPhase("forward")
	act := alloc(t, a, 30*mib)
	a.SetPhase("backward")
	grad := alloc(t, a, 30*mib) // the peak: 60 MiB, in backward
	free(t, a, act)
	a.SetPhase("optimizer")
	free(t, a, grad)
	rep.Step("1")

	recs := byMsg(lb.records(t), "gpu memory peak")
	require.Len(t, recs, 2)
	st := a.Stats()
	al, re := recs[0], recs[1]
	assert.Equal(t, AllocatedPeakKey, al["stat"])
	assert.Equal(t, st.MaxAllocated(), num(al, "peak"))
	assert.EqualValues(t, 60*mib, num(al, "peak"))
	assert.Equal(t, "backward", al["phase"])
	assert.Equal(t, "0", al["step"])
	assert.Equal(t, st.MaxAllocated(), memory(al, "max_allocated"))

	assert.Equal(t, ReservedPeakKey, re["stat"])
	assert.Equal(t, st.MaxReserved(), num(re, "peak"))
	assert.Equal(t, "backward", re["phase"], "the second segment was obtained in backward")

	// The same step again: nothing new.
	rep.Step("2")
	assert.Empty(t, lb.records(t))
}

func TestPeakAtMostOncePerStep(t *testing.T) {
	a := newAllocator(t, 0, allocator.Config{})
	rep, lb := report(t, a, Options{Every: -1, PeakGrowth: -1})

	rep.Step("0")
	p1 := alloc(t, a, 30*mib)
	rep.Flush()
	recs := byMsg(lb.records(t), "gpu memory peak")
	require.Len(t, recs, 2, "allocated and reserved")
	assert.EqualValues(t, 30*mib, num(recs[0], "peak"))

	a.SetPhase("later")
	p2 := alloc(t, a, 30*mib)
	rep.Flush()
	assert.Empty(t, lb.records(t), "one peak record per step: this one waits for the next boundary")
	p3 := alloc(t, a, 30*mib)
	a.SetPhase("after")
	rep.Step("1")
	recs = byMsg(lb.records(t), "gpu memory peak")
	require.Len(t, recs, 2)
	assert.EqualValues(t, 90*mib, num(recs[0], "peak"), "the highest reached meanwhile")
	assert.Equal(t, "later", recs[0]["phase"])
	assert.Equal(t, "0", recs[0]["step"])

	p4 := alloc(t, a, 30*mib)
	rep.Close()
	recs = byMsg(lb.records(t), "gpu memory peak")
	require.Len(t, recs, 2, "Close reports the peak still waiting")
	assert.EqualValues(t, 120*mib, num(recs[0], "peak"))
	assert.Equal(t, "1", recs[0]["step"])
	free(t, a, p1, p2, p3, p4)
}

func TestPeakGrowth(t *testing.T) {
	a := newAllocator(t, 0, allocator.Config{})
	rep, lb := report(t, a, Options{Every: -1, PeakGrowth: 0.10})

	base := alloc(t, a, 100*mib)
	rep.Step("0")
	require.Len(t, byMsg(lb.records(t), "gpu memory peak"), 2)

	// 4 MiB: 4% more allocated, below the 10% growth; reserved grows by a
	// 20 MiB segment, 20%.
	small := alloc(t, a, 4*mib)
	rep.Step("1")
	recs := byMsg(lb.records(t), "gpu memory peak")
	require.Len(t, recs, 1)
	assert.Equal(t, ReservedPeakKey, recs[0]["stat"])
	assert.EqualValues(t, 120*mib, num(recs[0], "peak"))

	more := alloc(t, a, 8*mib) // 12% above the logged peak in all, from the cached segment
	rep.Step("2")
	recs = byMsg(lb.records(t), "gpu memory peak")
	require.Len(t, recs, 1)
	assert.Equal(t, AllocatedPeakKey, recs[0]["stat"])
	assert.EqualValues(t, 112*mib, num(recs[0], "peak"))
	free(t, a, base, small, more)
}

func TestDefaults(t *testing.T) {
	a := newAllocator(t, 0, allocator.Config{})
	var lb logBuffer
	rep, err := New(a, lb.logger(), Options{})
	require.NoError(t, err)
	assert.EqualValues(t, DefaultEvery, rep.every)
	assert.Equal(t, DefaultPeakGrowth, rep.growth)
	for i := range DefaultEvery {
		rep.Step(strconv.Itoa(i))
	}
	recs := lb.records(t)
	require.Len(t, recs, 1)
	assert.Equal(t, "gpu memory", recs[0]["msg"])
	assert.Equal(t, strconv.Itoa(DefaultEvery-1), recs[0]["step"])
	rep.Close()
}

func TestLevel(t *testing.T) {
	a := newAllocator(t, 0, allocator.Config{})
	var lb logBuffer
	rep, err := New(a, lb.logger(), Options{Every: 1, Level: slog.LevelDebug})
	require.NoError(t, err)
	p := alloc(t, a, mib)
	rep.Step("0")
	recs := lb.records(t)
	require.Len(t, recs, 3)
	for _, r := range recs {
		assert.Equal(t, "DEBUG", r["level"])
	}
	rep.Close()
	free(t, a, p)

	// A logger that discards the level logs nothing, and the reporter still
	// counts.
	quiet := slog.New(slog.NewJSONHandler(&lb, &slog.HandlerOptions{Level: slog.LevelInfo}))
	rep, err = New(a, quiet, Options{Every: 1, Level: slog.LevelDebug})
	require.NoError(t, err)
	rep.Step("1")
	rep.Close()
	assert.Empty(t, lb.records(t))
}

func TestOutOfMemory(t *testing.T) {
	a := newAllocator(t, 64*mib, allocator.Config{})
	rep, lb := report(t, a, Options{Every: -1})

	rep.Step("0")
	a.SetPhase("load")
	w := alloc(t, a, 40*mib)
	rep.Flush() // the 40 MiB peak is logged in this step
	require.Len(t, lb.records(t), 2)
	a.SetPhase("forward")
	x := alloc(t, a, 10*mib) // a new peak, held back in this step
	_, err := a.Alloc(30*mib, device.DefaultStream)
	var oom *allocator.OutOfMemoryError
	require.ErrorAs(t, err, &oom)

	recs := lb.records(t)
	require.Len(t, recs, 3, "the peaks that led to the error, then the error")
	for i, key := range []string{AllocatedPeakKey, ReservedPeakKey} {
		assert.Equal(t, "gpu memory peak", recs[i]["msg"])
		assert.Equal(t, key, recs[i]["stat"])
		assert.EqualValues(t, 50*mib, num(recs[i], "peak"))
		assert.Equal(t, "forward", recs[i]["phase"])
	}
	r := recs[2]
	assert.Equal(t, "gpu out of memory", r["msg"])
	assert.Equal(t, "ERROR", r["level"])
	assert.Equal(t, "forward", r["phase"])
	assert.EqualValues(t, 30*mib, num(r, "requested"))
	assert.EqualValues(t, 50*mib, memory(r, "allocated"))
	free(t, a, w, x)
}

func TestCloseDetaches(t *testing.T) {
	a := newAllocator(t, 0, allocator.Config{})
	var lb logBuffer
	rep, err := New(a, lb.logger(), Options{Every: 1})
	require.NoError(t, err)
	rep.Close()
	rep.Close() // twice is fine
	assert.Empty(t, lb.records(t))

	p := alloc(t, a, 8*mib)
	rep.Step("0")
	assert.Empty(t, lb.records(t), "a closed reporter counts and logs nothing")
	free(t, a, p)
}

// The reporter started on an allocator already in use begins from its
// stats.
func TestStartsFromStats(t *testing.T) {
	a := newAllocator(t, 0, allocator.Config{})
	before := alloc(t, a, 50*mib)
	free(t, a, before)
	kept := alloc(t, a, 10*mib)
	a.SetPhase("serve")

	rep, lb := report(t, a, Options{Every: -1, PeakGrowth: -1})
	rep.Step("0")
	assert.Empty(t, lb.records(t), "the 50 MiB peak was reached before the reporter started")

	more := alloc(t, a, 45*mib) // a 46 MiB block: 56 MiB allocated, a new high
	rep.Step("1")
	recs := byMsg(lb.records(t), "gpu memory peak")
	require.NotEmpty(t, recs)
	assert.Equal(t, AllocatedPeakKey, recs[0]["stat"])
	assert.EqualValues(t, 56*mib, num(recs[0], "peak"))
	assert.Equal(t, a.Stats().MaxAllocated(), num(recs[0], "peak"))
	assert.Equal(t, "serve", recs[0]["phase"])
	free(t, a, kept, more)
}

// With expandable segments reserved memory grows by mapped pages.
func TestExpandableReservedPeak(t *testing.T) {
	a := newAllocator(t, 0, allocator.Config{ExpandableSegments: true})
	rep, lb := report(t, a, Options{Every: -1, PeakGrowth: -1})
	a.SetPhase("grow")
	var ps []device.Ptr
	for range 4 {
		ps = append(ps, alloc(t, a, 6*mib))
	}
	free(t, a, ps...)
	require.NoError(t, a.EmptyCache())
	rep.Step("0")
	recs := byMsg(lb.records(t), "gpu memory peak")
	require.Len(t, recs, 2)
	st := a.Stats()
	assert.Equal(t, st.MaxReserved(), num(recs[1], "peak"))
	assert.Equal(t, "grow", recs[1]["phase"])
	assert.Zero(t, st.Reserved())
	assert.Zero(t, rep.reserved, "unmapping followed")
}

// lockProbe is a handler that reads the allocator while handling a
// record: were records handled under the allocator's locks, it would
// deadlock.
type lockProbe struct {
	slog.Handler
	a     *allocator.Allocator
	count *int
}

func (h lockProbe) Handle(ctx context.Context, r slog.Record) error {
	_ = h.a.Stats()
	*h.count++
	return h.Handler.Handle(ctx, r)
}

func TestLogsOutsideTheLock(t *testing.T) {
	a := newAllocator(t, 64*mib, allocator.Config{})
	var lb logBuffer
	n := 0
	logger := slog.New(lockProbe{Handler: slog.NewJSONHandler(&lb, nil), a: a, count: &n})
	rep, err := New(a, logger, Options{Every: 1, PeakGrowth: -1})
	require.NoError(t, err)
	p := alloc(t, a, 20*mib)
	rep.Step("0")
	_, err = a.Alloc(60*mib, device.DefaultStream)
	require.True(t, errors.Is(err, device.ErrOutOfMemory))
	free(t, a, p)
	rep.Close()
	assert.Equal(t, 4, n, "line, two peaks, out of memory")
}

func TestConcurrentUse(t *testing.T) {
	a := newAllocator(t, 0, allocator.Config{})
	var lb logBuffer
	rep, err := New(a, lb.logger(), Options{Every: 3, PeakGrowth: -1})
	require.NoError(t, err)
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := range 50 {
				p, err := a.Alloc(uint64(1+g+i%7)*mib, device.DefaultStream)
				assert.NoError(t, err)
				if i%5 == 0 {
					rep.Step(strconv.Itoa(g*100 + i))
				} else {
					rep.Flush()
				}
				assert.NoError(t, a.Free(p))
			}
		})
	}
	wg.Wait()
	rep.Close()
	st := a.Stats()
	assert.Equal(t, st.Allocated(), rep.allocated)
	assert.Equal(t, st.Reserved(), rep.reserved)
	assert.Equal(t, st.MaxAllocated(), rep.peak[allocatedPeak].value)
	assert.Equal(t, st.MaxReserved(), rep.peak[reservedPeak].value)
	assert.NotEmpty(t, lb.records(t))
}

func TestNewErrors(t *testing.T) {
	_, err := New(nil, nil, Options{})
	assert.Error(t, err)
	a := newAllocator(t, 0, allocator.Config{})
	for _, g := range []float64{math.NaN(), math.Inf(1), math.Inf(-1)} {
		_, err = New(a, nil, Options{PeakGrowth: g})
		assert.Error(t, err, "PeakGrowth %v", g)
	}
	rep, err := New(a, nil, Options{}) // slog.Default()
	require.NoError(t, err)
	rep.Close()
}
