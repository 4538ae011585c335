package leasing_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"regexp"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestInterfaceMethodsSayTheirErrors: every method of the interfaces that
// callers implement or call through (Store, processor.WorkSignal) has an
// "Errors:" paragraph in its doc comment, as the exported functions do.
func TestInterfaceMethodsSayTheirErrors(t *testing.T) {
	t.Parallel()
	errorsParagraph := regexp.MustCompile(`(?m)^Errors: \S`)
	for file, iface := range map[string]string{"store.go": "Store", "processor/signal.go": "WorkSignal"} {
		f, err := parser.ParseFile(token.NewFileSet(), file, nil, parser.ParseComments)
		require.NoError(t, err)
		var methods *ast.FieldList
		ast.Inspect(f, func(n ast.Node) bool {
			if ts, ok := n.(*ast.TypeSpec); ok && ts.Name.Name == iface {
				methods = ts.Type.(*ast.InterfaceType).Methods
			}
			return methods == nil
		})
		require.NotNil(t, methods, "%s: no interface %s", file, iface)
		require.NotEmpty(t, methods.List, iface)
		for _, m := range methods.List {
			require.Len(t, m.Names, 1, "%s: an embedded interface", iface)
			require.Regexp(t, errorsParagraph, m.Doc.Text(), "%s.%s says what it returns on failure", iface, m.Names[0].Name)
		}
	}
}
