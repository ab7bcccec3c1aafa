package main

import (
	"os"
	"path/filepath"
	"testing"
)

// TestGeneratedFileIsUpToDate fails when device/compose_gen*.go differ
// from what composegen writes now, or a file it no longer writes is left:
// run go generate in package device.
func TestGeneratedFileIsUpToDate(t *testing.T) {
	want, err := generate()
	if err != nil {
		t.Fatal(err)
	}
	for name, src := range want {
		got, err := os.ReadFile(filepath.Join("../..", name))
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != string(src) {
			t.Fatalf("device/%s is out of date: run go generate ./device", name)
		}
	}
	have, err := filepath.Glob("../../compose_gen*.go")
	if err != nil {
		t.Fatal(err)
	}
	for _, path := range have {
		if _, ok := want[filepath.Base(path)]; !ok {
			t.Fatalf("device/%s is not composegen's: remove it", filepath.Base(path))
		}
	}
}
