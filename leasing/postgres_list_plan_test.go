package leasing_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/leasestore/leasestore/leasing"
)

// TestListPlan: a page of List (one status) reads the list index, or the
// in-flight index for the in-flight status, from its cursor and
// costs O(page) buffers on the custom plan (the store sends List with
// UseCustomPlansAndLockTimeout: a generic plan cannot prove the partial
// index), at the head and in the middle of a status,
// with many more rows in the table than the page (pick: 100k rows per
// queue, 1M under -stress).
func TestListPlan(t *testing.T) {
	t.Parallel()
	rows := pick(100_000, 1_000_000)
	for _, q := range queues {
		t.Run(q.table, func(t *testing.T) {
			t.Parallel()
			conn := connect(t)
			ctx := t.Context()
			// Mostly finished history, then dead letters, then a backlog.
			seedFinished(t, conn, q, q.done, 0, rows*8/10, "interval '1 hour'")
			seedFinished(t, conn, q, "dead_lettered", rows*8/10+1, rows*9/10, "interval '1 hour'")
			seed(t, conn, q, "pending", rows*9/10+1, rows-rows/20)
			seed(t, conn, q, q.inFlight, rows-rows/20+1, rows)
			analyze(t, conn, q)
			var pages int64
			require.NoError(t, conn.QueryRow(ctx, "SELECT pg_relation_size($1::regclass) / 8192", q.table).Scan(&pages))
			var mid string
			require.NoError(t, conn.QueryRow(ctx, fmt.Sprintf(`SELECT format('(%%L, %%L)', created_at, message_id)
				FROM %s WHERE status = 'dead_lettered' ORDER BY created_at OFFSET %d LIMIT 1`,
				pgx.Identifier{q.table}.Sanitize(), rows/20)).Scan(&mid))
			midAt, midID, _ := strings.Cut(strings.Trim(mid, "()"), ", ")

			sql := generatedSQL(t, q.genFile, strings.Replace(q.genConst, "Claim", "List", 1))
			const page = 50
			for _, mode := range []string{"force_custom_plan"} {
				zero := "'0001-01-01Z', '00000000-0000-0000-0000-000000000000'"
				for _, c := range []struct {
					name, status, after, index string
				}{
					{"first completed", q.done, zero, q.table + "_list_idx"},
					{"first dead letters", "dead_lettered", zero, q.table + "_list_idx"},
					{"mid dead letters", "dead_lettered", midAt + ", " + midID, q.table + "_list_idx"},
					// The claim's ready index has the same order (it holds
					// failed rows too, read and skipped).
					{"first pending", "pending", zero, q.table + "_list_idx|" + q.table + "_ready_idx"},
					{"first in flight", q.inFlight, zero, q.table + "_inflight_idx"},
				} {
					name := mode + ", " + c.name
					args := pgQuote(c.status) + ", " + c.after + ", NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, " + fmt.Sprint(page)
					root := explainList(t, conn, sql, mode, args)
					require.Equal(t, float64(page), root.ActualRows, name)
					var indexes []string
					walk(root, nil, func(n planNode, _ []planNode) {
						require.NotEqual(t, "Seq Scan", n.NodeType, "%s: %s", name, mustJSON(root))
						require.NotEqual(t, "Sort", n.NodeType, "%s: %s", name, mustJSON(root))
						if n.IndexName != "" {
							indexes = append(indexes, n.IndexName)
						}
					})
					require.Len(t, indexes, 1, name)
					require.Contains(t, strings.Split(c.index, "|"), indexes[0], name)
					t.Logf("%s: %s: %d buffers (table %d pages)", q.table, name, buffers(root), pages)
					require.LessOrEqual(t, buffers(root), int64(2*page+20), "%s: %s", name, mustJSON(root))
				}
			}
		})
	}
}

// explainList runs the List statement sql once under EXPLAIN (ANALYZE,
// BUFFERS) with planMode, its parameters given as SQL literals in args.
func explainList(t *testing.T, conn *pgx.Conn, sql, planMode, args string) planNode {
	t.Helper()
	ctx := t.Context()
	tx, err := conn.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, "SELECT set_config('plan_cache_mode', $1, true)", planMode)
	require.NoError(t, err)
	_, err = tx.Prepare(ctx, "list_plan", sql)
	require.NoError(t, err)
	defer func() { require.NoError(t, tx.Conn().Deallocate(ctx, "list_plan")) }()
	var out []struct{ Plan planNode }
	require.NoError(t, tx.QueryRow(ctx, "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) EXECUTE list_plan("+args+")").Scan(&out))
	require.Len(t, out, 1)
	return out[0].Plan
}

// BenchmarkEnqueueListIndex measures what the list index (migration 00017)
// costs producers: enqueues of one message and of 100, with the index and
// with it dropped, on a fresh database each.
//
//	go test -run '^$' -bench BenchmarkEnqueueListIndex -benchtime 3000x ./leasing
func BenchmarkEnqueueListIndex(b *testing.B) {
	for _, index := range []bool{true, false} {
		for _, batch := range []int{1, 100} {
			b.Run(fmt.Sprintf("index=%v/batch=%d", index, batch), func(b *testing.B) {
				url := freshURL(b)
				s := openStore(b, url, leasing.Inbox, leasing.PostgresOptions{})
				if !index {
					_, err := s.Pool().Exec(b.Context(), "DROP INDEX inbox_messages_list_idx")
					require.NoError(b, err)
				}
				msgs := make([]leasing.NewMessage, batch)
				for i := range msgs {
					msgs[i] = leasing.NewMessage{Type: "bench", Payload: []byte(`{"n":1}`)}
				}
				b.ResetTimer()
				for range b.N {
					_, err := s.Enqueue(b.Context(), msgs...)
					require.NoError(b, err)
				}
				b.ReportMetric(float64(b.N*batch)/b.Elapsed().Seconds(), "msgs/s")
			})
		}
	}
}
