// Package explain runs a queue's claim statement under EXPLAIN (ANALYZE,
// BUFFERS) and reads the plan: its shape, the indexes it scans and what it
// cost. leasectl doctor and the benchmark use it; the statement is the
// sqlc-generated claim that leasing.Postgres.Claim sends, captured from the
// generated function with the parameters Claim passes it.
package explain

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/leasestore/leasestore/gen"
	"github.com/leasestore/leasestore/internal/pgbatch"
	"github.com/leasestore/leasestore/leasing"
)

// ClaimPlan is how PostgreSQL ran one claim: the plan and what it cost, from
// EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON).
type ClaimPlan struct {
	// BatchSize is the batch size the claim asked for.
	BatchSize int
	// Rows is the number of rows the claim leased (then gave back).
	Rows int
	// Buffers is the number of shared buffers (8 KiB pages) the executed
	// plan touched, hit in shared_buffers plus read from the OS: the claim's
	// I/O cost, independent of cache state. Planning is not included.
	Buffers int64
	// SharedHit and SharedRead split Buffers into pages found in
	// shared_buffers and pages read from the OS.
	SharedHit, SharedRead int64
	// TempBlocks is the number of temporary-file blocks (8 KiB) read plus
	// written, e.g. by a sort that spilled to disk; 0 for a healthy claim.
	TempBlocks int64
	// Duration is the execution time PostgreSQL reported, at microsecond
	// resolution; it leaves out planning and the network round trip.
	Duration time.Duration
	// PlanningDuration is the planning time PostgreSQL reported.
	PlanningDuration time.Duration
	// Nodes is the plan shape in pre-order, one node per entry, indented two
	// spaces per level, e.g. "    Index Scan using inbox_messages_ready_idx
	// on inbox_messages".
	Nodes []string
	// Indexes lists the indexes the plan scans, in plan order, each once.
	Indexes []string
	// SeqScan is true when any node reads a whole table sequentially.
	SeqScan bool
	// SortOverEligible is true when the claim sorts the eligible rows instead
	// of reading them in index order: a Sort beneath LockRows (the sort then
	// cannot stop after BatchSize rows), or a Sort fed more than twice
	// BatchSize rows (an Incremental Sort, which sorts one group of equal
	// leading keys at a time, 64 rows more).
	SortOverEligible bool
	// JIT is true when PostgreSQL compiled parts of the plan with JIT, which
	// costs milliseconds per claim; raise jit_above_cost or turn jit off.
	JIT bool
	// Raw is the EXPLAIN output as PostgreSQL returned it.
	Raw json.RawMessage
}

// Options configures Claim and ClaimGeneric. The zero value explains at
// the database's clock.
type Options struct {
	// Now, when not nil, pins the clock the claim uses in place of the
	// database's, as leasing.PostgresOptions.Now does for a store.
	Now func() time.Time
	// Topics, when not empty, explains the claim of a topic-scoped
	// processor: leasing.ClaimRequest.Topics, with its rules.
	Topics []string
}

// explainOwner is the lease owner of the claims Claim rolls back.
const explainOwner = "leasestore-explain"

// explainPrefix turns the generated claim statement into its EXPLAIN.
const explainPrefix = "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) "

// Claim runs the claim statement of queue q that leasing.Postgres.Claim
// runs, with batchSize rows, no tenant and opts.Topics, on pool under EXPLAIN (ANALYZE,
// BUFFERS) in a transaction that it always rolls back, and returns the plan
// and its cost.
//
// The claim really executes: for the duration of the call it locks up to
// batchSize due rows (concurrent claims skip them), and the rolled-back
// update leaves up to batchSize dead row versions for VACUUM. Nothing is
// committed. The statement is the generated one (db/queries InboxClaim or
// OutboxClaim) with the same parameters Claim sends, planned for those
// parameter values: the custom plan PostgreSQL gives a prepared claim.
//
// Errors: a *leasing.ArgumentError when batchSize is not
// 1..leasing.MaxBatchSize or q is not a queue; otherwise the driver error,
// or an error when the EXPLAIN output cannot be parsed.
func Claim(ctx context.Context, pool *pgxpool.Pool, q leasing.Queue, batchSize int, opts Options) (ClaimPlan, error) {
	return explainClaim(ctx, pool, q, batchSize, opts, false)
}

// ClaimGeneric is Claim with the generic plan: the plan PostgreSQL reuses
// for a prepared claim without looking at its parameter values, and the
// plan leasing.Postgres.Claim and CompleteAndClaim run on, with their
// settings (gen.UseHotPathSettings: a forced generic plan, no JIT). It
// prepares the claim as leasestore_explain_claim on one connection and
// deallocates it before returning.
//
// Errors: as for Claim.
func ClaimGeneric(ctx context.Context, pool *pgxpool.Pool, q leasing.Queue, batchSize int, opts Options) (ClaimPlan, error) {
	return explainClaim(ctx, pool, q, batchSize, opts, true)
}

// explainLockTimeout is the lock_timeout of an explained generic claim,
// leasing.DefaultLockTimeout, as the text the settings statement takes.
var explainLockTimeout = fmt.Sprintf("%dms", leasing.DefaultLockTimeout.Milliseconds())

// explainPrepared names the prepared claim ClaimGeneric explains.
const explainPrepared = "leasestore_explain_claim"

func explainClaim(ctx context.Context, pool *pgxpool.Pool, q leasing.Queue, batchSize int, opts Options, generic bool) (ClaimPlan, error) {
	r := leasing.ClaimRequest{Owner: explainOwner, BatchSize: batchSize, LeaseFor: 30 * time.Second, Topics: opts.Topics}
	if err := r.Validate(); err != nil {
		return ClaimPlan{}, err
	}
	var now *time.Time
	if opts.Now != nil {
		t := opts.Now()
		now = &t
	}
	stmt, err := claimStatement(ctx, q, r, now)
	if err != nil {
		return ClaimPlan{}, err
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return ClaimPlan{}, fmt.Errorf("explain: claim %s: %w", q, err)
	}
	defer conn.Release()
	raw, err := explainRolledBack(ctx, conn.Conn(), stmt, r, now, generic)
	if err != nil {
		return ClaimPlan{}, fmt.Errorf("explain: claim %s: %w", q, err)
	}
	plan, err := parseClaimPlan(raw, batchSize)
	if err != nil {
		return ClaimPlan{}, fmt.Errorf("explain: claim %s: %w", q, err)
	}
	return plan, nil
}

// explainGenericArgsSQL stores the values explainGenericSQL passes to the
// prepared claim in settings local to the transaction: the pinned clock
// (” for the database clock), the batch size and the topics. Values stay
// parameters.
const explainGenericArgsSQL = `SELECT set_config('leasestore.explain_now', coalesce($1::timestamptz::text, ''), true),
       set_config('leasestore.explain_batch', $2::integer::text, true),
       set_config('leasestore.explain_topics', coalesce($3::text[], '{}')::text, true)`

// explainGenericSQL explains an EXECUTE of the prepared claim. EXECUTE
// takes its arguments as expressions, not bind parameters, so they come
// from the settings explainGenericArgsSQL made, and from the constants
// Claim always uses (the untenanted claim): explainOwner, a 30-second lease.
const explainGenericSQL = explainPrefix + "EXECUTE " + explainPrepared + `(
    '{}'::text[],
    current_setting('leasestore.explain_topics')::text[],
    nullif(current_setting('leasestore.explain_now'), '')::timestamptz,
    current_setting('leasestore.explain_batch')::integer,
    '` + explainOwner + `'::text,
    '30 seconds'::interval)`

// explainGenericParams are the parameter types of the generated claim, in
// order, that explainGenericSQL supplies: except_topics, topics, now,
// batch_size, lease_owner, lease_for.
var explainGenericParams = []uint32{pgtype.TextArrayOID, pgtype.TextArrayOID, pgtype.TimestamptzOID, pgtype.Int4OID, pgtype.TextOID, pgtype.IntervalOID}

// explainRolledBack runs stmt under EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON)
// in a READ COMMITTED transaction on conn that it rolls back, and returns
// the output.
//
// With generic it prepares stmt as explainPrepared, forces the generic plan
// for the transaction and explains an EXECUTE of it with the arguments of r
// (see explainGenericSQL). A prepared statement outlives the transaction:
// it is deallocated after the rollback.
func explainRolledBack(ctx context.Context, conn *pgx.Conn, stmt pgbatch.Statement, r leasing.ClaimRequest, now *time.Time, generic bool) ([]byte, error) {
	if generic {
		sd, err := conn.Prepare(ctx, explainPrepared, stmt.SQL)
		if err != nil {
			return nil, err
		}
		defer func() { _ = conn.Deallocate(context.WithoutCancel(ctx), explainPrepared) }()
		if !slices.Equal(sd.ParamOIDs, explainGenericParams) {
			return nil, fmt.Errorf("the generated claim takes parameters of types %v, not %v: update explainGenericSQL", sd.ParamOIDs, explainGenericParams)
		}
	}
	// READ COMMITTED, as leasing.Postgres runs its claims: under a
	// serializable or repeatable read default, the claim would fail on a
	// row another transaction updated since the snapshot.
	tx, err := conn.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
	if err != nil {
		return nil, err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	var raw []byte
	if !generic {
		err = tx.QueryRow(ctx, explainPrefix+stmt.SQL, stmt.Args...).Scan(&raw)
		return raw, err
	}
	// The store's own settings for its claims: the generic plan, no JIT.
	if err := gen.New().UseHotPathSettings(ctx, tx, gen.UseHotPathSettingsParams{LockTimeout: explainLockTimeout}); err != nil {
		return nil, err
	}
	if _, err := tx.Exec(ctx, explainGenericArgsSQL, now, int32(r.BatchSize), r.Topics); err != nil {
		return nil, err
	}
	err = tx.QueryRow(ctx, explainGenericSQL).Scan(&raw)
	return raw, err
}

// claimStatement returns the untenanted claim statement of q and the
// arguments that leasing.Postgres.Claim sends for r at now, recorded from
// the generated query function.
func claimStatement(ctx context.Context, q leasing.Queue, r leasing.ClaimRequest, now *time.Time) (pgbatch.Statement, error) {
	var rec pgbatch.Recorder
	var err error
	switch q {
	case leasing.Inbox:
		_, err = gen.New().InboxClaim(ctx, &rec, gen.InboxClaimParams{
			Now: now, BatchSize: int32(r.BatchSize), LeaseOwner: r.Owner, LeaseFor: r.LeaseFor, Topics: r.Topics,
		})
	case leasing.Outbox:
		_, err = gen.New().OutboxClaim(ctx, &rec, gen.OutboxClaimParams{
			Now: now, BatchSize: int32(r.BatchSize), LeaseOwner: r.Owner, LeaseFor: r.LeaseFor, Topics: r.Topics,
		})
	default:
		_, err := leasing.ParseQueue(string(q))
		return pgbatch.Statement{}, err
	}
	stmt, ok := rec.First()
	if !errors.Is(err, pgbatch.ErrCaptured) || !ok {
		return pgbatch.Statement{}, fmt.Errorf("explain: capture claim statement: %v", err)
	}
	return stmt, nil
}

// explainNode is one plan node of EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON).
type explainNode struct {
	NodeType     string        `json:"Node Type"`
	Operation    string        `json:"Operation"`
	RelationName string        `json:"Relation Name"`
	IndexName    string        `json:"Index Name"`
	CTEName      string        `json:"CTE Name"`
	SubplanName  string        `json:"Subplan Name"`
	Relationship string        `json:"Parent Relationship"`
	ActualRows   float64       `json:"Actual Rows"`
	ActualLoops  float64       `json:"Actual Loops"`
	SharedHit    int64         `json:"Shared Hit Blocks"`
	SharedRead   int64         `json:"Shared Read Blocks"`
	TempRead     int64         `json:"Temp Read Blocks"`
	TempWritten  int64         `json:"Temp Written Blocks"`
	Plans        []explainNode `json:"Plans"`
}

// explainOutput is the single element of the EXPLAIN JSON array.
type explainOutput struct {
	Plan          explainNode     `json:"Plan"`
	PlanningTime  float64         `json:"Planning Time"`  // milliseconds
	ExecutionTime float64         `json:"Execution Time"` // milliseconds
	JIT           json.RawMessage `json:"JIT"`
}

// parseClaimPlan reads EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) output of a
// claim of batchSize rows. The root node's counters include every node
// beneath it, CTE plans among them.
func parseClaimPlan(raw []byte, batchSize int) (ClaimPlan, error) {
	var out []explainOutput
	if err := json.Unmarshal(raw, &out); err != nil {
		return ClaimPlan{}, fmt.Errorf("parse EXPLAIN output: %w", err)
	}
	if len(out) != 1 {
		return ClaimPlan{}, fmt.Errorf("parse EXPLAIN output: %d plans, want 1", len(out))
	}
	root := out[0].Plan
	p := ClaimPlan{
		BatchSize:        batchSize,
		Rows:             int(root.ActualRows),
		SharedHit:        root.SharedHit,
		SharedRead:       root.SharedRead,
		Buffers:          root.SharedHit + root.SharedRead,
		TempBlocks:       root.TempRead + root.TempWritten,
		Duration:         milliseconds(out[0].ExecutionTime),
		PlanningDuration: milliseconds(out[0].PlanningTime),
		JIT:              len(out[0].JIT) > 0 && string(out[0].JIT) != "null",
		Nodes:            []string{},
		Indexes:          []string{},
		Raw:              json.RawMessage(raw),
	}
	seen := map[string]bool{}
	walkPlan(root, 0, false, func(n explainNode, depth int, underLockRows bool) {
		p.Nodes = append(p.Nodes, strings.Repeat("  ", depth)+nodeLabel(n))
		if n.IndexName != "" && !seen[n.IndexName] {
			seen[n.IndexName] = true
			p.Indexes = append(p.Indexes, n.IndexName)
		}
		if strings.HasSuffix(n.NodeType, "Seq Scan") {
			p.SeqScan = true
		}
		switch n.NodeType {
		case "Sort":
			// Beneath LockRows a sort cannot stop early: it sorts every
			// row its input yields.
			if underLockRows || sortInput(n) > float64(2*batchSize) {
				p.SortOverEligible = true
			}
		case "Incremental Sort":
			// Sorts one group of equal leading keys at a time (at least
			// 32 rows), so beneath LockRows it stays bounded unless the
			// groups are large.
			if sortInput(n) > float64(2*batchSize+incrementalSortSlack) {
				p.SortOverEligible = true
			}
		}
	})
	return p, nil
}

// incrementalSortSlack is the input an Incremental Sort may read beyond
// twice the batch: it sorts at least 32 rows at a time, and reads one more
// to see where a group ends.
const incrementalSortSlack = 64

// walkPlan calls fn for n and each node beneath it in pre-order, with its
// depth and whether a LockRows node is among its ancestors.
func walkPlan(n explainNode, depth int, underLockRows bool, fn func(explainNode, int, bool)) {
	fn(n, depth, underLockRows)
	under := underLockRows || n.NodeType == "LockRows"
	for _, c := range n.Plans {
		walkPlan(c, depth+1, under, fn)
	}
}

// sortInput returns the number of rows a sort node consumed over all loops:
// those of its input, not of the CTE and subplans listed beside it.
func sortInput(n explainNode) float64 {
	var rows float64
	for _, c := range n.Plans {
		if c.Relationship == "Outer" {
			rows += c.ActualRows * max(c.ActualLoops, 1)
		}
	}
	return rows
}

// nodeLabel names a plan node like EXPLAIN's text format does, e.g.
// "Index Scan using inbox_messages_ready_idx on inbox_messages", followed by
// the subplan it belongs to, e.g. "(CTE ready)".
func nodeLabel(n explainNode) string {
	label := n.NodeType
	if n.NodeType == "ModifyTable" && n.Operation != "" {
		label = n.Operation
	}
	if n.IndexName != "" {
		label += " using " + n.IndexName
	}
	switch {
	case n.RelationName != "":
		label += " on " + n.RelationName
	case n.CTEName != "":
		label += " on " + n.CTEName
	}
	if n.SubplanName != "" {
		label += " (" + n.SubplanName + ")"
	}
	return label
}

func milliseconds(ms float64) time.Duration {
	return time.Duration(ms * float64(time.Millisecond)).Round(time.Microsecond)
}
