package allocator

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"strings"
	"testing"
)

// TestOnlyTheLedgerWrites checks the ledger's promise (ledger.go) on the
// package's source: outside the ledger's files (ledger.go and
// ledger_peaks.go), no file calls a method of the peaks package that
// changes a count's value or limit or a peak, nor assigns a count's
// cumulative sums or the limit of an all column.
func TestOnlyTheLedgerWrites(t *testing.T) {
	writers := map[string]bool{"Bump": true, "Drop": true, "Carry": true, "Carried": true, "SetLimit": true, "AddRow": true, "Sole": true, "Exceed": true, "Passed": true, "Risers": true, "Lend": true, "setLimit": true, "Cut": true, "ResetPeaks": true}
	fields := map[string]bool{"allLim": true, "increases": true, "base": true}
	entries, err := os.ReadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	files := 0
	for _, e := range entries {
		name := e.Name()
		if !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") || name == "ledger.go" || name == "ledger_peaks.go" || name == "ledger_held.go" || name == "ledger_serial.go" {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		files++
		// Calls through an imported package other than peaks (strings.Cut)
		// are not the peaks' writers.
		imported := map[string]bool{}
		for _, im := range f.Imports {
			path := strings.Trim(im.Path.Value, `"`)
			name := path[strings.LastIndex(path, "/")+1:]
			if im.Name != nil {
				name = im.Name.Name
			}
			imported[name] = name != "peaks"
		}
		field := func(x ast.Expr) {
			if sel, ok := x.(*ast.SelectorExpr); ok && fields[sel.Sel.Name] {
				t.Errorf("%s: assigns %s outside the ledger", fset.Position(sel.Pos()), sel.Sel.Name)
			}
		}
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.CallExpr:
				if sel, ok := n.Fun.(*ast.SelectorExpr); ok && writers[sel.Sel.Name] {
					if id, ok := sel.X.(*ast.Ident); ok && imported[id.Name] {
						return true
					}
					t.Errorf("%s: calls %s outside the ledger", fset.Position(sel.Pos()), sel.Sel.Name)
				}
			case *ast.AssignStmt:
				for _, x := range n.Lhs {
					field(x)
				}
			case *ast.IncDecStmt:
				field(n.X)
			}
			return true
		})
	}
	if files < 10 {
		t.Fatalf("read %d files of the package", files)
	}
}
