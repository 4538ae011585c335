package leasing_test

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgtype"
	"github.com/stretchr/testify/require"
)

// mainInboxPurge is the inbox Purge statement before migration 00007 (main
// at 1a7595e, gen/inbox.sql.go): one DELETE over an OR of both kinds with
// no order, which reads the whole table whenever fewer than a batch of
// rows qualify. TestPurgeFigures measures it as "before".
const mainInboxPurge = `DELETE FROM inbox_messages
WHERE message_id IN (
    SELECT message_id
    FROM inbox_messages
    WHERE (status = 'completed'
           AND completed_at < coalesce($1::timestamptz, statement_timestamp()) - $2::interval)
       OR ($3::boolean AND status = 'dead_lettered'
           AND dead_lettered_at < coalesce($1::timestamptz, statement_timestamp()) - $2::interval)
    LIMIT $4::integer
    FOR UPDATE SKIP LOCKED
)`

// TestPurgeFigures prints the cost of one inbox Purge of 1,000 rows, before
// (main's statement, without the finish-time indexes) and after (the
// generated InboxPurge), on tables of finished rows, for the figures in
// docs/notes/2026-12-01-bounded-maintenance.md. It runs only when
// LEASESTORE_PURGE_FIGURES lists the table sizes, e.g.
//
//	LEASESTORE_PURGE_FIGURES=1000000,10000000 \
//	    go test -count=1 -timeout 60m -run TestPurgeFigures -v ./leasing
//
// Each table holds n completed rows finished a minute ago, n/10 dead
// letters, and, last in the heap, 2,000 of each kind finished two days
// ago. "nothing" purges with a 3-day cutoff (no row qualifies), "batch"
// with a 1-day one (a full batch qualifies), each with and without dead
// letters, on the custom and the generic plan. Each figure is the second
// of two runs, so the cache is warm; every run is rolled back.
func TestPurgeFigures(t *testing.T) {
	spec := os.Getenv("LEASESTORE_PURGE_FIGURES")
	if spec == "" {
		t.Skip("set LEASESTORE_PURGE_FIGURES=1000000,10000000 to measure")
	}
	after := generatedSQL(t, "../gen/inbox_purge.sql.go", "inboxPurge")
	q := queues[0]
	for _, f := range strings.Split(spec, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		require.NoError(t, err)
		conn := connect(t)
		ctx := t.Context()
		_, err = conn.Exec(ctx, "ALTER TABLE inbox_messages SET (autovacuum_enabled = off)")
		require.NoError(t, err)
		start := time.Now()
		seedFinished(t, conn, q, q.done, 0, n-1, "interval '1 minute'")
		seedFinished(t, conn, q, "dead_lettered", n, n+n/10-1, "interval '1 minute'")
		seedFinished(t, conn, q, q.done, 2*n, 2*n+1999, "interval '2 days'")
		seedFinished(t, conn, q, "dead_lettered", 3*n, 3*n+1999, "interval '2 days'")
		_, err = conn.Exec(ctx, "VACUUM (ANALYZE) inbox_messages")
		require.NoError(t, err)
		var pages int64
		require.NoError(t, conn.QueryRow(ctx, "SELECT pg_relation_size('inbox_messages') / 8192").Scan(&pages))
		t.Logf("purge figures: %d completed rows, %d dead letters, %d heap pages, seeded in %s",
			n+2000, n/10+2000, pages, time.Since(start).Round(time.Second))

		for _, version := range []struct{ name, sql, setup string }{
			{"before", mainInboxPurge, "DROP INDEX inbox_messages_completed_idx, inbox_messages_dead_lettered_idx"},
			{"after", after, ""},
		} {
			for _, mode := range []string{"force_custom_plan", "force_generic_plan"} {
				for _, c := range []struct{ name, olderThan string }{{"nothing", "'3 days'"}, {"batch", "'1 day'"}} {
					for _, dead := range []bool{false, true} {
						var root planNode
						for run := range 2 {
							tx, err := conn.Begin(ctx)
							require.NoError(t, err)
							if version.setup != "" {
								_, err = tx.Exec(ctx, version.setup)
								require.NoError(t, err)
							}
							_, err = tx.Exec(ctx, "SELECT set_config('plan_cache_mode', $1, true)", mode)
							require.NoError(t, err)
							sd, err := tx.Prepare(ctx, "purge_figures", version.sql)
							require.NoError(t, err)
							literal := map[uint32]string{
								pgtype.Int4OID: "1000", pgtype.TimestamptzOID: "NULL",
								pgtype.IntervalOID: c.olderThan, pgtype.BoolOID: fmt.Sprint(dead),
							}
							args := make([]string, len(sd.ParamOIDs))
							for i, oid := range sd.ParamOIDs {
								args[i] = literal[oid]
							}
							var out []struct {
								Plan          planNode
								ExecutionTime float64 `json:"Execution Time"`
							}
							require.NoError(t, tx.QueryRow(ctx, "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) EXECUTE purge_figures("+strings.Join(args, ", ")+")").Scan(&out))
							require.NoError(t, tx.Rollback(ctx))
							require.NoError(t, conn.Deallocate(ctx, "purge_figures"))
							root = out[0].Plan
							if run == 0 {
								continue
							}
							t.Logf("purge figures: rows=%d %s %s %s dead_letters=%v: %d buffers, %.1f ms",
								n, version.name, mode, c.name, dead, buffers(root), out[0].ExecutionTime)
						}
					}
				}
			}
		}
	}
}
