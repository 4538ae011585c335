package main

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/leasestore/leasestore/db"
	"github.com/leasestore/leasestore/internal/dbtest"
)

func TestVersion(t *testing.T) {
	t.Parallel()
	out := requireOK(t, "--version")
	reqs, err := db.Requirements()
	require.NoError(t, err)
	last := reqs[len(reqs)-1]
	require.Regexp(t, `^leasectl \S+\nlibrary github.com/leasestore/leasestore \S+`, out)
	require.Contains(t, out, fmt.Sprintf("migrations %d (newest %s)\n", last.Version, last.Name))
}

// TestDefaultDatabaseWarning: without --database-url or DATABASE_URL,
// leasectl names the database it falls back to.
func TestDefaultDatabaseWarning(t *testing.T) {
	t.Parallel()
	var stdout, stderr bytes.Buffer
	c := newCLI(&stdout, &stderr, func(string) string { return "" })
	_, err := c.poolConfig()
	require.NoError(t, err)
	_, err = c.poolConfig()
	require.NoError(t, err)
	require.Equal(t, "leasectl: neither --database-url nor DATABASE_URL is set: using database postgres@127.0.0.1:5432/postgres\n", stderr.String())

	stderr.Reset()
	c = newCLI(&stdout, &stderr, func(string) string { return "postgres://u@h/d" })
	_, err = c.poolConfig()
	require.NoError(t, err)
	require.Empty(t, stderr.String())
}

// TestNeverMigratedNamesTheDatabase: a store call on a database that was
// never migrated says so in one line, with the database.
func TestNeverMigratedNamesTheDatabase(t *testing.T) {
	t.Parallel()
	url := dbtest.NewEmptyDatabase(t)
	cfg, err := pgx.ParseConfig(url)
	require.NoError(t, err)
	r := leasectl(t, "list", "--queue", "inbox", "--database-url", url)
	require.Equal(t, 1, r.code, r.stderr)
	require.Contains(t, r.stderr, "the database was never migrated")
	require.Contains(t, r.stderr, "(database postgres@127.0.0.1:5432/"+cfg.Database+")")
	require.Equal(t, 1, bytes.Count([]byte(r.stderr), []byte("\n")), r.stderr)
}

// TestMigrateRoles applies the embedded db/roles.sql.
func TestMigrateRoles(t *testing.T) {
	t.Parallel()
	url := dbtest.DatabaseURL(t)
	dbtest.RolesMu.Lock()
	out := requireOK(t, "migrate", "roles", "--database-url", url)
	dbtest.RolesMu.Unlock()
	require.Contains(t, out, "roles leasestore_processor and leasestore_operator are current")
	conn, err := pgx.Connect(context.Background(), url)
	require.NoError(t, err)
	defer conn.Close(context.Background())
	var ok bool
	require.NoError(t, conn.QueryRow(t.Context(),
		"SELECT has_table_privilege('leasestore_operator', 'inbox_messages', 'DELETE')").Scan(&ok))
	require.True(t, ok)
	require.Equal(t, dbtest.RolesSQL(t), db.Roles())
}

// TestDoctorCompactByDefault: the plan trees only with --plans.
func TestDoctorCompactByDefault(t *testing.T) {
	t.Parallel()
	url := dbtest.DatabaseURL(t)
	compact := leasectl(t, "doctor", "--queue", "inbox", "--database-url", url)
	plans := leasectl(t, "doctor", "--queue", "inbox", "--plans", "--database-url", url)
	require.Equal(t, compact.code, plans.code, compact.stderr+plans.stderr)
	require.Contains(t, compact.stdout, "claim of 10:")
	short, long := strings.Split(compact.stdout, "\n"), strings.Split(plans.stdout, "\n")
	require.Greater(t, len(long), len(short)+3, plans.stdout)
	for _, l := range long {
		if strings.HasPrefix(l, "    ") {
			require.NotContains(t, short, l)
		}
	}
	require.Less(t, len(short), 15, compact.stdout)
}
