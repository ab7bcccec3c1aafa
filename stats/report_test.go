// This file tests FormatSize, Line and the slog value.

package stats

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestFormatSize(t *testing.T) {
	for _, tc := range []struct {
		n    uint64
		want string
	}{
		{0, "0 bytes"},
		{1, "1 bytes"}, // c10 does not singularize
		{1023, "1023 bytes"},
		{1024, "1024 bytes"}, // thresholds are <=
		{1025, "1.00 KiB"},
		{1152, "1.12 KiB"}, // 1.125 is a tie; printf rounds half to even
		{1536, "1.50 KiB"},
		{1048575, "1024.00 KiB"}, // 1023.999 rounds up
		{1048576, "1024.00 KiB"},
		{1048577, "1.00 MiB"},
		{1572864, "1.50 MiB"},
		{1 << 30, "1024.00 MiB"},
		{1<<30 + 1, "1.00 GiB"},
		{1610612736, "1.50 GiB"},
		{1 << 40, "1024.00 GiB"}, // GiB is the largest unit
		{math.MaxUint64, "17179869184.00 GiB"},
	} {
		assert.Equal(t, tc.want, FormatSize(tc.n), "FormatSize(%d)", tc.n)
	}
}

func TestLine(t *testing.T) {
	var d DeviceStats
	d.AllocatedBytes.Increase(LargePool, 2<<30)
	d.AllocatedBytes.Decrease(LargePool, 512<<20)
	d.ReservedBytes.Increase(LargePool, 2560<<20)
	assert.Equal(t, "allocated 1.50 GiB (peak 2.00 GiB) | reserved 2.50 GiB (peak 2.50 GiB)", Line(&d))

	assert.Equal(t, "allocated 0 bytes (peak 0 bytes) | reserved 0 bytes (peak 0 bytes)", Line(nil))

	var odd DeviceStats
	odd.AllocatedBytes[All].Current = -1536
	odd.AllocatedBytes[All].Peak = math.MinInt64
	odd.ReservedBytes[All].Current = 1024
	odd.ReservedBytes[All].Peak = math.MaxInt64
	assert.Equal(t, "allocated -1.50 KiB (peak -8589934592.00 GiB) | reserved 1024 bytes (peak 8589934592.00 GiB)", Line(&odd))
}

func TestLogValue(t *testing.T) {
	var d DeviceStats
	d.AllocatedBytes.Increase(SmallPool, 3<<20)
	d.AllocatedBytes.Decrease(SmallPool, 1<<20)
	d.ReservedBytes.Increase(SmallPool, 4<<20)

	var _ slog.LogValuer = d
	v := d.LogValue()
	require.Equal(t, slog.KindGroup, v.Kind())
	got := map[string]int64{}
	for _, a := range v.Group() {
		got[a.Key] = a.Value.Int64()
	}
	assert.Equal(t, map[string]int64{
		"allocated":     2 << 20,
		"reserved":      4 << 20,
		"max_allocated": 3 << 20,
		"max_reserved":  4 << 20,
	}, got)

	// Through a handler: the group is resolved and nested under its key.
	var buf bytes.Buffer
	slog.New(slog.NewJSONHandler(&buf, nil)).Info("step", "gpu", d)
	var rec struct {
		GPU map[string]int64 `json:"gpu"`
	}
	require.NoError(t, json.Unmarshal(buf.Bytes(), &rec))
	assert.Equal(t, got, rec.GPU)
}
