package engine

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// Limits of one type under services/engine (issue 21): a type that needs
// more is doing more than one job and should be split along its seams.
const (
	maxFields  = 20
	maxMethods = 30
)

// typeShape is the size of one named type: its struct fields (each name
// counts, an embedded field counts once) and the methods declared on it.
type typeShape struct {
	name    string // package dir/Type
	fields  int
	methods int
}

// shapes measures every named type declared in the non-test Go files
// under root.
func shapes(t *testing.T, root string) []typeShape {
	t.Helper()
	byName := map[string]*typeShape{}
	get := func(dir, typ string) *typeShape {
		k := dir + "." + typ
		if byName[k] == nil {
			byName[k] = &typeShape{name: k}
		}
		return byName[k]
	}
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		dir := filepath.ToSlash(filepath.Dir(path))
		if dir == "." {
			dir = "engine"
		}
		for _, decl := range f.Decls {
			switch decl := decl.(type) {
			case *ast.GenDecl:
				for _, spec := range decl.Specs {
					ts, ok := spec.(*ast.TypeSpec)
					if !ok {
						continue
					}
					s := get(dir, ts.Name.Name)
					if st, ok := ts.Type.(*ast.StructType); ok {
						for _, f := range st.Fields.List {
							s.fields += max(1, len(f.Names))
						}
					}
				}
			case *ast.FuncDecl:
				if decl.Recv == nil || len(decl.Recv.List) == 0 {
					continue
				}
				get(dir, recvName(decl.Recv.List[0].Type)).methods++
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("walk %s: %v", root, err)
	}
	out := make([]typeShape, 0, len(byName))
	for _, s := range byName {
		out = append(out, *s)
	}
	sort.Slice(out, func(i, j int) bool {
		if a, b := out[i].fields+out[i].methods, out[j].fields+out[j].methods; a != b {
			return a > b
		}
		return out[i].name < out[j].name
	})
	return out
}

// recvName is the type name of a method receiver (T, *T, T[P], *T[P]).
func recvName(e ast.Expr) string {
	for {
		switch x := e.(type) {
		case *ast.StarExpr:
			e = x.X
		case *ast.IndexExpr:
			e = x.X
		case *ast.IndexListExpr:
			e = x.X
		case *ast.Ident:
			return x.Name
		default:
			return ""
		}
	}
}

// Every type under services/engine stays within maxFields fields and
// maxMethods methods; -v lists the largest.
func TestNoTypeTooLarge(t *testing.T) {
	all := shapes(t, ".")
	for i, s := range all {
		if i < 12 {
			t.Logf("%-50s %3d fields %3d methods", s.name, s.fields, s.methods)
		}
		if s.fields > maxFields || s.methods > maxMethods {
			t.Errorf("%s has %d fields and %d methods, want at most %d and %d: split it along its seams",
				s.name, s.fields, s.methods, maxFields, maxMethods)
		}
	}
}

// The measure itself: a type with too many fields or methods is found.
func TestShapesCountsFieldsAndMethods(t *testing.T) {
	dir := t.TempDir()
	src := "package p\ntype big struct{ a, b int; c string; *big }\nfunc (big) m1() {}\nfunc (*big) m2() {}\nfunc (x *big) m3() {}\n" +
		"type g[T any] struct{ v T }\nfunc (g[T]) m() {}\n"
	if err := os.WriteFile(filepath.Join(dir, "p.go"), []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	got := map[string]typeShape{}
	for _, s := range shapes(t, dir) {
		got[s.name] = s
	}
	d := filepath.ToSlash(dir)
	for name, want := range map[string][2]int{d + ".big": {4, 3}, d + ".g": {1, 1}} {
		s := got[name]
		if s.fields != want[0] || s.methods != want[1] {
			t.Errorf("shapes(%s) = %d fields %d methods, want %d and %d", name, s.fields, s.methods, want[0], want[1])
		}
	}
}

// The task package's doc lists every type with methods (the Runner and
// the parts it composes) and how a Task flows through them, in under 40
// lines: a new part is named there, or the doc is wrong.
func TestTaskDocListsItsTypes(t *testing.T) {
	fset := token.NewFileSet()
	files, err := filepath.Glob("internal/task/*.go")
	if err != nil {
		t.Fatal(err)
	}
	var doc string
	withMethods := map[string]bool{}
	for _, path := range files {
		if strings.HasSuffix(path, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, path, nil, parser.ParseComments|parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		if f.Doc != nil {
			if doc != "" {
				t.Errorf("%s has a second package doc", path)
			}
			doc = f.Doc.Text()
		}
		for _, decl := range f.Decls {
			if fd, ok := decl.(*ast.FuncDecl); ok && fd.Recv != nil && len(fd.Recv.List) > 0 {
				withMethods[recvName(fd.Recv.List[0].Type)] = true
			}
		}
	}
	if n := strings.Count(strings.TrimSpace(doc), "\n") + 1; doc == "" || n >= 40 {
		t.Errorf("the task package doc has %d lines, want under 40", n)
	}
	words := map[string]bool{}
	for _, w := range strings.FieldsFunc(doc, func(r rune) bool {
		return !(r == '_' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9')
	}) {
		words[w] = true
	}
	for typ := range withMethods {
		if !words[typ] {
			t.Errorf("the task package doc does not name %s", typ)
		}
	}
}
