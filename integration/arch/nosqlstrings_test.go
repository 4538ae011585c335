package arch_test

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// No string-built SQL: every statement the module runs is a constant (the
// sqlc-generated queries in gen/, or a literal), with values passed as
// parameters. TestNoStringBuiltSQL parses every non-test .go file outside
// gen/ and tools/ and flags
//
//   - a call to Exec, Query, QueryRow (pgx and database/sql, with or without
//     a context), ExecContext, QueryContext, QueryRowContext, Prepare,
//     PrepareContext or pgx.Batch.Queue whose SQL argument is not a
//     constant expression (string literals, named constants, and + of those);
//   - fmt.Sprintf and friends whose format string holds SELECT, INSERT INTO,
//     UPDATE ... SET or DELETE FROM;
//   - a + concatenation of a string holding one of those keywords with
//     anything that is not a constant.
//
// Statements that cannot take parameters (CREATE/DROP DATABASE, LISTEN,
// EXPLAIN of a generated statement) are allowed per file and function in
// sqlStringAllowlist, each with its reason; identifiers in them must be
// quoted with pgx.Identifier.Sanitize. Test files are not checked: tests
// build DDL and fault-injection statements freely.

// sqlStringAllowlist names the functions allowed to run non-constant SQL.
var sqlStringAllowlist = []struct{ file, fn, reason string }{
	{"internal/dbtest/dbtest.go", "buildTemplate", "CREATE/ALTER/DROP DATABASE of the migration template, names quoted with pgx.Identifier"},
	{"internal/dbtest/run.go", "dropObjects", "DROP ROLE of a dead run's per-test role (DDL takes no parameters), name quoted with pgx.Identifier"},
	{"internal/dbtest/roles.go", "ApplyRoles", "runs db/roles.sql, a constant file of many statements (simple protocol, no parameters)"},
	{"db/roles.go", "ApplyRoles", "runs db/roles.sql, the embedded constant file of many statements (simple protocol, no parameters)"},
	{"internal/dbtest/roles.go", "LoginRole", "CREATE ROLE of a per-test role (DDL takes no parameters), names quoted with pgx.Identifier"},
	{"internal/dbtest/roles.go", "GrantedRole", "CREATE ROLE and GRANT to a per-test role (DDL takes no parameters), names quoted with pgx.Identifier"},
	{"internal/dbtest/roles.go", "ExecAtEnd", "runs the DROP statements a test registered for its end (DDL takes no parameters)"},
	{"internal/dbtest/roles.go", "DropRole", "DROP ROLE of a per-test role (DDL takes no parameters), name quoted with pgx.Identifier"},
	{"internal/dbtest/store.go", "WaitStatus", "test helper: table name from the fixed two-table list (TableOf); the id is a parameter"},
	{"internal/pgadmin/pgadmin.go", "Exec", "runs CREATE/DROP DATABASE (DDL takes no parameters), names quoted with pgx.Identifier"},
	{"leasing/postgres_listener.go", "listen", "LISTEN takes no parameters; the channel is one of two fixed table names quoted with pgx.Identifier"},
	{"internal/explain/explain.go", "explainRolledBack", "a constant EXPLAIN prefix + the sqlc-generated claim statement, and the same statement prepared under a constant name for the generic plan; values stay parameters"},
	{"internal/pgbatch/pgbatch.go", "Exec", "Recorder queues the sqlc-generated statement and arguments a gen method passes it, unchanged, for one pgx.Batch"},
	{"internal/pgbatch/pgbatch.go", "Query", "Recorder queues the sqlc-generated statement and arguments a gen method passes it, unchanged, for one pgx.Batch"},
	{"internal/pgbatch/pgbatch.go", "QueryRow", "Recorder queues the sqlc-generated statement and arguments a gen method passes it, unchanged, for one pgx.Batch"},
	{"internal/bench/database.go", "fill", "benchmark fixture: table and column names from the fixed two-table list, quoted with pgx.Identifier; values are parameters; VACUUM takes no parameters"},
	{"internal/bench/database.go", "fillTopic", "benchmark fixture: table and topic column names from the fixed two-table list, quoted with pgx.Identifier; values are parameters; VACUUM takes no parameters"},
	{"internal/bench/database.go", "truncate", "TRUNCATE of one of the two fixed tables and its key table, quoted with pgx.Identifier"},
	{"internal/bench/database.go", "outOfOrder", "benchmark check: table and column names from the fixed two-table list, quoted with pgx.Identifier"},
	{"internal/bench/database.go", "verify", "benchmark check: table name from the fixed two-table list, quoted with pgx.Identifier"},
}

type sqlFinding struct {
	file string // slash path from the module root
	line int
	fn   string // enclosing function, "" at package level
	what string
}

func (f sqlFinding) String() string {
	return fmt.Sprintf("%s:%d (%s): %s", f.file, f.line, f.fn, f.what)
}

func TestNoStringBuiltSQL(t *testing.T) {
	t.Parallel()
	findings, err := findStringBuiltSQL("../..")
	require.NoError(t, err)
	var bad []string
	used := map[int]bool{}
	for _, f := range findings {
		i := slices.IndexFunc(sqlStringAllowlist, func(a struct{ file, fn, reason string }) bool {
			return a.file == f.file && a.fn == f.fn
		})
		if i < 0 {
			bad = append(bad, f.String())
			continue
		}
		used[i] = true
	}
	for i, a := range sqlStringAllowlist {
		if !used[i] {
			t.Logf("allowlist entry %s %s matches nothing (file changed or gone); remove it when it stays so", a.file, a.fn)
		}
	}
	require.Empty(t, bad, "SQL built from strings: pass values as parameters and add a query to db/queries, "+
		"or, for a statement that takes no parameters, quote identifiers with pgx.Identifier and add the function "+
		"to sqlStringAllowlist in integration/arch/nosqlstrings_test.go with the reason")
}

// TestNoStringBuiltSQLCatches proves the checker flags the forms it
// claims to, and lets constants through.
func TestNoStringBuiltSQLCatches(t *testing.T) {
	t.Parallel()
	src := `package p
const q = "SELECT 1"
const prefix = "SELECT "
const tmpl = "DELETE FROM %s WHERE id = $1"
func bad(ctx context.Context, pool *pgxpool.Pool, table, col string, db *sql.DB, b *pgx.Batch) {
	pool.Exec(ctx, fmt.Sprintf("DELETE FROM %s", table))              // 6: Exec arg + Sprintf
	pool.Query(ctx, "SELECT "+col+" FROM t")                             // 7: Query arg + concat
	pool.QueryRow(ctx, prefix+col)                                        // 8: QueryRow arg
	db.ExecContext(ctx, table)                                           // 9: ExecContext arg
	db.Query(table)                                                      // 10: database/sql Query
	b.Queue("UPDATE t SET a = " + col)                                   // 11: Batch.Queue + concat
	s := fmt.Sprintf("INSERT INTO %s VALUES (1)", table)                 // 12: Sprintf
	_ = "UPDATE x SET y = 1 WHERE z = '" + col + "'"                     // 13: concat
	_ = fmt.Sprintf(tmpl, table)                                         // 14: Sprintf of a constant template
	_ = s
}
func good(ctx context.Context, pool *pgxpool.Pool, id int, s Store) {
	pool.Exec(ctx, q, id)
	pool.Exec(ctx, "UPDATE t SET a = $1", id)
	pool.QueryRow(ctx, prefix+"1")
	pool.Query(ctx, ` + "`SELECT 1`" + `)
	_ = s.Queue()
	_ = fmt.Sprintf("update %s", "prose, lower case")
}
`
	fset := token.NewFileSet()
	file, err := parser.ParseFile(fset, "p.go", src, 0)
	require.NoError(t, err)
	findings := checkSQLFile(fset, file, "p.go", constNames(file))
	lines := map[int]bool{}
	for _, f := range findings {
		lines[f.line] = true
		require.Equal(t, "bad", f.fn, f.String())
	}
	for _, line := range []int{6, 7, 8, 9, 10, 11, 12, 13, 14} {
		require.True(t, lines[line], "line %d not flagged; findings: %v", line, findings)
	}
}

// findStringBuiltSQL checks every non-test .go file under root except gen/,
// tools/, testdata and hidden directories.
func findStringBuiltSQL(root string) ([]sqlFinding, error) {
	fset := token.NewFileSet()
	byDir := map[string][]*ast.File{}
	paths := map[*ast.File]string{}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			name := d.Name()
			if rel == "gen" || rel == "tools" || name == "testdata" || name == "vendor" || (strings.HasPrefix(name, ".") && rel != ".") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		file, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		dir := filepath.Dir(rel)
		byDir[dir] = append(byDir[dir], file)
		paths[file] = rel
		return nil
	})
	if err != nil {
		return nil, err
	}
	var out []sqlFinding
	for _, files := range byDir {
		consts := map[string]string{}
		for _, f := range files {
			for name, text := range constNames(f) {
				consts[name] = text
			}
		}
		for _, f := range files {
			out = append(out, checkSQLFile(fset, f, paths[f], consts)...)
		}
	}
	slices.SortFunc(out, func(a, b sqlFinding) int {
		if c := strings.Compare(a.file, b.file); c != 0 {
			return c
		}
		return a.line - b.line
	})
	return out, nil
}

// constNames returns every constant a file declares, with its text when
// its value is a string literal.
func constNames(f *ast.File) map[string]string {
	names := map[string]string{}
	ast.Inspect(f, func(n ast.Node) bool {
		if d, ok := n.(*ast.GenDecl); ok && d.Tok == token.CONST {
			for _, spec := range d.Specs {
				vs := spec.(*ast.ValueSpec)
				for i, name := range vs.Names {
					names[name.Name] = ""
					if i < len(vs.Values) {
						names[name.Name] = literalText(vs.Values[i], nil)
					}
				}
			}
		}
		return true
	})
	return names
}

// sqlKeywords matches DML, upper case as SQL is written in this
// repository: a text that starts with SELECT, or holds SELECT ... FROM,
// INSERT INTO, UPDATE ... SET or DELETE FROM. Prose that merely names a
// function to run ("or SELECT pg_terminate_backend(42)") does not match.
var sqlKeywords = regexp.MustCompile(`^\s*SELECT\s|\bSELECT\s[\s\S]*\bFROM\b|\bINSERT\s+INTO\b|\bUPDATE\s+\S+\s+SET\b|\bDELETE\s+FROM\b`)

// sqlArg returns the SQL argument of a call to a statement-running method,
// or nil when the call is not one.
func sqlArg(call *ast.CallExpr) ast.Expr {
	sel, ok := call.Fun.(*ast.SelectorExpr)
	if !ok || len(call.Args) == 0 {
		return nil
	}
	args := call.Args
	switch sel.Sel.Name {
	case "Exec", "Query", "QueryRow":
		// pgx: (ctx, sql, args...); database/sql: (sql, args...).
		if len(args) >= 2 && contextish(args[0]) {
			return args[1]
		}
		return args[0]
	case "ExecContext", "QueryContext", "QueryRowContext", "PrepareContext":
		if len(args) >= 2 {
			return args[1]
		}
	case "Prepare":
		if len(args) == 3 { // pgx: (ctx, name, sql)
			return args[2]
		}
		return args[0]
	case "Queue": // pgx.Batch.Queue(sql, args...); Store.Queue() has no arguments
		return args[0]
	}
	return nil
}

// contextish reports whether e looks like a context argument.
func contextish(e ast.Expr) bool {
	switch e := e.(type) {
	case *ast.Ident:
		return strings.Contains(strings.ToLower(e.Name), "ctx")
	case *ast.SelectorExpr:
		return strings.Contains(strings.ToLower(e.Sel.Name), "ctx")
	case *ast.CallExpr:
		if sel, ok := e.Fun.(*ast.SelectorExpr); ok {
			switch sel.Sel.Name {
			case "Background", "TODO", "Context", "WithoutCancel":
				return true
			}
		}
	}
	return false
}

// constant reports whether e is built from string literals and named
// constants only.
func constant(e ast.Expr, consts map[string]string) bool {
	switch e := e.(type) {
	case *ast.BasicLit:
		return e.Kind == token.STRING
	case *ast.Ident:
		_, ok := consts[e.Name]
		return ok
	case *ast.ParenExpr:
		return constant(e.X, consts)
	case *ast.BinaryExpr:
		return e.Op == token.ADD && constant(e.X, consts) && constant(e.Y, consts)
	}
	return false
}

// literalText returns the value of a string literal or of a constant
// declared as one, else "".
func literalText(e ast.Expr, consts map[string]string) string {
	switch e := e.(type) {
	case *ast.BasicLit:
		if s, err := strconv.Unquote(e.Value); err == nil && e.Kind == token.STRING {
			return s
		}
	case *ast.Ident:
		return consts[e.Name]
	}
	return ""
}

// concatHasSQL reports whether a + expression has a literal operand that
// holds a DML keyword.
func concatHasSQL(e ast.Expr, consts map[string]string) bool {
	switch e := e.(type) {
	case *ast.BinaryExpr:
		return e.Op == token.ADD && (concatHasSQL(e.X, consts) || concatHasSQL(e.Y, consts))
	case *ast.ParenExpr:
		return concatHasSQL(e.X, consts)
	}
	return sqlKeywords.MatchString(literalText(e, consts))
}

func checkSQLFile(fset *token.FileSet, f *ast.File, path string, consts map[string]string) []sqlFinding {
	var out []sqlFinding
	seen := map[int]bool{}
	report := func(fn string, pos token.Pos, what string) {
		line := fset.Position(pos).Line
		if !seen[line] {
			seen[line] = true
			out = append(out, sqlFinding{file: path, line: line, fn: fn, what: what})
		}
	}
	check := func(fn string, root ast.Node) {
		ast.Inspect(root, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.CallExpr:
				if arg := sqlArg(n); arg != nil && !constant(arg, consts) {
					report(fn, n.Pos(), fmt.Sprintf("%s with a non-constant SQL argument", n.Fun.(*ast.SelectorExpr).Sel.Name))
				}
				if sel, ok := n.Fun.(*ast.SelectorExpr); ok {
					if pkg, ok := sel.X.(*ast.Ident); ok && pkg.Name == "fmt" && len(n.Args) > 0 {
						format := n.Args[0]
						if strings.HasPrefix(sel.Sel.Name, "F") || strings.HasPrefix(sel.Sel.Name, "Append") {
							if len(n.Args) < 2 {
								return true
							}
							format = n.Args[1]
						}
						if sqlKeywords.MatchString(literalText(format, consts)) {
							report(fn, n.Pos(), "fmt."+sel.Sel.Name+" builds SQL")
						}
					}
				}
			case *ast.BinaryExpr:
				if n.Op == token.ADD && !constant(n, consts) && concatHasSQL(n, consts) {
					report(fn, n.Pos(), "SQL concatenated with a non-constant")
					return false
				}
			}
			return true
		})
	}
	for _, decl := range f.Decls {
		if fd, ok := decl.(*ast.FuncDecl); ok {
			check(fd.Name.Name, fd)
		} else {
			check("", decl)
		}
	}
	return out
}
