// This file holds the compact reports: c10's size format, the one-line
// progress report and the slog value.

package stats

import (
	"log/slog"
	"strconv"
)

// FormatSize formats a byte count the way PyTorch's out-of-memory message
// does (c10's format_size): up to 1024 as "N bytes", then KiB up to and
// including 1 MiB, MiB up to and including 1 GiB, and GiB above, each with
// two decimals. So 1024 is "1024 bytes", 1025 is "1.00 KiB" and 1048576 is
// "1024.00 KiB".
func FormatSize(n uint64) string {
	return string(appendSize(nil, n))
}

// appendSize appends FormatSize(n) to buf.
func appendSize(buf []byte, n uint64) []byte {
	var unit string
	var div float64
	switch {
	case n <= 1024:
		buf = strconv.AppendUint(buf, n, 10)
		return append(buf, " bytes"...)
	case n <= 1<<20:
		unit, div = " KiB", 1<<10
	case n <= 1<<30:
		unit, div = " MiB", 1<<20
	default:
		unit, div = " GiB", 1<<30
	}
	buf = strconv.AppendFloat(buf, float64(n)/div, 'f', 2, 64)
	return append(buf, unit...)
}

// appendSignedSize is appendSize for a stat, which a caller may have made
// negative: the magnitude is formatted after a minus sign.
func appendSignedSize(buf []byte, n int64) []byte {
	if n < 0 {
		// The conversion wraps for math.MinInt64 to its true magnitude.
		return appendSize(append(buf, '-'), uint64(-n))
	}
	return appendSize(buf, uint64(n))
}

// Line returns a one-line report of allocated and reserved memory and their
// peaks, for a training loop to print every few steps:
//
//	allocated 1.50 GiB (peak 2.00 GiB) | reserved 2.50 GiB (peak 2.50 GiB)
//
// Sizes are in FormatSize's units. A nil d reports zeros.
func Line(d *DeviceStats) string {
	if d == nil {
		d = new(DeviceStats)
	}
	buf := make([]byte, 0, 80)
	buf = append(buf, "allocated "...)
	buf = appendSignedSize(buf, d.Allocated())
	buf = append(buf, " (peak "...)
	buf = appendSignedSize(buf, d.MaxAllocated())
	buf = append(buf, ") | reserved "...)
	buf = appendSignedSize(buf, d.Reserved())
	buf = append(buf, " (peak "...)
	buf = appendSignedSize(buf, d.MaxReserved())
	buf = append(buf, ')')
	return string(buf)
}

// LogValue makes DeviceStats an slog.LogValuer: logged as an attribute, it
// becomes a group of four byte counts, allocated, reserved, max_allocated
// and max_reserved (PyTorch's memory_allocated, memory_reserved and their
// maxima). Bytes, not formatted sizes, so that log processors can compare
// and sum them; Line is the human form.
//
//	logger.Info("step", "step", 100, "gpu", alloc.Stats())
//	// ... gpu.allocated=1610612736 gpu.reserved=2684354560 ...
func (d DeviceStats) LogValue() slog.Value {
	return slog.GroupValue(
		slog.Int64("allocated", d.Allocated()),
		slog.Int64("reserved", d.Reserved()),
		slog.Int64("max_allocated", d.MaxAllocated()),
		slog.Int64("max_reserved", d.MaxReserved()),
	)
}
