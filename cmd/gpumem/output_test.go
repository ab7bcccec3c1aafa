package main

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// An output path that is the same file as an input, spelled the same,
// through a symbolic link, a hard link or another path, is refused before
// anything is read, and the input is left as it was (it was replaced,
// with exit status 0).
func TestOutputIsNotAnInput(t *testing.T) {
	dir := t.TempDir()
	trace := filepath.Join(dir, "in.trace")
	probe := filepath.Join(dir, "b4.trace")
	content := "a 1 1024\na 2 4096\nf 1\nf 2\n"
	writeFile(t, trace, content)
	writeFile(t, probe, "a 1 2048\na 2 8192\nf 1\nf 2\n")
	sym := filepath.Join(dir, "sym.trace")
	require.NoError(t, os.Symlink("in.trace", sym))
	hard := filepath.Join(dir, "hard.trace")
	require.NoError(t, os.Link(trace, hard))
	other := filepath.Join(dir, ".", "..", filepath.Base(dir), "in.trace")
	for _, out := range []string{trace, sym, hard, other} {
		for _, args := range [][]string{
			{"convert", "-o", out, trace},
			{"viz", "-o", out, trace},
			{"replay", "--snapshot", out, trace},
			{"scale", "--probe", trace + "@2", "--probe", probe + "@4", "--batch", "8", "--write", out},
			{"scale", "--probe", probe + "@4", "--probe", trace + "@2", "--batch", "8", "--write", out},
		} {
			_, errOut, code := runCmd(t, args...)
			assert.Equal(t, 2, code, "%q: %s", args, errOut)
			assert.Regexp(t, "is (the input|the same file as the input)", errOut, "%q", args)
			assert.Equal(t, 1, strings.Count(errOut, "\n"), "one line: %q", errOut)
			got, err := os.ReadFile(trace)
			require.NoError(t, err)
			require.Equal(t, content, string(got), "%q replaced its input", args)
		}
	}
	// A different file is written as before.
	out := filepath.Join(dir, "out.trace")
	_, errOut, code := runCmd(t, "convert", "-o", out, trace)
	require.Equal(t, 0, code, errOut)
}

func TestWriteOutputFailsMidway(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "out")
	writeFile(t, out, "precious")
	err := writeOutput(out, io.Discard, func(w io.Writer) error {
		if _, err := w.Write(make([]byte, 1<<20)); err != nil {
			return err
		}
		return errors.New("broke halfway")
	})
	require.ErrorContains(t, err, "broke halfway")
	b, err := os.ReadFile(out)
	require.NoError(t, err)
	assert.Equal(t, "precious", string(b))
	assertOnly(t, dir, "out")

	assert.ErrorContains(t, writeOutput("", io.Discard, func(io.Writer) error { return nil }), "no file name")

	// A new file in a directory that does not exist.
	err = writeOutput(filepath.Join(dir, "no", "such"), io.Discard, func(w io.Writer) error { return nil })
	assert.ErrorContains(t, err, "creating a file beside it")

	// A dangling link names the file to create.
	require.NoError(t, os.Symlink("made", filepath.Join(dir, "dangling")))
	require.NoError(t, writeOutput(filepath.Join(dir, "dangling"), io.Discard, func(w io.Writer) error {
		_, err := io.WriteString(w, "new")
		return err
	}))
	b, err = os.ReadFile(filepath.Join(dir, "made"))
	require.NoError(t, err)
	assert.Equal(t, "new", string(b))

	// A loop of links.
	require.NoError(t, os.Symlink("loop2", filepath.Join(dir, "loop1")))
	require.NoError(t, os.Symlink("loop1", filepath.Join(dir, "loop2")))
	err = writeOutput(filepath.Join(dir, "loop1"), io.Discard, func(w io.Writer) error { return nil })
	assert.Error(t, err)
}

func TestOneLine(t *testing.T) {
	long := strings.Repeat("é", 200)
	msg := oneLine(`bad value "` + long + `" for "short"` + "\nsecond line")
	assert.NotContains(t, msg, "\n")
	assert.Contains(t, msg, `"short"`)
	assert.Contains(t, msg, "(400 bytes)")
	assert.Contains(t, msg, "; second line")
	assert.Less(t, len(msg), 200)
	assert.LessOrEqual(t, len(oneLine(strings.Repeat("y", 1<<20))), maxMessage+100)
	assert.Equal(t, `"abc"`, quote("abc"))
	assert.Equal(t, "abc", clip("abc"))
	assert.Contains(t, clip(strings.Repeat("z", 101)), "... (101 bytes)")
}

// FuzzOneLine: any message becomes one line of bounded length.
func FuzzOneLine(f *testing.F) {
	f.Add(`a "quoted \" string" and more` + "\n" + `"unterminated`)
	f.Add(strings.Repeat(`"x`, 300))
	f.Fuzz(func(t *testing.T, msg string) {
		s := oneLine(msg)
		if strings.ContainsAny(s, "\n\r") {
			t.Fatalf("more than one line: %q", s)
		}
		if len(s) > maxMessage+100 && len(s) > len(msg)+100 {
			t.Fatalf("%d bytes from %d", len(s), len(msg))
		}
	})
}
