package leasing_test

import (
	"fmt"
	"regexp"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// maintenanceRows is the number of finished rows the maintenance plan tests
// seed per queue: enough that a read of the whole table (a few thousand
// pages) is far above any bound below.
const maintenanceRows = 150_000

// TestPurgePlan: Purge, with and without dead letters, on the custom and on
// the generic plan, reads finished rows through their finish-time indexes
// and costs the rows it deletes, not the table: a few pages when nothing
// qualifies, about a page per deleted row when a batch does. The rows that
// qualify are the last ones inserted, at the physical end of the table,
// where a Seq Scan would reach them only after every other page; the
// bounds are below a quarter of the table's pages.
func TestPurgePlan(t *testing.T) {
	t.Parallel()
	for _, q := range queues {
		t.Run(q.table, func(t *testing.T) {
			t.Parallel()
			conn := connect(t)
			ctx := t.Context()
			table := pgx.Identifier{q.table}.Sanitize()
			// Recent history first (kept by a one-day retention), then the
			// rows older than a day, last in the heap.
			seedFinished(t, conn, q, q.done, 0, maintenanceRows-1, "interval '1 minute'")
			seedFinished(t, conn, q, "dead_lettered", maintenanceRows, maintenanceRows+maintenanceRows/3, "interval '1 minute'")
			seedFinished(t, conn, q, q.done, 2*maintenanceRows, 2*maintenanceRows+199, "interval '2 days'")
			seedFinished(t, conn, q, "dead_lettered", 3*maintenanceRows, 3*maintenanceRows+199, "interval '2 days'")
			analyze(t, conn, q)
			var pages int64
			require.NoError(t, conn.QueryRow(ctx, "SELECT pg_relation_size($1::regclass) / 8192", table).Scan(&pages))
			t.Logf("%s: %d pages", q.table, pages)

			sql := generatedSQL(t, q.genFile, strings.Replace(q.genConst, "Claim", "Purge", 1))
			const batch = 50
			for _, mode := range []string{"force_custom_plan", "force_generic_plan"} {
				for _, dead := range []bool{false, true} {
					for _, c := range []struct {
						name      string
						olderThan string
						bound     int64
					}{
						{"nothing qualifies", "'3 days'", 20},
						{"a batch qualifies", "'1 day'", 8*batch + 50},
					} {
						name := fmt.Sprintf("%s, dead letters %v, %s", mode, dead, c.name)
						root := explainMaintenance(t, conn, sql, mode, map[uint32]string{
							pgtype.Int4OID:        fmt.Sprint(batch),
							pgtype.TimestamptzOID: "NULL",
							pgtype.IntervalOID:    c.olderThan,
							pgtype.BoolOID:        fmt.Sprint(dead),
						})
						var indexes []string
						walk(root, nil, func(n planNode, _ []planNode) {
							require.NotEqual(t, "Seq Scan", n.NodeType, "%s: %s", name, mustJSON(root))
							if n.IndexName != "" {
								indexes = append(indexes, n.IndexName)
							}
						})
						require.Contains(t, indexes, q.table+"_"+q.done+"_idx", name)
						if dead {
							require.Contains(t, indexes, q.table+"_dead_lettered_idx", name)
						}
						t.Logf("%s: %s: %d buffers", q.table, name, buffers(root))
						require.LessOrEqual(t, buffers(root), c.bound, "%s: %s", name, mustJSON(root))
						require.Less(t, buffers(root), pages/4, name)
					}
				}
			}
		})
	}
}

// TestRequeueBatchPlan: one batch of RequeueAll reads the dead letters
// through the dead-letter index, oldest first, and finds its rows through
// the primary key, at a cost bounded by the batch, on both plans, with
// many more finished rows and dead letters in the table than it takes.
func TestRequeueBatchPlan(t *testing.T) {
	t.Parallel()
	for _, q := range queues {
		t.Run(q.table, func(t *testing.T) {
			t.Parallel()
			conn := connect(t)
			ctx := t.Context()
			seedFinished(t, conn, q, q.done, 0, maintenanceRows-1, "interval '1 minute'")
			seedFinished(t, conn, q, "dead_lettered", maintenanceRows, maintenanceRows+maintenanceRows/10, "interval '1 minute'")
			analyze(t, conn, q)
			var pages int64
			require.NoError(t, conn.QueryRow(ctx, "SELECT pg_relation_size($1::regclass) / 8192", q.table).Scan(&pages))

			sql := generatedSQL(t, q.genFile, strings.Replace(q.genConst, "Claim", "RequeueBatch", 1))
			const batch = 20
			for _, mode := range []string{"force_custom_plan", "force_generic_plan"} {
				root := explainMaintenance(t, conn, sql, mode, map[uint32]string{
					pgtype.Int4OID:        fmt.Sprint(batch),
					pgtype.TimestamptzOID: "NULL",
				})
				require.Equal(t, float64(batch), root.ActualRows, mode)
				var indexes []string
				walk(root, nil, func(n planNode, _ []planNode) {
					require.NotEqual(t, "Seq Scan", n.NodeType, "%s: %s", mode, mustJSON(root))
					if n.IndexName != "" {
						indexes = append(indexes, n.IndexName)
					}
				})
				require.Contains(t, indexes, q.table+"_dead_lettered_idx", mode)
				require.Contains(t, indexes, q.table+"_pkey", mode)
				t.Logf("%s: requeue batch of %d, %s: %d buffers", q.table, batch, mode, buffers(root))
				require.LessOrEqual(t, buffers(root), int64(20*batch+50), "%s: %s", mode, mustJSON(root))
				require.Less(t, buffers(root), pages/4, mode)

				// Requeue by id: the ids' keys, not every dead letter.
				var ids string
				require.NoError(t, conn.QueryRow(ctx, `SELECT array_agg(message_id)::text FROM (SELECT message_id FROM `+q.table+`
					WHERE status = 'dead_lettered' ORDER BY random() LIMIT $1) AS s`, batch).Scan(&ids))
				root = explainMaintenance(t, conn, generatedSQL(t, q.genFile, strings.Replace(q.genConst, "Claim", "Requeue", 1)), mode,
					map[uint32]string{pgtype.TextArrayOID: pgQuote(ids) + "::text[]", pgtype.TimestamptzOID: "NULL"})
				require.Equal(t, float64(batch), root.ActualRows, mode)
				walk(root, nil, func(n planNode, _ []planNode) {
					require.NotEqual(t, "Seq Scan", n.NodeType, "%s: %s", mode, mustJSON(root))
					if n.IndexName != "" {
						// The ids' rows, and their ordering keys' rows, by primary key.
						keysPkey := strings.TrimSuffix(q.table, "_messages") + "_ordering_keys_pkey"
						require.Contains(t, []string{q.table + "_pkey", keysPkey}, n.IndexName, "requeue by id, %s: %s", mode, mustJSON(root))
					}
				})
				t.Logf("%s: requeue of %d ids, %s: %d buffers", q.table, batch, mode, buffers(root))
			}
		})
	}
}

// seedFinished inserts rows numbered from..to (inclusive) in the terminal
// status, finished age (an SQL interval expression) before now, in number
// order, with distinct created_at in 2020.
func seedFinished(t *testing.T, conn *pgx.Conn, q queue, status string, from, to int, age string) {
	t.Helper()
	at := q.doneAt
	if status == "dead_lettered" {
		at = "dead_lettered_at"
	}
	sql := fmt.Sprintf(`
		INSERT INTO %s (message_id, payload, created_at, visible_after, status,
		                lease_owner, lease_generation, attempt_count, last_error, %s)
		SELECT gen_random_uuid(), '\x01', c, c, $1::text, 'seed', 1, 1,
		       CASE WHEN $1::text = 'dead_lettered' THEN 'e' END,
		       now() - %s + (g - $2::int) * interval '1 microsecond'
		FROM (SELECT g, timestamptz '2020-01-01 00:00:00Z' + g * interval '1 millisecond' AS c
		      FROM generate_series($2::int, $3::int) AS g) AS s`,
		pgx.Identifier{q.table}.Sanitize(), pgx.Identifier{at}.Sanitize(), age)
	_, err := conn.Exec(t.Context(), sql, status, from, to)
	require.NoError(t, err)
}

// explainMaintenance prepares the generated statement sql and runs it once
// under EXPLAIN (ANALYZE, BUFFERS) with planMode as plan_cache_mode, in a
// transaction it rolls back, passing each parameter the literal that
// literals gives for its type, and returns the plan's root.
func explainMaintenance(t *testing.T, conn *pgx.Conn, sql, planMode string, literals map[uint32]string) planNode {
	t.Helper()
	ctx := t.Context()
	tx, err := conn.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, "SELECT set_config('plan_cache_mode', $1, true)", planMode)
	require.NoError(t, err)
	sd, err := tx.Prepare(ctx, "maintenance_plan", sql)
	require.NoError(t, err)
	defer func() { require.NoError(t, tx.Conn().Deallocate(ctx, "maintenance_plan")) }()
	args := make([]string, len(sd.ParamOIDs))
	for i, oid := range sd.ParamOIDs {
		l, ok := literals[oid]
		require.True(t, ok, "parameter $%d has type oid %d: add a literal for it", i+1, oid)
		args[i] = l
	}
	var out []struct{ Plan planNode }
	err = tx.QueryRow(ctx, "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) EXECUTE maintenance_plan("+strings.Join(args, ", ")+")").Scan(&out)
	require.NoError(t, err)
	require.Len(t, out, 1)
	return out[0].Plan
}

// TestReleaseOrphansPlan: ReleaseOrphans of an owner that holds 1,900 of
// its 2,000 unexpired leases (the processor passes every lease it holds)
// tests each of its leased rows against the held ids through a hash built
// once, on the custom and the generic plan, with the table never analyzed
// and then analyzed. A generic plan's filter `message_id <> ALL
// (($3)::uuid[])` cast the whole array again for every row it read, and
// plan_cache_mode auto chose that plan from the sixth call on tables never
// analyzed: with every lease held, 1.2 s a call instead of 3 ms at 2,000
// leases, 33 s instead of 12 ms at 10,000.
func TestReleaseOrphansPlan(t *testing.T) {
	t.Parallel()
	const leased, held = 2_000, 1_900
	paramCast := regexp.MustCompile(`\(\$\d+\)::uuid\[\]`)
	for _, q := range queues {
		t.Run(q.table, func(t *testing.T) {
			t.Parallel()
			conn := connect(t)
			ctx := t.Context()
			_, err := conn.Exec(ctx, "ALTER TABLE "+q.table+" SET (autovacuum_enabled = off)")
			require.NoError(t, err)
			seed(t, conn, q, q.done, 0, 49_999)
			seed(t, conn, q, q.inFlight, 100_000, 100_000+leased-1) // leased to 'seed'
			var ids string
			require.NoError(t, conn.QueryRow(ctx, `SELECT array_agg(message_id)::text FROM (SELECT message_id FROM `+q.table+`
				WHERE status = $1 ORDER BY random() LIMIT $2) AS s`, q.inFlight, held).Scan(&ids))

			sql := generatedSQL(t, q.genFile, strings.Replace(q.genConst, "Claim", "ReleaseOrphans", 1))
			for _, stats := range []string{"never analyzed", "analyzed"} {
				if stats == "analyzed" {
					analyze(t, conn, q)
				}
				for _, mode := range []string{"force_custom_plan", "force_generic_plan"} {
					name := stats + ", " + mode
					root := explainMaintenance(t, conn, sql, mode, map[uint32]string{
						pgtype.TextOID: "'seed'", pgtype.TimestamptzOID: "NULL", pgtype.TextArrayOID: pgQuote(ids) + "::text[]",
					})
					require.Equal(t, float64(leased-held), root.ActualRows, "%s: rows released", name)
					var filters []string
					walk(root, nil, func(n planNode, _ []planNode) {
						if n.Filter != "" {
							filters = append(filters, fmt.Sprintf("%s on %s: %.120s", n.NodeType, n.Relation, n.Filter))
						}
					})
					// Non-fatal, so that a failure shows every plan; the
					// filters, cut short: a custom plan's hold the ids.
					joined := strings.Join(filters, "\n")
					t.Logf("%s, %s: filters:\n%s", q.table, name, joined)
					assert.NotRegexp(t, paramCast, joined, "%s: the held ids are cast for every row", name)
					assert.Contains(t, joined, "hashed SubPlan", "%s: no hashed test of the held ids", name)
				}
			}
		})
	}
}
