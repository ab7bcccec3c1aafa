package main

import (
	"os"
	"testing"
)

// TestGeneratedFileIsUpToDate fails when device/compose_gen.go differs from
// what composegen writes now: run go generate in package device.
func TestGeneratedFileIsUpToDate(t *testing.T) {
	want, err := generate()
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile("../../compose_gen.go")
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != string(want) {
		t.Fatal("device/compose_gen.go is out of date: run go generate ./device")
	}
}
