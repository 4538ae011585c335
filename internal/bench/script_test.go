package bench

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/leasestore/leasestore/gen"
	"github.com/leasestore/leasestore/leasing"
)

var update = flag.Bool("update", false, "rewrite the pgbench scripts from gen/")

// TestPgbenchScripts checks that the kept pgbench scripts hold the claim
// and complete statements exactly as sqlc generated them (parameters as
// pgbench variables). With -update it rewrites them.
func TestPgbenchScripts(t *testing.T) {
	t.Parallel()
	for _, q := range []leasing.Queue{leasing.Inbox, leasing.Outbox} {
		t.Run(string(q), func(t *testing.T) {
			t.Parallel()
			want := expectedScript(t, q)
			path := filepath.Join("pgbench", scriptName(q))
			if *update {
				require.NoError(t, os.WriteFile(path, []byte(want), 0o644))
				return
			}
			got, err := scripts.ReadFile("pgbench/" + scriptName(q))
			require.NoError(t, err)
			require.Equal(t, want, string(got), "%s is stale: run go test ./internal/bench -run TestPgbenchScripts -update", path)
		})
	}
}

// TestPgbenchSettings: the pgbench loop's session options set what
// UseHotPathSettings sets for the store's hot path (lock_timeout aside).
func TestPgbenchSettings(t *testing.T) {
	t.Parallel()
	settings := captured(t, func(db gen.DBTX) error {
		return gen.New().UseHotPathSettings(context.Background(), db, gen.UseHotPathSettingsParams{})
	})
	var want []string
	for _, m := range regexp.MustCompile(`set_config\('(\w+)', '([^']*)', true\)`).FindAllStringSubmatch(settings, -1) {
		want = append(want, "-c "+m[1]+"="+m[2])
	}
	require.Len(t, want, 2, "UseHotPathSettings: %s", settings)
	require.Equal(t, strings.Join(want, " "), hotPathOptions)
}

// expectedScript builds the pgbench script of queue q from the generated
// statements.
func expectedScript(t *testing.T, q leasing.Queue) string {
	g := gen.New()
	var claim, complete string
	if q == leasing.Outbox {
		claim = captured(t, func(db gen.DBTX) error {
			_, err := g.OutboxClaim(context.Background(), db, gen.OutboxClaimParams{})
			return err
		})
		complete = captured(t, func(db gen.DBTX) error {
			_, err := g.OutboxPublish(context.Background(), db, gen.OutboxPublishParams{})
			return err
		})
	} else {
		claim = captured(t, func(db gen.DBTX) error {
			_, err := g.InboxClaim(context.Background(), db, gen.InboxClaimParams{})
			return err
		})
		complete = captured(t, func(db gen.DBTX) error {
			_, err := g.InboxComplete(context.Background(), db, gen.InboxCompleteParams{})
			return err
		})
	}
	// Parameter order as in the generated methods: claim (except_topics,
	// topics, now, batch_size, lease_owner, lease_for), the baseline's
	// claim of every topic; complete (lease_owner, message_ids,
	// lease_generations, now).
	claim = params(t, body(claim), "'{}'", "'{}'", "NULL", ":batch", ":owner", ":lease_for")
	complete = params(t, body(complete), ":owner", ":ids", ":gens", "NULL")

	// \gset takes exactly one row: fold the claimed rows into arrays. The
	// final SELECT follows the last CTE's closing parenthesis; the rows it
	// adds for parked messages (UNION ALL) are left out, as the baseline
	// has none.
	i := strings.LastIndex(claim, ")\nSELECT ") + 1
	require.Positive(t, i, "claim has no final SELECT")
	require.Contains(t, claim[i:], "FROM claimed")
	claim = claim[:i] + `
SELECT count(*) AS n,
       array_agg(message_id ORDER BY created_at, message_id)::text AS ids,
       array_agg(lease_generation ORDER BY created_at, message_id)::text AS gens
FROM claimed
`
	statements := map[leasing.Queue]string{leasing.Inbox: "InboxClaim and InboxComplete", leasing.Outbox: "OutboxClaim and OutboxPublish"}
	return fmt.Sprintf(`-- Raw-SQL baseline of leasectl bench (%[1]s): one loop claims a batch
-- and completes it, with the %[2]s statements exactly as sqlc
-- generated them in gen/, parameters replaced by pgbench variables. The
-- claim's final SELECT folds the claimed rows into arrays, because \gset
-- takes one row. Set batch, owner and lease_for with -D; run with
-- -M prepared, as pgx does.
-- Generated: go test ./internal/bench -run TestPgbenchScripts -update
%[3]s\gset
\if :n > 0
%[4]s;
\endif
`, q, statements[q], claim, strings.TrimRight(complete, "\n"))
}

// body drops the "-- name:" line sqlc puts first.
func body(sql string) string {
	_, rest, ok := strings.Cut(sql, "\n")
	if !ok || !strings.HasPrefix(sql, "-- name:") {
		return sql
	}
	return strings.TrimLeft(rest, "\n")
}

// params replaces $1, $2, ... with vars[0], vars[1], ...
func params(t *testing.T, sql string, vars ...string) string {
	used := make([]bool, len(vars))
	out := regexp.MustCompile(`\$(\d+)`).ReplaceAllStringFunc(sql, func(m string) string {
		var n int
		_, err := fmt.Sscanf(m, "$%d", &n)
		require.NoError(t, err)
		require.True(t, n >= 1 && n <= len(vars), "unexpected parameter %s", m)
		used[n-1] = true
		return vars[n-1]
	})
	for i, u := range used {
		require.True(t, u, "parameter $%d unused: the statement changed shape", i+1)
	}
	return out
}

var errCaptured = errors.New("captured")

type captureDB struct{ sql string }

func (c *captureDB) Exec(_ context.Context, sql string, _ ...any) (pgconn.CommandTag, error) {
	c.sql = sql
	return pgconn.CommandTag{}, errCaptured
}

func (c *captureDB) Query(_ context.Context, sql string, _ ...any) (pgx.Rows, error) {
	c.sql = sql
	return nil, errCaptured
}

func (c *captureDB) QueryRow(context.Context, string, ...any) pgx.Row { panic("not used") }

func (c *captureDB) CopyFrom(context.Context, pgx.Identifier, []string, pgx.CopyFromSource) (int64, error) {
	panic("not used")
}

// captured returns the SQL text that call sends.
func captured(t *testing.T, call func(gen.DBTX) error) string {
	var c captureDB
	require.ErrorIs(t, call(&c), errCaptured)
	return c.sql
}
