// This file holds Manager, which keeps one Allocator per device.

package allocator

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/stats"
)

// MaxDevices is the number of device ordinals a Manager can hold.
const MaxDevices = 64

// Manager holds one Allocator per device ordinal, all with one
// configuration, created the first time an ordinal is used. Every call
// names its device explicitly: there is no hidden "current device", so a
// tensor never lands on device 0 because someone forgot to switch. It is
// safe for concurrent use; looking up an existing allocator takes no lock.
type Manager struct {
	open func(ordinal int) (device.Device, error)
	cfg  Config
	// count is the number of devices, ordinals 0 to count-1, for a
	// Manager made by NewManagerCount; 0 when not known (NewManager).
	count int

	mu     sync.Mutex // serializes creation
	allocs [MaxDevices]atomic.Pointer[Allocator]
}

// NewManager returns a Manager that opens device ordinal o with open(o)
// when o is first used, and gives it an Allocator with cfg.
func NewManager(open func(ordinal int) (device.Device, error), cfg Config) (*Manager, error) {
	if open == nil {
		return nil, errors.New("allocator: NewManager: nil open function")
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	return &Manager{open: open, cfg: cfg}, nil
}

// NewManagerCount is NewManager for a machine of count devices, ordinals
// 0 to count-1 (for example cuda.DeviceCount's): Devices lists them all,
// opened or not, and an ordinal outside them is refused without calling
// open.
func NewManagerCount(count int, open func(ordinal int) (device.Device, error), cfg Config) (*Manager, error) {
	if count < 1 || count > MaxDevices {
		return nil, fmt.Errorf("allocator: NewManagerCount: %d devices, want 1 to %d: %w", count, MaxDevices, device.ErrInvalidArgument)
	}
	m, err := NewManager(open, cfg)
	if err != nil {
		return nil, err
	}
	m.count = count
	return m, nil
}

// limit returns one more than the largest ordinal the Manager takes.
func (m *Manager) limit() int {
	if m.count > 0 {
		return m.count
	}
	return MaxDevices
}

// ordinalError is the error of an ordinal out of range, or nil.
func (m *Manager) ordinalError(ordinal int) error {
	if ordinal < 0 || ordinal >= m.limit() {
		return fmt.Errorf("allocator: device ordinal %d out of range 0..%d: %w", ordinal, m.limit()-1, device.ErrInvalidArgument)
	}
	return nil
}

// Allocator returns the allocator of device ordinal, creating it (and
// opening the device) on first use.
func (m *Manager) Allocator(ordinal int) (*Allocator, error) {
	if err := m.ordinalError(ordinal); err != nil {
		return nil, err
	}
	if a := m.allocs[ordinal].Load(); a != nil {
		return a, nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if a := m.allocs[ordinal].Load(); a != nil {
		return a, nil
	}
	dev, err := m.open(ordinal)
	if err != nil {
		return nil, fmt.Errorf("allocator: opening device %d: %w", ordinal, err)
	}
	if dev == nil {
		return nil, fmt.Errorf("allocator: opening device %d: no device", ordinal)
	}
	if dev.Ordinal() != ordinal {
		return nil, fmt.Errorf("allocator: opening device %d gave device %d", ordinal, dev.Ordinal())
	}
	a, err := New(dev, m.cfg)
	if err != nil {
		return nil, err
	}
	m.allocs[ordinal].Store(a)
	return a, nil
}

// Alloc allocates size bytes on device ordinal for stream s.
func (m *Manager) Alloc(ordinal int, size uint64, s device.Stream) (device.Ptr, error) {
	a, err := m.Allocator(ordinal)
	if err != nil {
		return 0, err
	}
	return a.Alloc(size, s)
}

// Free frees a block of device ordinal.
func (m *Manager) Free(ordinal int, p device.Ptr) error {
	a, err := m.existing(ordinal)
	if err != nil {
		return err
	}
	return a.Free(p)
}

// RecordStream records a block of device ordinal as used on stream s.
func (m *Manager) RecordStream(ordinal int, p device.Ptr, s device.Stream) error {
	a, err := m.existing(ordinal)
	if err != nil {
		return err
	}
	return a.RecordStream(p, s)
}

// existing returns the allocator of a device already in use: freeing on a
// device never allocated from is an error, not a reason to open it.
func (m *Manager) existing(ordinal int) (*Allocator, error) {
	if err := m.ordinalError(ordinal); err != nil {
		return nil, err
	}
	a := m.allocs[ordinal].Load()
	if a == nil {
		return nil, fmt.Errorf("allocator: device %d has no allocations: %w", ordinal, device.ErrInvalidPointer)
	}
	return a, nil
}

// Devices returns the ordinals of the devices the Manager can open, in
// increasing order: 0 to count-1 for a Manager made by NewManagerCount,
// opened or not. A Manager made by NewManager cannot know how many devices
// exist, so it lists those opened so far (Opened).
func (m *Manager) Devices() []int {
	if m.count == 0 {
		return m.Opened()
	}
	out := make([]int, m.count)
	for i := range out {
		out[i] = i
	}
	return out
}

// Opened returns the ordinals of the devices opened so far (in use), in
// increasing order.
func (m *Manager) Opened() []int {
	var out []int
	for i := range m.allocs {
		if m.allocs[i].Load() != nil {
			out = append(out, i)
		}
	}
	return out
}

// EmptyCache empties the cache of every device in use.
func (m *Manager) EmptyCache() error {
	var errs []error
	for _, o := range m.Opened() {
		if err := m.allocs[o].Load().EmptyCache(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Stats returns the stats of device ordinal (zero stats for a device not
// in use).
func (m *Manager) Stats(ordinal int) stats.DeviceStats {
	if ordinal >= 0 && ordinal < MaxDevices {
		if a := m.allocs[ordinal].Load(); a != nil {
			return a.Stats()
		}
	}
	return stats.DeviceStats{MaxSplitSize: m.statsMaxSplit()}
}

func (m *Manager) statsMaxSplit() int64 {
	if m.cfg.MaxSplitSize == 0 {
		return -1
	}
	return int64(m.cfg.MaxSplitSize)
}

// TotalStats returns the stats of all devices added together: current
// values, cumulative sums and counters are exact totals; each peak is the
// sum of the devices' peaks, which bounds the true peak of the total from
// above (the devices may have peaked at different times).
func (m *Manager) TotalStats() stats.DeviceStats {
	total := stats.DeviceStats{MaxSplitSize: m.statsMaxSplit()}
	for _, o := range m.Opened() {
		st := m.allocs[o].Load().Stats()
		total.Add(&st)
	}
	return total
}

// Summary returns the memory summary table of device ordinal.
func (m *Manager) Summary(ordinal int, abbreviated bool) (string, error) {
	a, err := m.existing(ordinal)
	if err != nil {
		return "", err
	}
	return a.Summary(abbreviated), nil
}

// Summary returns PyTorch's memory_summary table for this allocator,
// followed, once the caller has named phases (SetPhase), by the memory of
// each phase, and once allocations grow at every step (MarkStep, Leaks),
// by the possible leaks.
func (a *Allocator) Summary(abbreviated bool) string {
	if !a.made() {
		return errNotMade.Error()
	}
	st := a.Stats()
	opt := stats.SummaryOptions{Device: a.ordinal, Name: a.dev.Name(), Abbreviated: abbreviated}
	if phases := a.PhaseStats(); len(phases) > 1 || len(phases) == 1 && phases[0].Name != "" {
		opt.Phases = phases
	}
	opt.Leaks = a.Leaks()
	return stats.Summary(&st, opt)
}
