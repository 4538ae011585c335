package leasing_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// sharedErrors are the errors Store's contract promises for every method.
var sharedErrors = []string{"ArgumentError", "ErrInvalidArgument", "SchemaError", "ErrSchema", "ErrLockTimeout", "ErrPermissionDenied"}

// TestStoreStatesItsErrorsOnce: the Store doc states the error contract
// every method shares, naming each error it promises; no method repeats
// it; and a method whose Memory implementation returns an error of its own
// (a sentinel or error type beyond the contract) names it in an "Errors:"
// paragraph.
func TestStoreStatesItsErrorsOnce(t *testing.T) {
	t.Parallel()
	files := parseFiles(t, "*.go")
	doc, methods := findInterface(t, files, "Store")
	require.Regexp(t, `(?m)^Errors, for every method`, doc, "Store states the shared contract")
	require.Contains(t, doc, "context's error")
	declared := topLevelNames(files)
	for _, name := range sharedErrors {
		require.Contains(t, doc, name, "Store's contract names %s", name)
		require.True(t, declared[name], "%s is declared in package leasing", name)
	}

	own := ownErrors(files, declared)
	for method, want := range map[string]string{"Enqueue": "ErrDuplicate", "Claim": "ParkedError", "Get": "ErrNotFound"} {
		require.Contains(t, own[method], want, "the walk over Memory.%s finds its own error", method)
	}
	repeated := regexp.MustCompile(`ArgumentError|ErrInvalidArgument|ErrLockTimeout|ErrPermissionDenied|driver's`)
	for _, m := range methods.List {
		require.Len(t, m.Names, 1, "Store embeds no interface")
		name, text := m.Names[0].Name, m.Doc.Text()
		require.NotEmpty(t, text, "Store.%s has a doc comment", name)
		require.NotRegexp(t, repeated, text, "Store.%s leaves the shared contract to Store", name)
		for _, e := range own[name] {
			require.Regexp(t, `(?m)^Errors: \S`, text, "Store.%s returns %s: it says so", name, e)
			require.Contains(t, text, e, "Store.%s names its own error %s", name, e)
		}
	}
}

// TestWorkSignalSaysItsErrors: every method of processor.WorkSignal has a
// doc comment, and one that returns an error has an "Errors:" paragraph.
func TestWorkSignalSaysItsErrors(t *testing.T) {
	t.Parallel()
	_, methods := findInterface(t, parseFiles(t, filepath.Join("processor", "*.go")), "WorkSignal")
	for _, m := range methods.List {
		require.Len(t, m.Names, 1, "WorkSignal embeds no interface")
		name, text := m.Names[0].Name, m.Doc.Text()
		require.NotEmpty(t, text, "WorkSignal.%s has a doc comment", name)
		results := m.Type.(*ast.FuncType).Results
		if results != nil && slices.ContainsFunc(results.List, func(f *ast.Field) bool { return identName(f.Type) == "error" }) {
			require.Regexp(t, `(?m)^Errors: \S`, text, "WorkSignal.%s says what it returns on failure", name)
		}
	}
}

// identName returns the name of e, or of the type *e points to; "" for
// any other expression.
func identName(e ast.Expr) string {
	if star, ok := e.(*ast.StarExpr); ok {
		e = star.X
	}
	if id, ok := e.(*ast.Ident); ok {
		return id.Name
	}
	return ""
}

// parseFiles parses the non-test Go files matching pattern.
func parseFiles(t *testing.T, pattern string) []*ast.File {
	t.Helper()
	paths, err := filepath.Glob(pattern)
	require.NoError(t, err)
	var files []*ast.File
	for _, p := range paths {
		if strings.HasSuffix(p, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(token.NewFileSet(), p, nil, parser.ParseComments)
		require.NoError(t, err)
		files = append(files, f)
	}
	require.NotEmpty(t, files, pattern)
	return files
}

// findInterface returns the doc and the methods of interface name.
func findInterface(t *testing.T, files []*ast.File, name string) (string, *ast.FieldList) {
	t.Helper()
	for _, f := range files {
		for _, d := range f.Decls {
			g, ok := d.(*ast.GenDecl)
			if !ok || g.Tok != token.TYPE {
				continue
			}
			for _, s := range g.Specs {
				ts := s.(*ast.TypeSpec)
				if it, ok := ts.Type.(*ast.InterfaceType); ok && ts.Name.Name == name {
					doc := ts.Doc
					if doc == nil {
						doc = g.Doc
					}
					require.NotEmpty(t, it.Methods.List, name)
					return doc.Text(), it.Methods
				}
			}
		}
	}
	require.FailNow(t, "no interface "+name)
	return "", nil
}

func topLevelNames(files []*ast.File) map[string]bool {
	names := map[string]bool{}
	for _, f := range files {
		for name := range f.Scope.Objects {
			names[name] = true
		}
	}
	return names
}

// ownErrors returns, per Memory method, the package's sentinels (Err...)
// and error types (...Error) outside the shared contract that its body
// refers to, directly or through the package functions and Memory methods
// it calls.
func ownErrors(files []*ast.File, declared map[string]bool) map[string][]string {
	funcs, methods := map[string]*ast.FuncDecl{}, map[string]*ast.FuncDecl{}
	for _, f := range files {
		for _, d := range f.Decls {
			fd, ok := d.(*ast.FuncDecl)
			switch {
			case !ok || fd.Body == nil:
			case fd.Recv == nil:
				funcs[fd.Name.Name] = fd
			case identName(fd.Recv.List[0].Type) == "Memory":
				methods[fd.Name.Name] = fd
			}
		}
	}
	isOwnError := func(name string) bool {
		return declared[name] && !slices.Contains(sharedErrors, name) &&
			(strings.HasPrefix(name, "Err") || strings.HasSuffix(name, "Error")) && funcs[name] == nil
	}
	out := map[string][]string{}
	for name, fd := range methods {
		seen := map[*ast.FuncDecl]bool{}
		var walk func(*ast.FuncDecl)
		walk = func(fd *ast.FuncDecl) {
			if fd == nil || seen[fd] {
				return
			}
			seen[fd] = true
			ast.Inspect(fd.Body, func(n ast.Node) bool {
				switch n := n.(type) {
				case *ast.Ident:
					if isOwnError(n.Name) && !slices.Contains(out[name], n.Name) {
						out[name] = append(out[name], n.Name)
					}
				case *ast.CallExpr:
					switch fn := n.Fun.(type) {
					case *ast.Ident:
						walk(funcs[fn.Name])
					case *ast.SelectorExpr:
						if identName(fn.X) == "m" {
							walk(methods[fn.Sel.Name])
						}
					}
				}
				return true
			})
		}
		walk(fd)
	}
	return out
}
