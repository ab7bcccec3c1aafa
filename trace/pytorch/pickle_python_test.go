// A differential test of the pickle reader against Python's own pickle
// module, when Python is installed.

package pytorch

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nlpodyssey/gopickle/types"
	"github.com/stretchr/testify/require"
)

// pythonPickles makes random plain data in Python (nested lists, tuples,
// dicts, shared references, big integers, protocol-0 text) and writes it
// with every protocol, 0 to 5, beside its repr.
const pythonPickles = `
import pickle, random, sys, os
out = sys.argv[1]
for seed in range(6):
    random.seed(seed)
    def val(d):
        if d > 4 or random.random() < 0.4:
            return random.choice([None, True, False, 0, 1, -1, 255, 256, 65535, 65536, -2**31, 2**31, 2**63,
                -2**63-1, 2**100, -(2**200), 0.5, -1e300, 1e16, "", "a", "it's", 'q"uote', "back\\slash",
                "tab\tnl\n", "x"*300, "caf\u00e9 \u20ac\U0001F600", random.randint(-2**70, 2**70), random.random()])
        k = random.choice(["list", "tuple", "dict", "shared"])
        if k == "list":
            return [val(d+1) for _ in range(random.randint(0, 5 if d else 300))]
        if k == "tuple":
            return tuple(val(d+1) for _ in range(random.randint(0, 6)))
        if k == "shared":
            x = [1, "s"]
            return [x, x, {"k": x}]
        return {random.choice(["a", "b", "action", "addr"]) + str(i): val(d+1) for i in range(random.randint(0, 5 if d else 300))}
    v = val(0)
    for proto in range(6):
        with open(os.path.join(out, f"{seed}.p{proto}"), "wb") as f:
            pickle.dump(v, f, protocol=proto)
    with open(os.path.join(out, f"{seed}.repr"), "w", encoding="utf-8") as f:
        f.write(repr(v))
`

// runPython runs a Python script with the arguments and returns what it
// printed, failing the test if it fails; it skips the test when python3
// is not installed.
func runPython(t *testing.T, script string, args ...string) string {
	t.Helper()
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("python3 not installed")
	}
	out, err := exec.Command(py, append([]string{"-c", script}, args...)...).CombinedOutput()
	require.NoError(t, err, string(out))
	return string(out)
}

// runPythonOn writes data to a file and runs a Python script with its
// path as the one argument (runPython).
func runPythonOn(t *testing.T, script string, data []byte) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "snapshot.pickle")
	require.NoError(t, os.WriteFile(path, data, 0o644))
	return runPython(t, script, path)
}

func TestPickleMatchesPython(t *testing.T) {
	dir := t.TempDir()
	runPython(t, pythonPickles, dir)
	files, err := filepath.Glob(filepath.Join(dir, "*.p?"))
	require.NoError(t, err)
	require.Len(t, files, 36)
	for _, f := range files {
		data, err := os.ReadFile(f)
		require.NoError(t, err)
		v, err := loadPickle(data)
		require.NoError(t, err, f)
		want, err := os.ReadFile(f[:len(f)-3] + ".repr")
		require.NoError(t, err)
		var b strings.Builder
		fullRepr(&b, v)
		if got := b.String(); got != string(want) {
			i := 0
			for i < len(got) && i < len(want) && got[i] == want[i] {
				i++
			}
			t.Errorf("%s: differs from Python at byte %d: got %.60q, want %.60q", filepath.Base(f), i, got[i:], want[i:])
		}
	}
}

// fullRepr is Python's repr of plain data without pyRepr's length limit,
// with Python's choice of quotes.
func fullRepr(b *strings.Builder, v any) {
	seq := func(open, close string, items []any) {
		b.WriteString(open)
		for i, e := range items {
			if i > 0 {
				b.WriteString(", ")
			}
			fullRepr(b, e)
		}
		if open == "(" && len(items) == 1 {
			b.WriteString(",")
		}
		b.WriteString(close)
	}
	switch x := v.(type) {
	case string:
		q := "'"
		if strings.Contains(x, "'") && !strings.Contains(x, `"`) {
			q = `"`
		}
		x = strings.NewReplacer(`\`, `\\`, "\n", `\n`, "\r", `\r`, "\t", `\t`).Replace(x)
		if q == "'" {
			x = strings.ReplaceAll(x, "'", `\'`)
		}
		b.WriteString(q + x + q)
	case *types.List:
		seq("[", "]", *x)
	case *types.Tuple:
		seq("(", ")", *x)
	case *types.Dict:
		b.WriteString("{")
		for i, e := range *x {
			if i > 0 {
				b.WriteString(", ")
			}
			fullRepr(b, e.Key)
			b.WriteString(": ")
			fullRepr(b, e.Value)
		}
		b.WriteString("}")
	default:
		var c strings.Builder
		pyRepr(&c, v, 0)
		b.WriteString(c.String())
	}
}
