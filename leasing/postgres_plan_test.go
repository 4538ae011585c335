package leasing_test

import (
	"context"
	"encoding/json"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/stretchr/testify/require"

	"github.com/leasestore/leasestore/internal/dbtest"
)

// claimBatch is the batch size the plan tests claim.
const claimBatch = 10

// queue names one table and the generated claim statement that serves it.
type queue struct {
	claim    string // query name, for subtest names
	table    string
	inFlight string   // status while leased
	done     string   // success status
	doneAt   string   // success timestamp column
	genFile  string   // glob of the generated files of the queue's SQL
	genConst string   // unexported constant in genFile
	writes   []string // constants in genFile of the fenced writes
	vacuum   string   // constant in genFile of the vacuum policy's VACUUM
}

var queues = []queue{
	{"InboxClaim", "inbox_messages", "processing", "completed", "completed_at", "../gen/inbox_*.sql.go", "inboxClaim",
		[]string{"inboxRenew", "inboxRelease", "inboxComplete", "inboxFail", "inboxDeadLetter"}, "inboxVacuum"},
	{"OutboxClaim", "outbox_messages", "publishing", "published", "published_at", "../gen/outbox_*.sql.go", "outboxClaim",
		[]string{"outboxRenew", "outboxRelease", "outboxPublish", "outboxFail", "outboxDeadLetter"}, "outboxVacuum"},
}

// planNode is one node of EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON).
type planNode struct {
	NodeType   string     `json:"Node Type"`
	Subplan    string     `json:"Subplan Name"`
	IndexName  string     `json:"Index Name"`
	Filter     string     `json:"Filter"`
	Relation   string     `json:"Relation Name"`
	ActualRows float64    `json:"Actual Rows"`
	Loops      float64    `json:"Actual Loops"`
	SharedHit  int64      `json:"Shared Hit Blocks"`
	SharedRead int64      `json:"Shared Read Blocks"`
	Plans      []planNode `json:"Plans"`
}

func TestClaimPlan(t *testing.T) {
	t.Parallel()

	for _, q := range queues {
		t.Run(q.claim+"/UsesClaimIndexes", func(t *testing.T) {
			t.Parallel()
			conn := connect(t)
			sql := generatedSQL(t, q.genFile, q.genConst)

			// Old terminal history first, so that a scan of the table in
			// created_at order would have to pass all of it. Terminal rows
			// keep their last lease owner: with 20 of them per due row, a
			// generic plan that guessed a third of the table matched the
			// expiry probe once stopped a Seq Scan at the first match.
			seed(t, conn, q, q.done, 0, 199_999)
			seed(t, conn, q, "pending", 200_000, 209_999)
			seed(t, conn, q, q.inFlight, 210_000, 210_999)
			analyze(t, conn, q)

			for _, mode := range []string{"force_custom_plan", "force_generic_plan"} {
				root := explainClaim(t, conn, sql, mode)
				require.Equal(t, float64(claimBatch), root.ActualRows, "%s: rows claimed", mode)
				var indexes []string
				walk(root, nil, func(n planNode, ancestors []planNode) {
					require.NotEqual(t, "Seq Scan", n.NodeType, "%s: %s", mode, mustJSON(root))
					if n.IndexName != "" {
						indexes = append(indexes, n.IndexName)
					}
					if n.NodeType == "Sort" {
						for _, a := range ancestors {
							require.NotEqual(t, "LockRows", a.NodeType, "%s: sort beneath LockRows", mode)
						}
						// A sort may merge the two branches' batches, never more.
						for _, in := range n.Plans {
							require.LessOrEqual(t, in.ActualRows, float64(2*claimBatch), "%s: sort of %v rows", mode, in.ActualRows)
						}
					}
				})
				require.Contains(t, indexes, q.table+"_ready_idx", mode)
				require.Contains(t, indexes, q.table+"_inflight_idx", mode)
				require.Contains(t, indexes, q.table+"_expiry_idx", mode)
				t.Logf("%s %s: %d buffers", q.claim, mode, buffers(root))
			}
		})

		t.Run(q.claim+"/BuffersFlatInBacklog", func(t *testing.T) {
			t.Parallel()
			conn := connect(t)
			sql := generatedSQL(t, q.genFile, q.genConst)

			const n = 10_000
			seed(t, conn, q, "pending", 0, n-1)
			analyze(t, conn, q)
			small := buffers(explainClaim(t, conn, sql, "auto"))

			seed(t, conn, q, "pending", n, 10*n-1)
			analyze(t, conn, q)
			large := buffers(explainClaim(t, conn, sql, "auto"))

			t.Logf("%s: claim of %d at %d due rows: %d buffers; at %d: %d buffers", q.claim, claimBatch, n, small, 10*n, large)
			require.LessOrEqual(t, float64(large), 1.5*float64(small)+20)
		})
	}
}

// TestExpiredBranchSkipsFinishedLeases: rows leased and then finished since
// the last VACUUM leave entries with future expiries in *_inflight_idx that
// no scan ever kills; the claim's expired branch must not read them while no
// lease has expired (it asks *_expiry_idx first).
func TestExpiredBranchSkipsFinishedLeases(t *testing.T) {
	t.Parallel()
	for _, q := range queues {
		t.Run(q.table, func(t *testing.T) {
			t.Parallel()
			conn := connect(t)
			ctx := t.Context()
			sql := generatedSQL(t, q.genFile, q.genConst)
			table := pgx.Identifier{q.table}.Sanitize()
			_, err := conn.Exec(ctx, "ALTER TABLE "+table+" SET (autovacuum_enabled = off)")
			require.NoError(t, err)
			seed(t, conn, q, "pending", 0, 49_999)
			analyze(t, conn, q)

			// 20,000 leases taken and finished, as a drain leaves them.
			_, err = conn.Exec(ctx, fmt.Sprintf(`UPDATE %s SET status = $1, lease_owner = 'w',
				lease_expires_at = now() + interval '1 hour', lease_generation = lease_generation + 1
				WHERE created_at < timestamptz '2020-01-01 00:00:20Z'`, table), q.inFlight)
			require.NoError(t, err)
			_, err = conn.Exec(ctx, fmt.Sprintf(`UPDATE %s SET status = $1, %s = now(), lease_expires_at = NULL
				WHERE status = $2`, table, pgx.Identifier{q.doneAt}.Sanitize()), q.done, q.inFlight)
			require.NoError(t, err)

			for _, mode := range []string{"force_custom_plan", "force_generic_plan"} {
				root := explainClaim(t, conn, sql, mode)
				require.Equal(t, float64(claimBatch), root.ActualRows, mode)
				var expired *planNode
				walk(root, nil, func(n planNode, _ []planNode) {
					if n.Subplan == "CTE expired" {
						expired = &n
					}
				})
				require.NotNil(t, expired, "%s: %s", mode, mustJSON(root))
				t.Logf("%s %s: claim %d buffers, expired branch %d", q.table, mode, buffers(root), buffers(*expired))
				require.LessOrEqual(t, buffers(*expired), int64(5), "%s: %s", mode, mustJSON(*expired))
			}
		})
	}
}

// TestFencedWritePlans: renew and the outcome writes of a batch of 10
// leases find their rows through the primary key, on the generic plan the
// store uses and on a custom plan, and cost the same with 10,000 or
// 100,000 rows in flight, whether or not the statistics know of them. A
// table is analyzed when it is quiet; a drain then puts thousands of rows
// in flight, and a plan that read them through *_inflight_idx, which the
// statistics call empty, cost O(rows in flight) per batch (seconds per
// complete under a processor holding 1,000 leases).
func TestFencedWritePlans(t *testing.T) {
	t.Parallel()
	for _, q := range queues {
		t.Run(q.table, func(t *testing.T) {
			t.Parallel()
			conn := connect(t)
			seed(t, conn, q, q.done, 0, 9_999)
			seed(t, conn, q, "pending", 10_000, 19_999)
			analyze(t, conn, q) // nothing in flight yet
			measure := func(stats string) map[string]int64 {
				cost := map[string]int64{}
				ids := leasedIDs(t, conn, q, claimBatch)
				for _, name := range q.writes {
					sql := generatedSQL(t, q.genFile, name)
					for _, mode := range []string{"force_custom_plan", "force_generic_plan"} {
						root := explainWrite(t, conn, sql, mode, ids)
						require.Equal(t, rowsOut(name), root.ActualRows, "%s %s, %s: rows out", name, mode, stats)
						var pkey bool
						walk(root, nil, func(n planNode, _ []planNode) {
							require.NotEqual(t, "Seq Scan", n.NodeType, "%s %s, %s: %s", name, mode, stats, mustJSON(root))
							if n.IndexName != "" {
								require.Equal(t, q.table+"_pkey", n.IndexName, "%s %s, %s: %s", name, mode, stats, mustJSON(root))
								pkey = true
							}
						})
						require.True(t, pkey, "%s %s, %s: no primary-key lookup: %s", name, mode, stats, mustJSON(root))
						cost[name+" "+mode] = buffers(root)
					}
				}
				return cost
			}
			seed(t, conn, q, q.inFlight, 20_000, 29_999)
			small := measure("stale statistics")
			seed(t, conn, q, q.inFlight, 30_000, 119_999)
			large := measure("stale statistics")
			analyze(t, conn, q)
			analyzed := measure("analyzed")
			for k, v := range small {
				t.Logf("%s: %d buffers at 10k in flight, %d at 100k, %d at 100k analyzed", k, v, large[k], analyzed[k])
				require.LessOrEqual(t, float64(large[k]), 1.5*float64(v)+20, k)
				require.LessOrEqual(t, float64(analyzed[k]), 1.5*float64(v)+20, k)
			}
		})
	}
}

// rowsOut is how many rows the fenced write name returns when it applies
// every lease of a batch of claimBatch: renew and release return each
// lease; complete (publish), fail and dead letter only those they did not
// apply.
func rowsOut(name string) float64 {
	if strings.HasSuffix(name, "Renew") || strings.HasSuffix(name, "Release") {
		return claimBatch
	}
	return 0
}

// TestFencedWritesLinearInBatch: renew and the outcome writes of 1,000
// leases process about 100 times the rows of a batch of 10 (rows out of
// every plan node, summed over its loops) on the generic plan the store
// runs them on. A generic plan takes any array parameter for 10 elements,
// so a join it nests over the unnested input costs O(batch²): a complete
// of a few thousand leases, as a processor's writer sends under load, took
// seconds. (A custom plan knows the array's length; for 1,000 leases of a
// 20,000-row table it rightly prefers one sequential scan to 1,000 index
// lookups.)
func TestFencedWritesLinearInBatch(t *testing.T) {
	t.Parallel()
	for _, q := range queues {
		t.Run(q.table, func(t *testing.T) {
			t.Parallel()
			conn := connect(t)
			seed(t, conn, q, q.inFlight, 0, 19_999)
			analyze(t, conn, q)
			small, large := leasedIDs(t, conn, q, 10), leasedIDs(t, conn, q, 1_000)
			for _, name := range q.writes {
				sql := generatedSQL(t, q.genFile, name)
				const mode = "force_generic_plan"
				a, b := rowsProcessed(explainWrite(t, conn, sql, mode, small)), rowsProcessed(explainWrite(t, conn, sql, mode, large))
				t.Logf("%s: %.0f rows processed for 10 leases, %.0f for 1,000", name, a, b)
				require.LessOrEqual(t, b, 150*a, name)
			}
		})
	}
}

// TestFencedWritePlanAfterVacuum: a connection keeps the generic plan it
// made at a statement's first execution. Made while the table held a few
// rows (a fresh deployment), a fenced write's plan reads the table
// sequentially, and keeps doing so as the table grows: inserts do not
// replan it. The next VACUUM of the table updates its size statistics,
// which makes PostgreSQL plan the prepared statement again, now with a
// primary-key lookup. The processors' vacuum policy runs that VACUUM (the
// generated InboxVacuum / OutboxVacuum) at 5,000 dead rows, so the README's
// known limit lasts until then. The first half asserts the limit itself:
// when it fails, PostgreSQL no longer makes such a plan and the README
// should say so.
func TestFencedWritePlanAfterVacuum(t *testing.T) {
	t.Parallel()
	for _, q := range queues {
		t.Run(q.table, func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			conn := connect(t)
			// Autovacuum would replan at a moment of its choosing, and a
			// VACUUM of its running makes the policy's (SKIP_LOCKED) skip.
			_, err := conn.Exec(ctx, "ALTER TABLE "+pgx.Identifier{q.table}.Sanitize()+" SET (autovacuum_enabled = false)")
			require.NoError(t, err)
			_, err = conn.Exec(ctx, "SET plan_cache_mode = force_generic_plan")
			require.NoError(t, err)
			seed(t, conn, q, q.inFlight, 0, 9)
			statements := make(map[string]*pgconn.StatementDescription, len(q.writes))
			for _, name := range q.writes {
				statements[name], err = conn.Prepare(ctx, name, generatedSQL(t, q.genFile, name))
				require.NoError(t, err)
			}
			// plans runs every write once, rolled back, on its cached plan
			// and returns whether each read the table sequentially.
			plans := func(ids string) map[string]bool {
				seq := make(map[string]bool, len(statements))
				for name, sd := range statements {
					tx, err := conn.Begin(ctx)
					require.NoError(t, err)
					root := explainPrepared(t, tx, sd, ids)
					require.NoError(t, tx.Rollback(ctx))
					walk(root, nil, func(n planNode, _ []planNode) {
						if n.NodeType == "Seq Scan" && n.Relation == q.table {
							seq[name] = true
						}
					})
				}
				return seq
			}
			plans(leasedIDs(t, conn, q, claimBatch)) // the first execution makes the generic plan
			seed(t, conn, q, q.inFlight, 10, 49_999)
			before := plans(leasedIDs(t, conn, q, claimBatch))
			t.Logf("sequential reads at 50,000 rows before VACUUM: %v", before)
			require.NotEmpty(t, before, "no write kept a sequential plan: update the README's known limit")

			_, err = conn.Exec(ctx, generatedSQL(t, q.genFile, q.vacuum))
			require.NoError(t, err)
			after := plans(leasedIDs(t, conn, q, claimBatch))
			require.Empty(t, after, "sequential reads after VACUUM")
		})
	}
}

// rowsProcessed returns the rows every node of the plan returned, summed
// over its loops.
func rowsProcessed(root planNode) float64 {
	var n float64
	walk(root, nil, func(p planNode, _ []planNode) { n += p.ActualRows * p.Loops })
	return n
}

// leasedIDs returns n ids of in-flight rows leased by seed, as a uuid[] literal.
func leasedIDs(t *testing.T, conn *pgx.Conn, q queue, n int) string {
	t.Helper()
	var ids string
	err := conn.QueryRow(t.Context(), fmt.Sprintf(
		`SELECT array_agg(message_id)::text FROM (SELECT message_id FROM %s WHERE status = $1 ORDER BY random() LIMIT $2) AS s`,
		pgx.Identifier{q.table}.Sanitize()), q.inFlight, n).Scan(&ids)
	require.NoError(t, err)
	return ids
}

// explainWrite runs a generated fenced write under EXPLAIN (ANALYZE,
// BUFFERS) as a prepared statement, with planMode as plan_cache_mode, for
// the leases ids (a uuid[] literal) of owner 'seed' at generation 1, in a
// transaction it rolls back.
func explainWrite(t *testing.T, conn *pgx.Conn, sql, planMode, ids string) planNode {
	t.Helper()
	ctx := t.Context()
	tx, err := conn.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, "SELECT set_config('plan_cache_mode', $1, true)", planMode)
	require.NoError(t, err)
	sd, err := tx.Prepare(ctx, "fenced_write", sql)
	require.NoError(t, err)
	root := explainPrepared(t, tx, sd, ids)
	require.NoError(t, tx.Conn().Deallocate(ctx, "fenced_write"))
	return root
}

// explainPrepared runs the prepared fenced write sd under EXPLAIN (ANALYZE,
// BUFFERS) on tx, with the plan PostgreSQL has cached for it, for the
// leases ids (a uuid[] literal) of owner 'seed' at generation 1. EXECUTE
// takes literals, so each parameter gets one by its type: the statements
// have at most one of each, but for text[], where the first is the ids and
// a later one the error texts. The write takes effect in tx.
func explainPrepared(t *testing.T, tx pgx.Tx, sd *pgconn.StatementDescription, ids string) planNode {
	t.Helper()
	n := strings.Count(ids, ",") + 1
	literal := map[uint32]string{
		pgtype.Int8ArrayOID:     pgQuote("{"+strings.Repeat("1,", n-1)+"1}") + "::bigint[]",
		pgtype.TextOID:          "'seed'",
		pgtype.TimestamptzOID:   "NULL",
		pgtype.IntervalOID:      "'30 seconds'",
		pgtype.IntervalArrayOID: pgQuote("{"+strings.Repeat("1 second,", n-1)+"1 second}") + "::interval[]",
		pgtype.TextArrayOID:     pgQuote("{"+strings.Repeat("e,", n-1)+"e}") + "::text[]",
	}
	args := make([]string, len(sd.ParamOIDs))
	idsGiven := false
	for i, oid := range sd.ParamOIDs {
		l, ok := literal[oid]
		if oid == pgtype.TextArrayOID && !idsGiven {
			l, idsGiven = pgQuote(ids)+"::text[]", true
		}
		require.True(t, ok, "parameter $%d has type oid %d: add a literal for it", i+1, oid)
		args[i] = l
	}
	var out []struct{ Plan planNode }
	err := tx.QueryRow(t.Context(), "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) EXECUTE "+pgx.Identifier{sd.Name}.Sanitize()+"("+strings.Join(args, ", ")+")").Scan(&out)
	require.NoError(t, err)
	require.Len(t, out, 1)
	return out[0].Plan
}

// pgQuote quotes s as an SQL string literal.
func pgQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// connect opens a connection to a fresh migrated database.
func connect(t *testing.T) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(t.Context(), dbtest.DatabaseURL(t))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}

// seed inserts rows numbered from..to (inclusive) in status with distinct,
// increasing created_at in 2020, all due. Terminal rows carry their
// completion time; in-flight rows hold a lease for another hour.
func seed(t *testing.T, conn *pgx.Conn, q queue, status string, from, to int) {
	t.Helper()
	sql := fmt.Sprintf(`
		INSERT INTO %s (message_id, payload, created_at, visible_after, status,
		                lease_owner, lease_expires_at, lease_generation, attempt_count, %s)
		SELECT gen_random_uuid(), '\x01', c, c, $1::text,
		       CASE WHEN $1::text <> 'pending' THEN 'seed' END,
		       CASE WHEN $1::text = $2::text THEN now() + interval '1 hour' END,
		       CASE WHEN $1::text <> 'pending' THEN 1 ELSE 0 END,
		       CASE WHEN $1::text <> 'pending' THEN 1 ELSE 0 END,
		       CASE WHEN $1::text = $3::text THEN c END
		FROM (SELECT timestamptz '2020-01-01 00:00:00Z' + g * interval '1 millisecond' AS c
		      FROM generate_series($4::int, $5::int) AS g) AS s`,
		pgx.Identifier{q.table}.Sanitize(), pgx.Identifier{q.doneAt}.Sanitize())
	_, err := conn.Exec(t.Context(), sql, status, q.inFlight, q.done, from, to)
	require.NoError(t, err)
}

func analyze(t *testing.T, conn *pgx.Conn, q queue) {
	t.Helper()
	_, err := conn.Exec(t.Context(), "ANALYZE "+pgx.Identifier{q.table}.Sanitize())
	require.NoError(t, err)
}

// explainClaim runs the claim SQL once under EXPLAIN (ANALYZE, BUFFERS) in a
// transaction that it rolls back, with planMode as plan_cache_mode (pgx
// prepares statements, so after five runs PostgreSQL may pick a generic
// plan), and returns the plan's root.
func explainClaim(t *testing.T, conn *pgx.Conn, sql, planMode string) planNode {
	t.Helper()
	return explainScopedClaim(t, conn, sql, planMode, "{}", "{}")
}

// explainScopedClaim is explainClaim with the claim's topics and
// except_topics, each the text of an array such as {a,b}.
func explainScopedClaim(t *testing.T, conn *pgx.Conn, sql, planMode, topics, except string) planNode {
	t.Helper()
	ctx := t.Context()
	tx, err := conn.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()

	_, err = tx.Exec(ctx, "SELECT set_config('plan_cache_mode', $1, true)", planMode)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, "PREPARE claim_plan AS "+sql)
	require.NoError(t, err)
	var out []struct{ Plan planNode }
	err = tx.QueryRow(ctx, fmt.Sprintf(
		"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) EXECUTE claim_plan('%s', '%s', NULL, %d, 'plan-test', '30 seconds')",
		except, topics, claimBatch)).Scan(&out)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, "DEALLOCATE claim_plan")
	require.NoError(t, err)
	require.Len(t, out, 1)
	return out[0].Plan
}

// walk calls fn for n and every node beneath it, with the node's ancestors.
func walk(n planNode, ancestors []planNode, fn func(planNode, []planNode)) {
	fn(n, ancestors)
	for _, c := range n.Plans {
		walk(c, append(ancestors, n), fn)
	}
}

// buffers returns the shared blocks hit and read by the whole plan, which
// the root node's counters include.
func buffers(root planNode) int64 { return root.SharedHit + root.SharedRead }

// generatedSQL returns the string constant name declared in the Go files
// that match the glob pattern: the exact SQL that gen sends.
func generatedSQL(t *testing.T, pattern, name string) string {
	t.Helper()
	paths, err := filepath.Glob(pattern)
	require.NoError(t, err)
	for _, path := range paths {
		if s, ok := constantIn(t, path, name); ok {
			return s
		}
	}
	require.FailNow(t, "constant not found", "%s in %s", name, pattern)
	return ""
}

// constantIn returns the string constant name declared in the Go file at
// path, and whether the file declares it.
func constantIn(t *testing.T, path, name string) (string, bool) {
	t.Helper()
	src, err := os.ReadFile(path)
	require.NoError(t, err)
	file, err := parser.ParseFile(token.NewFileSet(), path, src, 0)
	require.NoError(t, err)
	for _, decl := range file.Decls {
		gd, ok := decl.(*ast.GenDecl)
		if !ok || gd.Tok != token.CONST {
			continue
		}
		for _, spec := range gd.Specs {
			vs := spec.(*ast.ValueSpec)
			for i, id := range vs.Names {
				if id.Name != name {
					continue
				}
				lit, ok := vs.Values[i].(*ast.BasicLit)
				require.True(t, ok && lit.Kind == token.STRING, "%s is not a string literal", name)
				s, err := strconv.Unquote(lit.Value)
				require.NoError(t, err)
				return s, true
			}
		}
	}
	return "", false
}

func mustJSON(v any) string {
	b, err := json.MarshalIndent(v, "", " ")
	if err != nil {
		panic(err)
	}
	return string(b)
}
