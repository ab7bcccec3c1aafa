package pickletest

import (
	"bytes"
	"testing"
)

func TestBinUnicode(t *testing.T) {
	got := BinUnicode("ab")
	if want := []byte{'X', 2, 0, 0, 0, 'a', 'b'}; !bytes.Equal(got, want) {
		t.Fatalf("BinUnicode(\"ab\") = %q, want %q", got, want)
	}
	if got := BinUnicode(string(make([]byte, 300))); got[1] != 44 || got[2] != 1 {
		t.Fatalf("length 300 as % x, want 2c 01 (little-endian)", got[1:5])
	}
}

// Two bytes an element or entry: the size the tests rely on.
func TestTwoBytesEach(t *testing.T) {
	if d := len(SelfRefSettings(2000)) - len(SelfRefSettings(1000)); d != 2*1000+2 {
		t.Fatalf("1,000 more elements took %d bytes, want 2,002 (a mark and a list end)", d)
	}
	if d := len(MemoTraces(2002)) - len(MemoTraces(1002)); d != 2*1000+2 {
		t.Fatalf("1,000 more entries took %d bytes, want 2,002", d)
	}
	for _, p := range [][]byte{SelfRefSettings(1000), MemoTraces(2)} {
		if p[0] != 0x80 || p[1] != 2 || p[len(p)-1] != '.' {
			t.Fatalf("not a protocol-2 pickle ending in STOP: % x ... % x", p[:2], p[len(p)-1:])
		}
	}
}
