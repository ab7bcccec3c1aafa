// This file holds the benchmarks of the read paths.

package stats

import (
	"testing"
)

var sinkInt int64

func BenchmarkGet(b *testing.B) {
	d := distinctStats()
	keys := []string{
		"allocated_bytes.all.current",
		"inactive_split_bytes.small_pool.freed",
		"oversize_segments.peak",
		"num_sync_all_streams",
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		v, _ := d.Get(keys[i&3])
		sinkInt += v
		i++
	}
}

func BenchmarkMap(b *testing.B) {
	d := distinctStats()
	b.ReportAllocs()
	for b.Loop() {
		sinkInt += int64(len(d.Map()))
	}
	b.ReportMetric(NumKeys, "keys/op")
}

func BenchmarkEntries(b *testing.B) {
	d := distinctStats()
	b.ReportAllocs()
	for b.Loop() {
		for _, v := range d.Entries() {
			sinkInt += v
		}
	}
}

func BenchmarkSummary(b *testing.B) {
	d := distinctStats()
	b.ReportAllocs()
	var n int
	for b.Loop() {
		n = len(Summary(&d, SummaryOptions{Device: 0, Name: "bench"}))
	}
	b.ReportMetric(float64(n), "bytes/table")
}

func BenchmarkLine(b *testing.B) {
	d := distinctStats()
	b.ReportAllocs()
	for b.Loop() {
		sinkInt += int64(len(Line(&d)))
	}
}
