// The catalogue of bad inputs: testdata/bad/CATALOGUE.txt lists command
// lines on malformed and hostile files with the exit status and the
// one-line message each must give; TestCatalogue runs them all.

package main

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpumem/gpumem/internal/pickletest"
)

// catalogueCase is one line of CATALOGUE.txt.
type catalogueCase struct {
	line   int
	status int
	usage  bool     // the usage is printed too, so stderr has more lines
	args   []string // $GEN/ not yet replaced
	msg    string   // "" for a case that succeeds
	alloc  uint64   // the bytes the case may allocate
}

func readCatalogue(t *testing.T, path string) []catalogueCase {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	var cases []catalogueCase
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		text := strings.TrimSpace(sc.Text())
		if text == "" || strings.HasPrefix(text, "#") {
			continue
		}
		parts := strings.SplitN(text, " | ", 3)
		require.Len(t, parts, 3, "CATALOGUE.txt line %d: want STATUS | ARGS | MESSAGE", n)
		c := catalogueCase{line: n, args: strings.Fields(parts[1]), msg: parts[2], alloc: catalogueAlloc}
		status, bound, ok := strings.Cut(parts[0], " alloc ")
		if ok {
			var mib uint64
			_, err := fmt.Sscanf(bound, "%dMiB", &mib)
			require.NoError(t, err, "CATALOGUE.txt line %d: want alloc NMiB", n)
			c.alloc = mib << 20
		}
		if c.usage = strings.HasSuffix(status, "u"); c.usage {
			status = strings.TrimSuffix(status, "u")
		}
		_, err := fmt.Sscanf(status, "%d", &c.status)
		require.NoError(t, err, "CATALOGUE.txt line %d", n)
		if c.msg == "-" {
			c.msg = ""
		}
		cases = append(cases, c)
	}
	require.NoError(t, sc.Err())
	return cases
}

// Generated inputs, too large to keep in testdata: $GEN/NAME in the
// catalogue. Bombs are concatenated gzip members, each 1 MiB compressed
// once, so that a 1 GiB bomb costs a megabyte and milliseconds to make.
var generated = map[string]func(w io.Writer) error{
	"long-line.trace": func(w io.Writer) error {
		return writeAll(w, "a 1 5\n", strings.Repeat("x", 70_000), "\n")
	},
	"long-op.trace": func(w io.Writer) error {
		return writeAll(w, strings.Repeat("x", 60_000), " 1\n")
	},
	"bomb-zeros.trace.gz":    func(w io.Writer) error { return gzipBomb(w, nil, 0, 1024) },
	"bomb-one-line.trace.gz": func(w io.Writer) error { return gzipBomb(w, nil, 'a', 1024) },
	"bomb-zeros.pickle.gz":   func(w io.Writer) error { return gzipBomb(w, []byte{0x80, 2, ']'}, 0, 1024) },
	"huge-long.pickle": func(w io.Writer) error {
		return writeAll(w, "\x80\x02L", strings.Repeat("7", 4_000_000), "L\n.")
	},
	"huge-int.pickle": func(w io.Writer) error {
		return writeAll(w, "\x80\x02I", strings.Repeat("7", 5000), "\n.")
	},
	"mark-flood.pickle": func(w io.Writer) error {
		return writeAll(w, "\x80\x02", strings.Repeat("(", 10<<20), ".")
	},
	"loose-values.pickle": func(w io.Writer) error {
		return writeAll(w, "\x80\x02", strings.Repeat("N", 2<<20), ".")
	},
	"deep-nesting.pickle": func(w io.Writer) error {
		return writeAll(w, "\x80\x02", strings.Repeat("]", 100_000), strings.Repeat("a", 99_999), ".")
	},
	"rmm-huge-field.csv": func(w io.Writer) error {
		return writeAll(w, "Thread,Time,Action,Pointer,Size,Stream\n1,t,allocate,0x10,", strings.Repeat("9", 10<<20), ",0x0\n")
	},
	"rmm-long-action.csv": func(w io.Writer) error {
		return writeAll(w, "Thread,Time,Action,Pointer,Size,Stream\n1,t,", strings.Repeat("q", 50_000), ",0x10,5,0x0\n")
	},
	// allocator_settings holds itself a million times (3 KB of gzip):
	// its repr made a 325 MB note.
	"settings-self-1m.pickle.gz": func(w io.Writer) error { return gzipOf(w, pickletest.SelfRefSettings(1_000_000)) },
	// Four million times (13 KB of gzip): the runtime died.
	"settings-self-4m.pickle.gz": func(w io.Writer) error { return gzipOf(w, pickletest.SelfRefSettings(4_000_000)) },
	// device_traces names one alloc and one free dict 4 million times
	// through the memo (13 KB of gzip): 4 million ops were built (16
	// million took 2.1 GB); the import's budget refuses it.
	"memo-traces-4m.pickle.gz": func(w io.Writer) error { return gzipOf(w, pickletest.MemoTraces(4_000_000)) },
	// 250,000 times: imported, within the limit.
	"memo-traces-250k.pickle.gz": func(w io.Writer) error { return gzipOf(w, pickletest.MemoTraces(250_000)) },
	// A config whose _name_or_path is escape sequences and half a million
	// line breaks.
	"config-name-escapes.json": func(w io.Writer) error {
		return writeAll(w, `{"_name_or_path": "\u001b]0;x\u0007\u001b[2J`, strings.Repeat(`\n`, 500_000),
			`", "model_type": "gpt2", "n_embd": 768, "n_layer": 2, "n_head": 12, "vocab_size": 50257}`)
	},
	// A config with a 3 MB value where a number belongs.
	"config-huge-value.json": func(w io.Writer) error {
		return writeAll(w, `{"model_type": "llama", "hidden_size": "`, strings.Repeat("x", 3<<20), `"}`)
	},
}

// gzipOf writes data compressed.
func gzipOf(w io.Writer, data []byte) error {
	zw, err := gzip.NewWriterLevel(w, gzip.BestCompression)
	if err != nil {
		return err
	}
	if _, err := zw.Write(data); err != nil {
		return err
	}
	return zw.Close()
}

func writeAll(w io.Writer, parts ...string) error {
	for _, p := range parts {
		if _, err := io.WriteString(w, p); err != nil {
			return err
		}
	}
	return nil
}

// gzipBomb writes a gzip file of head followed by mib MiB of the byte b.
func gzipBomb(w io.Writer, head []byte, b byte, mib int) error {
	member := func(data []byte) ([]byte, error) {
		var buf bytes.Buffer
		zw, err := gzip.NewWriterLevel(&buf, gzip.BestCompression)
		if err != nil {
			return nil, err
		}
		if _, err := zw.Write(data); err != nil {
			return nil, err
		}
		err = zw.Close()
		return buf.Bytes(), err
	}
	if len(head) > 0 {
		m, err := member(head)
		if err != nil {
			return err
		}
		if _, err := w.Write(m); err != nil {
			return err
		}
	}
	m, err := member(bytes.Repeat([]byte{b}, 1<<20))
	if err != nil {
		return err
	}
	for range mib {
		if _, err := w.Write(m); err != nil {
			return err
		}
	}
	return nil
}

func generate(t *testing.T, dir, name string) string {
	t.Helper()
	gen, ok := generated[name]
	require.True(t, ok, "no generator for $GEN/%s", name)
	path := filepath.Join(dir, name)
	if _, err := os.Stat(path); err == nil {
		return path
	}
	f, err := os.Create(path)
	require.NoError(t, err)
	bw := bufio.NewWriter(f)
	require.NoError(t, gen(bw))
	require.NoError(t, bw.Flush())
	require.NoError(t, f.Close())
	return path
}

// The bounds every case must keep. The slowest case takes well under a
// second; the memory bound is far below what the inputs could make a
// careless reader take (the bombs decompress to 1 GiB). A case whose
// status is followed by "alloc NMiB" may allocate N MiB instead: the
// inputs that reach the snapshot importer's 1 GiB memory limit.
const (
	catalogueTime  = 10 * time.Second
	catalogueAlloc = 128 << 20
)

// TestCatalogue runs every case of testdata/bad/CATALOGUE.txt through the
// command's entry point, in process, and checks: no panic, the exit
// status, one line on standard error holding the expected message (the
// usage may follow a command-line error marked "2u"), and bounded time
// and memory.
func TestCatalogue(t *testing.T) {
	cases := readCatalogue(t, "testdata/bad/CATALOGUE.txt")
	require.GreaterOrEqual(t, len(cases), 100)
	gen := t.TempDir()
	out := t.TempDir()
	t.Chdir("testdata/bad")
	for _, c := range cases {
		args := make([]string, len(c.args))
		for i, a := range c.args {
			switch {
			case strings.HasPrefix(a, "$GEN/"):
				a = generate(t, gen, strings.TrimPrefix(a, "$GEN/"))
			case strings.HasSuffix(a, ".pickle") && i > 0 && c.args[i-1] == "--snapshot":
				a = filepath.Join(out, a) // an output: never written here
			}
			args[i] = a
		}
		name := fmt.Sprintf("line%03d", c.line)
		t.Run(name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			var status int
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			start := time.Now()
			func() {
				defer func() {
					if r := recover(); r != nil {
						t.Fatalf("gpumem %s panicked: %v\n%s", strings.Join(c.args, " "), r, debug.Stack())
					}
				}()
				status = run(args, &stdout, &stderr)
			}()
			elapsed := time.Since(start)
			runtime.ReadMemStats(&after)
			cmd := "gpumem " + strings.Join(c.args, " ")

			assert.Equal(t, c.status, status, "%s: exit status (stderr %q)", cmd, stderr.String())
			assert.Less(t, elapsed, catalogueTime, "%s: time", cmd)
			assert.Less(t, after.TotalAlloc-before.TotalAlloc, c.alloc, "%s: bytes allocated", cmd)
			if c.msg == "" {
				return
			}
			lines := strings.Split(strings.TrimRight(dropConfLine(stderr.String()), "\n"), "\n")
			if !c.usage {
				require.Len(t, lines, 1, "%s: one line on stderr, got %q", cmd, stderr.String())
			}
			var found string
			for _, l := range lines {
				if strings.Contains(l, c.msg) {
					found = l
					break
				}
			}
			require.NotEmpty(t, found, "%s: no line of stderr holds %q: %q", cmd, c.msg, stderr.String())
			assert.Less(t, len(found), 600, "%s: the message quotes a bounded part of the input", cmd)
		})
	}
}
