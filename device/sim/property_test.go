// Property test: random Malloc/Free/Reserve/Map/Unmap/Release sequences
// against a naive reference model of the address rule and the charges.

package sim

import (
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/gpumem/gpumem/device"
)

// refModel is the reference: live ranges in sorted slices, first fit by a
// scan of the gaps from the region's base, mapping as a set of pages.
type refModel struct {
	page, capacity  uint64
	memBase, vmBase uint64
	live            [][2]uint64 // start, charged bytes; sorted
	resv            [][2]uint64 // base, size; sorted
	mapped          map[uint64]bool
}

// firstFit returns the lowest start >= base of a gap of size bytes among
// the sorted ranges.
func firstFit(ranges [][2]uint64, base, size uint64) uint64 {
	at := base
	for _, r := range ranges {
		if r[0]-at >= size {
			return at
		}
		at = r[0] + r[1]
	}
	return at
}

func insertSorted(rs [][2]uint64, r [2]uint64) [][2]uint64 {
	i, _ := slices.BinarySearchFunc(rs, r[0], func(x [2]uint64, a uint64) int { return cmpU64(x[0], a) })
	return slices.Insert(rs, i, r)
}

func (m *refModel) used() uint64 {
	var n uint64
	for _, r := range m.live {
		n += r[1]
	}
	return n + uint64(len(m.mapped))*m.page
}

func TestDeviceAgainstReferenceModel(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		const page = 4096
		capacity := rapid.Uint64Range(4, 48).Draw(t, "capacity pages") * page
		d, err := New(Config{Capacity: capacity, PageSize: page, Costs: NoCosts()})
		require.NoError(t, err)
		ref := &refModel{page: page, capacity: capacity,
			memBase: uint64(d.MemoryBase()), vmBase: uint64(d.MemoryBase()) + MemoryRegionSize,
			mapped: map[uint64]bool{}}

		// pickRange draws a page-aligned range inside a reservation.
		pickRange := func(t *rapid.T) (uint64, uint64, bool) {
			if len(ref.resv) == 0 {
				return 0, 0, false
			}
			r := ref.resv[rapid.IntRange(0, len(ref.resv)-1).Draw(t, "reservation")]
			pages := r[1] / page
			first := rapid.Uint64Range(0, pages-1).Draw(t, "first page")
			n := rapid.Uint64Range(1, pages-first).Draw(t, "pages")
			return r[0] + first*page, n * page, true
		}

		t.Repeat(map[string]func(*rapid.T){
			"malloc": func(t *rapid.T) {
				size := rapid.OneOf(
					rapid.Uint64Range(1, 2*page),
					rapid.Uint64Range(1, 12*page),
				).Draw(t, "size")
				pages := (size + page - 1) / page * page
				p, err := d.Malloc(size)
				if pages > capacity-ref.used() {
					require.ErrorIs(t, err, device.ErrOutOfMemory)
					return
				}
				require.NoError(t, err)
				want := firstFit(ref.live, ref.memBase, pages)
				require.Equal(t, device.Ptr(want), p, "first fit")
				ref.live = insertSorted(ref.live, [2]uint64{want, pages})
			},
			"free": func(t *rapid.T) {
				if len(ref.live) == 0 || rapid.IntRange(0, 9).Draw(t, "bad") == 0 {
					bad := device.Ptr(ref.memBase + rapid.Uint64Range(0, 64*page).Draw(t, "bad ptr"))
					if _, ok := slices.BinarySearchFunc(ref.live, uint64(bad), func(x [2]uint64, a uint64) int { return cmpU64(x[0], a) }); !ok {
						require.ErrorIs(t, d.Free(bad), device.ErrInvalidPointer)
					}
					return
				}
				i := rapid.IntRange(0, len(ref.live)-1).Draw(t, "i")
				require.NoError(t, d.Free(device.Ptr(ref.live[i][0])))
				ref.live = slices.Delete(ref.live, i, i+1)
			},
			"reserve": func(t *rapid.T) {
				size := rapid.Uint64Range(1, 16).Draw(t, "reserve pages") * page
				p, err := d.Reserve(size)
				require.NoError(t, err)
				want := firstFit(ref.resv, ref.vmBase, size)
				require.Equal(t, device.Ptr(want), p, "reservations are first fit too")
				ref.resv = insertSorted(ref.resv, [2]uint64{want, size})
			},
			"release": func(t *rapid.T) {
				if len(ref.resv) == 0 {
					t.Skip("no reservation")
				}
				i := rapid.IntRange(0, len(ref.resv)-1).Draw(t, "i")
				r := ref.resv[i]
				anyMapped := false
				for a := r[0]; a < r[0]+r[1]; a += page {
					anyMapped = anyMapped || ref.mapped[a]
				}
				err := d.Release(device.Ptr(r[0]))
				if anyMapped {
					require.ErrorIs(t, err, device.ErrInvalidArgument)
					return
				}
				require.NoError(t, err)
				ref.resv = slices.Delete(ref.resv, i, i+1)
			},
			"map": func(t *rapid.T) {
				p, size, ok := pickRange(t)
				if !ok {
					t.Skip("no reservation")
				}
				overlap := false
				for a := p; a < p+size; a += page {
					overlap = overlap || ref.mapped[a]
				}
				err := d.Map(device.Ptr(p), size)
				switch {
				case overlap:
					require.ErrorIs(t, err, device.ErrInvalidArgument)
				case size > capacity-ref.used():
					require.ErrorIs(t, err, device.ErrOutOfMemory)
				default:
					require.NoError(t, err)
					for a := p; a < p+size; a += page {
						ref.mapped[a] = true
					}
				}
			},
			"unmap": func(t *rapid.T) {
				p, size, ok := pickRange(t)
				if !ok {
					t.Skip("no reservation")
				}
				all := true
				for a := p; a < p+size; a += page {
					all = all && ref.mapped[a]
				}
				err := d.Unmap(device.Ptr(p), size)
				if !all {
					require.ErrorIs(t, err, device.ErrInvalidArgument)
					return
				}
				require.NoError(t, err)
				for a := p; a < p+size; a += page {
					delete(ref.mapped, a)
				}
			},
			"": func(t *rapid.T) {
				allocs := d.Allocations()
				require.Len(t, allocs, len(ref.live))
				var sum uint64
				for i, r := range allocs {
					require.Equal(t, device.Ptr(ref.live[i][0]), r.Ptr)
					require.Equal(t, ref.live[i][1], r.Pages)
					require.Zero(t, uint64(r.Ptr)%page, "page aligned")
					require.Equal(t, (r.Size+page-1)/page*page, r.Pages)
					if i > 0 {
						require.LessOrEqual(t, allocs[i-1].End(), r.Ptr, "live ranges never overlap")
					}
					sum += r.Pages
				}
				resv := d.Reservations()
				require.Len(t, resv, len(ref.resv))
				mappedPages := []uint64{}
				for i, r := range resv {
					require.Equal(t, device.Ptr(ref.resv[i][0]), r.Ptr)
					require.Equal(t, ref.resv[i][1], r.Size)
					var inside uint64
					for _, m := range d.Mapped(r.Ptr) {
						require.True(t, m.Ptr >= r.Ptr && m.End() <= r.Ptr+device.Ptr(r.Size))
						for a := uint64(m.Ptr); a < uint64(m.End()); a += page {
							mappedPages = append(mappedPages, a)
						}
						inside += m.Size
					}
					require.Equal(t, inside, r.Mapped)
				}
				want := make([]uint64, 0, len(ref.mapped))
				for a := range ref.mapped {
					want = append(want, a)
				}
				slices.Sort(want)
				require.Equal(t, want, mappedPages)

				c := d.Counters()
				require.Equal(t, ref.used(), c.BytesInUse)
				require.Equal(t, sum+c.MappedBytes, c.BytesInUse, "in use = live pages + mapped pages")
				require.GreaterOrEqual(t, c.PeakBytesInUse, c.BytesInUse)
				free, total, err := d.MemInfo()
				require.NoError(t, err)
				require.Equal(t, capacity, total)
				require.Equal(t, capacity-c.BytesInUse, free)
				d.mu.Lock()
				checkSpace(t, &d.mem)
				checkSpace(t, &d.vm)
				d.mu.Unlock()
			},
		})
	})
}
