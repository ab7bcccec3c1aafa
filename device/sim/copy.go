// The copy capability: device memory contents, kept sparsely, and the
// copies between them and host memory.

package sim

import (
	"time"

	"github.com/gpumem/gpumem/device"
)

// contentPage is the unit in which the device keeps contents: only the
// pages ever written hold bytes, so a large device costs host memory in
// proportion to what was copied to it, not to its capacity.
const contentPage = 4096

// contents maps a content page's index (address / contentPage) to its
// bytes. A page that is absent reads as zeros. Guarded by Device.mu.
type contents map[uint64]*[contentPage]byte

// dropLocked forgets the contents of [lo, hi): whole pages are deleted,
// the covered part of a page at either edge is zeroed. It visits the map
// when that is smaller than the range, so freeing a large range whose
// pages were never written costs nothing.
func (d *Device) dropLocked(lo, hi uint64) {
	if len(d.content) == 0 || lo >= hi {
		return
	}
	first, last := lo/contentPage, (hi-1)/contentPage
	zero := func(k uint64) {
		pg, ok := d.content[k]
		if !ok {
			return
		}
		base := k * contentPage
		from, to := max(lo, base)-base, min(hi, base+contentPage)-base
		if from == 0 && to == contentPage {
			delete(d.content, k)
			return
		}
		clear(pg[from:to])
	}
	if uint64(len(d.content)) < last-first+1 {
		for k := range d.content {
			if k >= first && k <= last {
				zero(k)
			}
		}
		return
	}
	for k := first; k <= last; k++ {
		zero(k)
	}
}

// copyRangeLocked checks that [p, p+n) lies inside memory the device
// handed out and backs now: one live Malloc allocation (its requested
// bytes), mapped pages of one reservation, or one live block of the
// stream-ordered pool. It scans the live allocations; copies are rare
// (a pool's backup and restore), so it keeps no index for them.
func (d *Device) copyRangeLocked(op string, p device.Ptr, n uint64) error {
	lo := uint64(p)
	hi := lo + n
	if hi < lo {
		return d.fail(op, device.ErrInvalidArgument, "range %v+%d overflows", p, n)
	}
	if p == 0 {
		return d.fail(op, device.ErrInvalidPointer, "null pointer")
	}
	for _, r := range d.live {
		if lo >= uint64(r.Ptr) && hi <= uint64(r.Ptr)+r.Size {
			return nil
		}
	}
	if d.poolCoversLocked(lo, hi) {
		return nil
	}
	if r, err := d.rangeLocked(op, device.Ptr(lo&^(d.page-1)), ((hi+d.page-1)&^(d.page-1))-(lo&^(d.page-1))); err == nil {
		if r.covers(lo, hi) {
			return nil
		}
		return d.fail(op, device.ErrInvalidPointer, "range %v+%d has pages that are not mapped", p, n)
	}
	return d.fail(op, device.ErrInvalidPointer, "range %v+%d is not inside memory the device handed out", p, n)
}

// covers reports whether [lo, hi) lies in one mapped range of r.
func (r *reservation) covers(lo, hi uint64) bool {
	for _, m := range r.mapped {
		if lo >= m[0] && hi <= m[1] {
			return true
		}
	}
	return false
}

// CopyToHost copies len(dst) bytes from device address src into dst
// (device.Copier, cuMemcpyDtoH). Bytes never written read as zeros. The
// range must lie inside one live allocation, mapped range or pool block;
// otherwise it fails with device.ErrInvalidPointer (device.ErrInvalidArgument
// for a range that overflows) and copies nothing. An empty dst copies
// nothing and succeeds. It costs Costs.Copy plus Costs.CopyPerGiB pro rata.
func (d *Device) CopyToHost(dst []byte, src device.Ptr) error {
	const op = "copy to host"
	d.mu.Lock()
	t, err := d.copyLocked(op, src, uint64(len(dst)), func(k uint64, from, to int, off int) {
		if pg, ok := d.content[k]; ok {
			copy(dst[off:off+to-from], pg[from:to])
		} else {
			clear(dst[off : off+to-from])
		}
	})
	d.mu.Unlock()
	nap(t)
	return err
}

// CopyFromHost copies src to device memory starting at dst
// (device.Copier, cuMemcpyHtoD), under CopyToHost's rules. Writing only
// zeros to a page that holds nothing stores nothing.
func (d *Device) CopyFromHost(dst device.Ptr, src []byte) error {
	const op = "copy from host"
	d.mu.Lock()
	t, err := d.copyLocked(op, dst, uint64(len(src)), func(k uint64, from, to int, off int) {
		pg, ok := d.content[k]
		if !ok {
			if allZero(src[off : off+to-from]) {
				return
			}
			if d.content == nil {
				d.content = make(contents)
			}
			pg = new([contentPage]byte)
			d.content[k] = pg
		}
		copy(pg[from:to], src[off:off+to-from])
	})
	d.mu.Unlock()
	nap(t)
	return err
}

// copyLocked checks the range, charges the cost and calls page on each
// content page the range covers: its index, the covered part [from, to)
// and the offset of that part in the host buffer.
func (d *Device) copyLocked(op string, p device.Ptr, n uint64, page func(k uint64, from, to, off int)) (time.Duration, error) {
	t := d.payLocked(d.costs.copy(n))
	if n == 0 {
		d.c.Copies++
		return t, nil
	}
	if err := d.copyRangeLocked(op, p, n); err != nil {
		d.c.FailedCopies++
		return t, err
	}
	lo, hi := uint64(p), uint64(p)+n
	for a := lo; a < hi; {
		k := a / contentPage
		base := k * contentPage
		end := min(hi, base+contentPage)
		page(k, int(a-base), int(end-base), int(a-lo))
		a = end
	}
	d.c.Copies++
	d.c.CopiedBytes += n
	return t, nil
}

func allZero(b []byte) bool {
	for _, x := range b {
		if x != 0 {
			return false
		}
	}
	return true
}

// ContentPages returns how many pages of contentPage bytes the device
// keeps contents for: what copies to it cost in host memory.
func (d *Device) ContentPages() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.content)
}
