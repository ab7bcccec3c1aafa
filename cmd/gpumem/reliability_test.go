package main

// Regression tests for the command line's reliability: outputs are never
// half-written, failed writes to standard output fail the command, error
// messages quote a bounded part of their input, and --history must be
// positive. They use only run, so that they also run against older
// versions of the command.

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	require.NoError(t, os.WriteFile(path, []byte(content), 0o644))
}

// assertOnly checks that dir holds only the given names.
func assertOnly(t *testing.T, dir string, names ...string) {
	t.Helper()
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	var got []string
	for _, e := range entries {
		got = append(got, e.Name())
	}
	assert.ElementsMatch(t, names, got, "no temporary file is left behind")
}

// TestOutputsNeverHalfWritten: a command that fails leaves the file it
// would have written as it was, also through a symbolic link; one that
// succeeds replaces the file the link leads to and keeps the link.
func TestOutputsNeverHalfWritten(t *testing.T) {
	src := t.TempDir()
	bad := filepath.Join(src, "bad.trace")
	writeFile(t, bad, "a 1 1024\na 2 2048\nf 9\n") // streams two ops, then breaks the rules
	badCSV := filepath.Join(src, "bad.csv")
	writeFile(t, badCSV, "Thread,Time,Action,Pointer,Size,Stream\n1,2,allocate,0x10,zzz,0x0\n")
	good := "testdata/small.trace.gz"
	b2, b4 := batches+"bert_b2.trace.gz@2", batches+"bert_b4.trace.gz@4"

	for _, c := range []struct {
		name       string
		fail, pass func(out string) []string
	}{
		{"convert", func(o string) []string { return []string{"convert", "-o", o, bad} }, func(o string) []string { return []string{"convert", "-o", o, good} }},
		{"convert csv", func(o string) []string { return []string{"convert", "-o", o, badCSV} }, func(o string) []string { return []string{"convert", "-o", o, "testdata/rmm_log.csv"} }},
		{"viz", func(o string) []string { return []string{"viz", "-o", o, bad} }, func(o string) []string { return []string{"viz", "-o", o, good} }},
		{"replay --snapshot", func(o string) []string { return []string{"replay", "--snapshot", o, bad} }, func(o string) []string { return []string{"replay", "--snapshot", o, good} }},
		{"scale --write", func(o string) []string {
			return []string{"scale", "--probe", b2, "--probe", "testdata/small.trace.gz@4", "--batch", "8", "--write", o}
		}, func(o string) []string {
			return []string{"scale", "--probe", b2, "--probe", b4, "--batch", "8", "--write", o}
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			out := filepath.Join(dir, "out")
			writeFile(t, out, "precious")
			_, errOut, code := runCmd(t, c.fail(out)...)
			require.NotEqual(t, 0, code)
			assert.Equal(t, 1, strings.Count(dropConfLine(errOut), "\n"), "one line: %q", errOut)
			b, err := os.ReadFile(out)
			require.NoError(t, err, "the file is still there")
			assert.Equal(t, "precious", string(b), "and untouched")

			// Through a symbolic link: the link's target is untouched too.
			link := filepath.Join(dir, "link")
			require.NoError(t, os.Symlink("out", link))
			_, _, code = runCmd(t, c.fail(link)...)
			require.NotEqual(t, 0, code)
			b, err = os.ReadFile(out)
			require.NoError(t, err)
			assert.Equal(t, "precious", string(b))
			assertOnly(t, dir, "out", "link")

			// Success replaces the target, and the link stays a link.
			_, errOut, code = runCmd(t, c.pass(link)...)
			require.Equal(t, 0, code, errOut)
			fi, err := os.Lstat(link)
			require.NoError(t, err)
			assert.NotZero(t, fi.Mode()&os.ModeSymlink, "the link is kept")
			b, err = os.ReadFile(out)
			require.NoError(t, err)
			assert.NotEqual(t, "precious", string(b))
			assert.NotEmpty(t, b)
			assertOnly(t, dir, "out", "link")
		})
	}
}

// TestOutputToDevice: a target that is not a regular file is written
// directly.
func TestOutputToDevice(t *testing.T) {
	if _, err := os.Stat(os.DevNull); err != nil {
		t.Skip("no", os.DevNull)
	}
	_, errOut, code := runCmd(t, "convert", "-o", os.DevNull, "testdata/rmm_log.csv")
	assert.Equal(t, 0, code, errOut)
	out, errOut, code := runCmd(t, "convert", "-o", "-", "testdata/rmm_log.csv")
	assert.Equal(t, 0, code, errOut)
	assert.True(t, strings.HasPrefix(out, "# memtrace v1"))
	dir := t.TempDir()
	_, errOut, code = runCmd(t, "viz", "-o", dir, "testdata/small.trace.gz")
	assert.Equal(t, 1, code)
	assert.Contains(t, errOut, "directory")
}

// TestOutputKeepsMode: a file replaced keeps its permissions.
func TestOutputKeepsMode(t *testing.T) {
	out := filepath.Join(t.TempDir(), "out.trace")
	writeFile(t, out, "old")
	require.NoError(t, os.Chmod(out, 0o600))
	_, errOut, code := runCmd(t, "convert", "-o", out, "testdata/rmm_log.csv")
	require.Equal(t, 0, code, errOut)
	fi, err := os.Stat(out)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), fi.Mode().Perm())
}

// failingWriter fails every write, as a full disk does.
type failingWriter struct{}

func (failingWriter) Write([]byte) (int, error) { return 0, syscall.ENOSPC }

// TestFailedStdoutFails: a command whose output cannot be written exits 1
// with one line saying so.
func TestFailedStdoutFails(t *testing.T) {
	for _, args := range [][]string{
		{"replay", "--json", "testdata/small.trace.gz"},
		{"replay", "testdata/small.trace.gz"},
		{"demo", "--steps", "1", "--layers", "1"},
		{"compare", "testdata/small.trace.gz"},
		{"convert", "testdata/rmm_log.csv"},
		{"estimate", "--layers", "2", "--hidden", "256", "--heads", "4", "--vocab", "1000", "--seq", "128", "--batch", "2"},
		{"fit", "--conf", "", "testdata/rmm_log.csv"},
		{"viz", "testdata/rmm_log.csv"},
		{"help"},
	} {
		var stderr bytes.Buffer
		code := run(args, failingWriter{}, &stderr)
		assert.Equal(t, 1, code, "%v", args)
		assert.Contains(t, stderr.String(), "no space left on device", "%v", args)
		assert.Equal(t, 1, strings.Count(dropConfLine(stderr.String()), "\n"), "%v: one line: %q", args, stderr.String())
	}
	// The same with the real thing, where there is one.
	full, err := os.OpenFile("/dev/full", os.O_WRONLY, 0)
	if err != nil {
		t.Skip("no /dev/full")
	}
	defer full.Close()
	var stderr bytes.Buffer
	code := run([]string{"replay", "--json", "testdata/small.trace.gz"}, full, &stderr)
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr.String(), "no space left on device")
}

// TestMessagesBounded: no message quotes more than about 100 bytes of its
// input.
func TestMessagesBounded(t *testing.T) {
	huge := strings.Repeat("x", 1<<20)
	dir := t.TempDir()
	csv := filepath.Join(dir, "huge.csv") // a 10 MB field
	writeFile(t, csv, "Thread,Time,Action,Pointer,Size,Stream\n1,2,allocate,0x10,"+strings.Repeat("9", 10<<20)+",0x0\n")
	tr := filepath.Join(dir, "huge.trace")
	writeFile(t, tr, "a 1 "+huge+"\n")
	for _, args := range [][]string{
		{huge},
		{"demo", huge},
		{"demo", "--" + huge},
		{"replay", "--capacity", huge, "x"},
		{"replay", "--conf", huge, "x"},
		{"replay", "--conf", "max_split_size_mb:" + huge, "x"},
		{"replay", huge},
		{"replay", csv},
		{"replay", tr},
		{"convert", csv},
		{"estimate", "--dtype", huge},
		{"scale", "--probe", huge, "--probe", huge, "--batch", "2"},
	} {
		_, errOut, code := runCmd(t, args...)
		assert.NotEqual(t, 0, code)
		assert.Less(t, len(errOut), 1500, "%.40q...: %d bytes of message", args, len(errOut))
	}
}

// TestHistoryMustBePositive: --history 0 or less once meant unlimited.
func TestHistoryMustBePositive(t *testing.T) {
	for _, n := range []string{"0", "-1"} {
		snap := filepath.Join(t.TempDir(), "snap.pickle")
		_, errOut, code := runCmd(t, "replay", "--snapshot", snap, "--history", n, "testdata/small.trace.gz")
		assert.Equal(t, 2, code, n)
		assert.Contains(t, errOut, "--history", n)
		_, err := os.Stat(snap)
		assert.True(t, errors.Is(err, os.ErrNotExist), "nothing written")
	}
}
