//go:build linux

package allocator

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"syscall"
	"testing"
	"unsafe"
)

// adviseHugePages marks every private writable anonymous mapping of the
// process of at least 4 MiB (the Go heap's among them) with
// MADV_HUGEPAGE, so that where transparent huge pages are enabled only
// for memory that asks (the "madvise" setting), the pages the process
// touches from now on in those mappings come as 2 MiB pages. Memory
// touched before keeps its small pages, and the heap's later mappings
// are not marked: so it first has the Go runtime map heap room bytes
// of address space, unused, and return what was used to the system.
// It returns how many mappings it marked.
func adviseHugePages(room int) (int, error) {
	ballast := make([]byte, room) // mapped, never touched
	runtime.KeepAlive(ballast)
	ballast = nil
	runtime.GC()
	debug.FreeOSMemory()
	maps, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		return 0, err
	}
	n := 0
	sc := bufio.NewScanner(bytes.NewReader(maps))
	for sc.Scan() {
		// address perms offset dev inode [path]
		f := bytes.Fields(sc.Bytes())
		if len(f) != 5 || !bytes.HasPrefix(f[1], []byte("rw")) {
			continue // a file, a named region ([stack], [heap]) or read-only
		}
		lo, hi, ok := bytes.Cut(f[0], []byte("-"))
		if !ok {
			continue
		}
		a, err1 := strconv.ParseUint(string(lo), 16, 64)
		b, err2 := strconv.ParseUint(string(hi), 16, 64)
		if err1 != nil || err2 != nil || b-a < 4<<20 {
			continue
		}
		const madvHugepage = 14
		if _, _, e := syscall.Syscall(syscall.SYS_MADVISE, uintptr(a), uintptr(b-a), madvHugepage); e != 0 {
			return n, fmt.Errorf("madvise %#x-%#x: %w", a, b, e)
		}
		n++
	}
	return n, sc.Err()
}

// TestAdviseHugePages checks that the benchmark's advice reaches the
// heap: at least one large anonymous mapping is marked, and a block of
// the heap made afterwards lies in a marked mapping (VmFlags "hg" in
// /proc/self/smaps). A kernel without transparent huge pages refuses
// the advice (EINVAL): the test is skipped there.
func TestAdviseHugePages(t *testing.T) {
	n, err := adviseHugePages(64 << 20)
	if errors.Is(err, syscall.EINVAL) {
		t.Skip("the kernel refuses MADV_HUGEPAGE:", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	if n == 0 {
		t.Fatal("no mapping of 4 MiB or more was marked")
	}
	buf := make([]byte, 8<<20)
	p := uint64(uintptr(unsafe.Pointer(&buf[0])))
	smaps, err := os.ReadFile("/proc/self/smaps")
	if err != nil {
		t.Fatal(err)
	}
	runtime.KeepAlive(buf)
	in := false // in the mapping that holds p
	for line := range bytes.Lines(smaps) {
		if f := bytes.Fields(line); len(f) > 0 && bytes.Contains(f[0], []byte("-")) && !bytes.HasSuffix(f[0], []byte(":")) {
			lo, hi, _ := bytes.Cut(f[0], []byte("-"))
			a, _ := strconv.ParseUint(string(lo), 16, 64)
			b, _ := strconv.ParseUint(string(hi), 16, 64)
			in = a <= p && p < b
			continue
		}
		if in && bytes.HasPrefix(line, []byte("VmFlags:")) {
			if !bytes.Contains(line, []byte(" hg")) {
				t.Fatalf("the heap's mapping of %#x is not advised: %s", p, bytes.TrimSpace(line))
			}
			return
		}
	}
	t.Fatalf("no mapping holds %#x", p)
}
