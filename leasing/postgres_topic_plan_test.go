package leasing_test

import (
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// seedTopic inserts pending rows numbered from..to (inclusive) of topic
// (the message type on the inbox), due, with created_at as seed gives.
func seedTopic(t *testing.T, conn *pgx.Conn, q queue, topic string, from, to int) {
	t.Helper()
	column := "topic"
	if strings.HasPrefix(q.table, "inbox") {
		column = "message_type"
	}
	sql := fmt.Sprintf(`
		INSERT INTO %s (message_id, payload, created_at, visible_after, %s)
		SELECT gen_random_uuid(), '\x01', c, c, $1::text
		FROM (SELECT timestamptz '2020-01-01 00:00:00Z' + g * interval '1 millisecond' AS c
		      FROM generate_series($2::int, $3::int) AS g) AS s`,
		pgx.Identifier{q.table}.Sanitize(), pgx.Identifier{column}.Sanitize())
	_, err := conn.Exec(t.Context(), sql, topic, from, to)
	require.NoError(t, err)
}

// TestTopicClaimCost: with n due rows of another topic ahead in FIFO order
// (plus n finished rows), a claim of 10 for one topic, and an unscoped
// claim while that other topic is paused, each cost at most 1.5 times the
// buffers of the unscoped claim with nothing paused (plus 20 buffers for
// a paused claim's descents per topic), on the custom and the generic
// plan. n is 50,000 in make test; LEASESTORE_STRESS=1 (make stress) runs
// the 1,000,000 rows of the target.
func TestTopicClaimCost(t *testing.T) {
	t.Parallel()
	n := 50_000
	if os.Getenv("LEASESTORE_STRESS") != "" {
		n = 1_000_000
	}
	for _, q := range queues {
		t.Run(q.claim, func(t *testing.T) {
			t.Parallel()
			conn := connect(t)
			sql := generatedSQL(t, q.genFile, q.genConst)
			seed(t, conn, q, q.done, 0, n-1)
			seedTopic(t, conn, q, "other", n, 2*n-1)
			seedTopic(t, conn, q, "target", 2*n, 2*n+999)
			analyze(t, conn, q)

			// The second of two runs of each: a warm cache.
			run := func(mode, topics string) planNode {
				explainScopedClaim(t, conn, sql, mode, topics, "{}")
				return explainScopedClaim(t, conn, sql, mode, topics, "{}")
			}
			for _, mode := range []string{"force_custom_plan", "force_generic_plan"} {
				all := run(mode, "{}")
				require.Equal(t, float64(claimBatch), all.ActualRows, "%s: unscoped rows", mode)
				scoped := run(mode, "{target}")
				require.Equal(t, float64(claimBatch), scoped.ActualRows, "%s: scoped rows", mode)
				var indexes []string
				walk(scoped, nil, func(n planNode, _ []planNode) {
					if n.IndexName != "" && n.ActualRows > 0 {
						indexes = append(indexes, n.IndexName)
					}
				})
				require.Contains(t, indexes, q.table+"_topic_ready_idx", "%s: %s", mode, mustJSON(scoped))
				t.Logf("%s %s, %d rows of another topic ahead: unscoped %d buffers, one topic %d",
					q.claim, mode, n, buffers(all), buffers(scoped))
				require.LessOrEqual(t, float64(buffers(scoped)), 1.5*float64(buffers(all)), "%s: %s", mode, mustJSON(scoped))
			}

			_, err := conn.Exec(t.Context(), "INSERT INTO leasestore_paused (queue, topic, paused_by) VALUES ($1, 'other', 'plan-test')",
				strings.TrimSuffix(q.table, "_messages"))
			require.NoError(t, err)
			for _, mode := range []string{"force_custom_plan", "force_generic_plan"} {
				all := run(mode, "{}")
				require.Equal(t, float64(claimBatch), all.ActualRows, "%s: rows past the paused topic", mode)
				t.Logf("%s %s, %d paused rows ahead: unscoped %d buffers", q.claim, mode, n, buffers(all))
				_, err := conn.Exec(t.Context(), "DELETE FROM leasestore_paused")
				require.NoError(t, err)
				base := run(mode, "{}")
				_, err = conn.Exec(t.Context(), "INSERT INTO leasestore_paused (queue, topic, paused_by) VALUES ($1, 'other', 'plan-test')",
					strings.TrimSuffix(q.table, "_messages"))
				require.NoError(t, err)
				require.LessOrEqual(t, float64(buffers(all)), 1.5*float64(buffers(base))+20, "%s: %s", mode, mustJSON(all))
			}
		})
	}
}
