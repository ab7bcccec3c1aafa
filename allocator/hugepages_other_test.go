//go:build !linux

package allocator

import "errors"

// adviseHugePages is Linux's alone (hugepages_linux_test.go).
func adviseHugePages(int) (int, error) {
	return 0, errors.New("huge pages are advised on Linux only")
}
