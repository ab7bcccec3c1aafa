package simtest

import (
	"fmt"
	"testing"

	"github.com/gpumem/gpumem/device"
)

// fakeTB records a Fatalf instead of ending the test.
type fakeTB struct{ fatals []string }

func (f *fakeTB) Helper() {}
func (f *fakeTB) Fatalf(format string, args ...any) {
	f.fatals = append(f.fatals, fmt.Sprintf(format, args...))
}

func TestNew(t *testing.T) {
	dev := New(t, Capacity(64<<20), Ordinal(2), PageSize(1<<20))
	if dev.Capacity() != 64<<20 || dev.Ordinal() != 2 || dev.PageSize() != 1<<20 {
		t.Errorf("options not applied: capacity %d, ordinal %d, page %d", dev.Capacity(), dev.Ordinal(), dev.PageSize())
	}
	var f fakeTB
	if dev := New(&f, PageSize(3)); dev != nil || len(f.fatals) != 1 {
		t.Errorf("a page of 3 bytes: device %v, fatals %q", dev, f.fatals)
	}
}

func TestStreams(t *testing.T) {
	dev := New(t)
	if got := Streams(t, dev, 0); len(got) != 1 || got[0] != device.DefaultStream {
		t.Errorf("no new stream: %v", got)
	}
	got := Streams(t, dev, 3)
	if len(got) != 4 || got[0] != device.DefaultStream {
		t.Fatalf("3 new streams: %v", got)
	}
	seen := map[device.Stream]bool{}
	for _, s := range got {
		if seen[s] || !dev.HasStream(s) {
			t.Errorf("stream %v: repeated or not the device's (%v)", s, got)
		}
		seen[s] = true
	}
	if n := dev.Counters().StreamsCreated; n != 3 {
		t.Errorf("%d streams created, want 3", n)
	}
}
