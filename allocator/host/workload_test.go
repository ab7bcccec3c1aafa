//go:build linux

package host

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/internal/simtest"
)

// spaceHost is pinned host memory that is address space alone: slices of
// one inaccessible mapping, handed out once each and never touched, so
// that a workload of many GiB costs no memory. It counts what a device
// counts.
type spaceHost struct {
	mu    sync.Mutex
	space []byte
	next  uint64
	live  map[*byte]uint64
	inUse uint64
}

func newSpaceHost(t testing.TB) *spaceHost {
	t.Helper()
	const size = 1 << 40
	space, err := syscall.Mmap(-1, 0, size, syscall.PROT_NONE, syscall.MAP_PRIVATE|syscall.MAP_ANON|syscall.MAP_NORESERVE)
	if err != nil {
		t.Skipf("no 1 TiB of address space: %v", err)
	}
	t.Cleanup(func() { _ = syscall.Munmap(space) })
	return &spaceHost{space: space, live: make(map[*byte]uint64)}
}

func (h *spaceHost) HostAlloc(n uint64) ([]byte, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.next+n > uint64(len(h.space)) {
		return nil, fmt.Errorf("space host: out of address space: %w", device.ErrOutOfMemory)
	}
	b := h.space[h.next : h.next+n : h.next+n]
	h.next += roundUp(n, pageSize)
	h.live[&b[0]] = n
	h.inUse += n
	return b, nil
}

func (h *spaceHost) HostFree(b []byte) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	n, ok := h.live[&b[0]]
	if !ok {
		return device.ErrInvalidPointer
	}
	delete(h.live, &b[0])
	h.inUse -= n
	return nil
}

// pinnedRun is what a workload cost: the peak of pinned host memory held,
// the peak of bytes requested and live, and the host allocations made.
type pinnedRun struct {
	PeakReserved, PeakRequested uint64
	HostAllocs                  int64
}

// runPinned runs workload on a host allocator configured by cfg over
// address space alone, and checks that Close returns every byte.
func runPinned(t *testing.T, cfg Config, workload pinnedWorkload) pinnedRun {
	t.Helper()
	sim := simtest.New(t)
	h := newSpaceHost(t)
	dev := device.Compose(sim, device.Capabilities{HostMemory: h, StreamChecker: sim})
	a, err := New(dev, cfg)
	require.NoError(t, err)
	copyStream, err := sim.NewStream()
	require.NoError(t, err)
	require.NoError(t, sim.SetStreamBusy(copyStream, true))
	peakReq, err := workload(a, copyStream, func() error { return sim.CompleteStream(copyStream) })
	require.NoError(t, err)
	st := a.Stats()
	require.NoError(t, a.Close())
	assert.Zero(t, h.inUse, "Close returned every host allocation")
	assert.Zero(t, a.Stats().ReservedBytes.Current)
	return pinnedRun{PeakReserved: uint64(st.ReservedBytes.Peak), PeakRequested: peakReq, HostAllocs: st.NumHostAlloc}
}

// A pinnedWorkload pins and frees buffers on a, recording each on the copy
// stream s before its free; copyDone finishes the copies queued so far. It
// returns the peak of bytes requested and live.
type pinnedWorkload func(a *Allocator, s device.Stream, copyDone func() error) (uint64, error)

// live tracks the buffers a workload holds.
type live struct {
	a          *Allocator
	s          device.Stream
	bufs       [][]byte
	bytes, max uint64
}

func (l *live) pin(n uint64) error {
	p, err := l.a.Alloc(n)
	if err != nil {
		return err
	}
	l.bufs = append(l.bufs, p)
	l.bytes += n
	l.max = max(l.max, l.bytes)
	return nil
}

// release frees the k buffers from the from-th, after queueing their copy.
func (l *live) release(from, k int) error {
	for _, p := range l.bufs[from : from+k] {
		if err := l.a.RecordStream(p, l.s); err != nil {
			return err
		}
		if err := l.a.Free(p); err != nil {
			return err
		}
		l.bytes -= uint64(len(p))
	}
	l.bufs = slices.Delete(l.bufs, from, from+k)
	return nil
}

// dataLoader is a vision DataLoader with pin_memory=True and multi-scale
// training: batches of 64 float32 images of 3 x H x W, H and W drawn from
// 224 to 512 in steps of 32, and their int64 labels; 4 workers with a
// prefetch factor of 2 keep 8 batches pinned ahead of the one the training
// loop copies to the device. 400 batches, seeded.
func dataLoader(a *Allocator, s device.Stream, copyDone func() error) (uint64, error) {
	const batch, ahead, batches = 64, 8, 400
	rng := rand.New(rand.NewPCG(23, 2))
	l := &live{a: a, s: s}
	for range batches {
		h, w := uint64(224+32*rng.IntN(10)), uint64(224+32*rng.IntN(10))
		if err := l.pin(batch * 3 * h * w * 4); err != nil {
			return 0, err
		}
		if err := l.pin(batch * 8); err != nil {
			return 0, err
		}
		if len(l.bufs) > 2*ahead {
			if err := l.release(0, 2); err != nil {
				return 0, err
			}
		}
		if err := copyDone(); err != nil {
			return 0, err
		}
	}
	return l.max, l.release(0, len(l.bufs))
}

// llamaOffload is CPU offload of LLaMA-7B (hidden 4096, MLP 11008, 32
// layers, vocabulary 32000) in float16: every weight pinned for the
// host-to-device copies of the forward pass, then, over 3 steps, each
// layer's gradients pinned as the backward pass copies them out (last
// layer first), a layer's freed once the optimizer has consumed them two
// layers later.
func llamaOffload(a *Allocator, s device.Stream, copyDone func() error) (uint64, error) {
	const hidden, inter, layers, vocab, fp16 = 4096, 11008, 32, 32000, 2
	layer := []uint64{
		hidden * hidden * fp16, hidden * hidden * fp16, hidden * hidden * fp16, hidden * hidden * fp16, // q, k, v, o
		hidden * inter * fp16, hidden * inter * fp16, inter * hidden * fp16, // gate, up, down
		hidden * fp16, hidden * fp16, // the two RMS norms
	}
	l := &live{a: a, s: s}
	pinAll := func(sizes ...uint64) error {
		for _, n := range sizes {
			if err := l.pin(n); err != nil {
				return err
			}
		}
		return nil
	}
	if err := pinAll(vocab * hidden * fp16); err != nil { // embedding
		return 0, err
	}
	for range layers {
		if err := pinAll(layer...); err != nil {
			return 0, err
		}
	}
	if err := pinAll(hidden*fp16, vocab*hidden*fp16); err != nil { // final norm, head
		return 0, err
	}
	resident := len(l.bufs)
	for range 3 {
		for range layers {
			if err := pinAll(layer...); err != nil {
				return 0, err
			}
			if len(l.bufs)-resident > 2*len(layer) { // the oldest gradients
				if err := l.release(resident, len(layer)); err != nil {
					return 0, err
				}
			}
			if err := copyDone(); err != nil {
				return 0, err
			}
		}
		if err := l.release(resident, len(l.bufs)-resident); err != nil {
			return 0, err
		}
	}
	return l.max, l.release(0, len(l.bufs))
}

// TestPinnedWorkloads measures the pinned host memory held at peak by
// PyTorch's power-of-two rounding and by RoundEighths on a data loader and
// an offload loop (go test ./allocator/host -run TestPinnedWorkloads -v
// prints the figures).
func TestPinnedWorkloads(t *testing.T) {
	for _, w := range []struct {
		name string
		run  pinnedWorkload
		want [2]uint64 // peak reserved: power of two, eighths
	}{
		{"data loader", dataLoader, [2]uint64{3221230080, 2780828160}},
		{"LLaMA-7B offload", llamaOffload, [2]uint64{19327934464, 14923915264}},
	} {
		pow2 := runPinned(t, Config{}, w.run)
		eighths := runPinned(t, Config{Rounding: RoundEighths}, w.run)
		require.Equal(t, pow2.PeakRequested, eighths.PeakRequested, "the same requests")
		require.Less(t, eighths.PeakReserved, pow2.PeakReserved, w.name)
		saved := pow2.PeakReserved - eighths.PeakReserved
		t.Logf("%s: requested peak %s; reserved peak: power of two %s (%.2fx, %d host allocs), eighths %s (%.2fx, %d host allocs); saved %s (%.1f%%)",
			w.name, gib(pow2.PeakRequested),
			gib(pow2.PeakReserved), float64(pow2.PeakReserved)/float64(pow2.PeakRequested), pow2.HostAllocs,
			gib(eighths.PeakReserved), float64(eighths.PeakReserved)/float64(eighths.PeakRequested), eighths.HostAllocs,
			gib(saved), 100*float64(saved)/float64(pow2.PeakReserved))
		assert.Equal(t, w.want, [2]uint64{pow2.PeakReserved, eighths.PeakReserved}, "%s: the figures of a deterministic workload", w.name)
	}
}

func gib(n uint64) string { return fmt.Sprintf("%.2f GiB", float64(n)/(1<<30)) }
