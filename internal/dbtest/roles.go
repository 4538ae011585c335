package dbtest

import (
	"context"
	"errors"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"
)

// RolesSQL is db/roles.sql, the least-privilege roles file.
func RolesSQL(tb testing.TB) string {
	tb.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot(), "db", "roles.sql"))
	require.NoError(tb, err)
	return string(b)
}

// repoRoot is the checkout this file is in: tests run in their package's
// directory, which differs between callers.
func repoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

// RolesMu serialises the first application of db/roles.sql in this
// process: it creates cluster-wide roles. Later applications in other
// databases only grant.
var RolesMu sync.Mutex

// ApplyRoles runs db/roles.sql as the superuser on the database at url.
func ApplyRoles(tb testing.TB, url string) {
	tb.Helper()
	RolesMu.Lock()
	defer RolesMu.Unlock()
	conn := AdminConn(tb, url)
	_, err := conn.Exec(context.Background(), RolesSQL(tb)) // no arguments: simple protocol, many statements
	require.NoError(tb, err)
}

// LoginRole creates a login role that is a member of group, unique to this
// test, dropped when the test ends, and returns its name.
func LoginRole(tb testing.TB, adminURL, group string, attrs ...string) string {
	tb.Helper()
	name := RoleName(tb)
	conn := AdminConn(tb, adminURL)
	ident := pgx.Identifier{name}.Sanitize()
	_, err := conn.Exec(context.Background(), "CREATE ROLE "+ident+" LOGIN "+strings.Join(attrs, " ")+" IN ROLE "+pgx.Identifier{group}.Sanitize())
	require.NoError(tb, err)
	ExecAtEnd(tb, adminURL, "DROP ROLE IF EXISTS "+ident)
	return name
}

// ExecAtEnd runs stmts, in order, on a connection of its own to url when
// the test ends, and reports each that fails.
func ExecAtEnd(tb testing.TB, url string, stmts ...string) {
	tb.Cleanup(func() {
		c, err := pgx.Connect(context.Background(), url)
		if err != nil {
			tb.Errorf("%s: %v", stmts[0], err)
			return
		}
		defer c.Close(context.Background())
		for _, stmt := range stmts {
			if _, err := c.Exec(context.Background(), stmt); err != nil {
				tb.Errorf("%s: %v", stmt, err)
			}
		}
	})
}

// GrantedRole creates a login role in no group, unique to this test,
// grants it each of grants on the database of url (for example "SELECT ON
// inbox_messages"), and when the test ends revokes them (DROP OWNED BY)
// and drops the role. It returns the role's name.
func GrantedRole(tb testing.TB, url string, grants ...string) string {
	tb.Helper()
	name := RoleName(tb)
	ident := pgx.Identifier{name}.Sanitize()
	conn := AdminConn(tb, url)
	_, err := conn.Exec(context.Background(), "CREATE ROLE "+ident+" LOGIN")
	require.NoError(tb, err)
	ExecAtEnd(tb, url, "DROP OWNED BY "+ident, "DROP ROLE "+ident)
	for _, g := range grants {
		_, err := conn.Exec(context.Background(), "GRANT "+g+" TO "+ident)
		require.NoError(tb, err)
	}
	return name
}

// AsUser returns connection URL u with its user replaced.
func AsUser(tb testing.TB, u, user string) string {
	tb.Helper()
	parsed, err := url.Parse(u)
	require.NoError(tb, err)
	parsed.User = url.User(user)
	return parsed.String()
}

// IsPermissionDenied reports whether err is PostgreSQL's insufficient_privilege.
func IsPermissionDenied(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "42501"
}

// DropRole drops role on admin's server if it exists.
func DropRole(admin, role string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, admin)
	if err != nil {
		return err
	}
	defer c.Close(context.Background())
	_, err = c.Exec(ctx, "DROP ROLE IF EXISTS "+pgx.Identifier{role}.Sanitize())
	return err
}
