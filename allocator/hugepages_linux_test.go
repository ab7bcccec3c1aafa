//go:build linux

package allocator

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"syscall"
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
		if len(f) < 5 || len(f) > 5 || !bytes.HasPrefix(f[1], []byte("rw")) {
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
