package explain

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/leasestore/leasestore/leasing"
)

// seedPlan is the shape of the seed's claim on a large table: the sort
// sits beneath LockRows, so it sorts every eligible row and spills.
const seedPlan = `[{"Plan": {"Node Type": "ModifyTable", "Operation": "Update", "Relation Name": "inbox_messages",
  "Actual Rows": 0, "Actual Loops": 1, "Shared Hit Blocks": 70000, "Shared Read Blocks": 5800,
  "Temp Read Blocks": 7000, "Temp Written Blocks": 8000,
  "Plans": [{"Node Type": "Limit", "Parent Relationship": "Outer", "Actual Rows": 10, "Actual Loops": 1,
    "Plans": [{"Node Type": "LockRows", "Parent Relationship": "Outer", "Actual Rows": 10, "Actual Loops": 1,
      "Plans": [{"Node Type": "Sort", "Parent Relationship": "Outer", "Actual Rows": 10, "Actual Loops": 1,
        "Plans": [{"Node Type": "Seq Scan", "Parent Relationship": "Outer", "Relation Name": "inbox_messages",
          "Actual Rows": 1000000, "Actual Loops": 1}]}]}]}]},
  "Planning Time": 0.5, "Execution Time": 512.25, "JIT": {"Functions": 12}}]`

// twoBranchPlan is the shape of the generated claim: each branch reads its
// index in order; the only sorts merge at most twice the batch.
const twoBranchPlan = `[{"Plan": {"Node Type": "Sort", "Actual Rows": 10, "Actual Loops": 1,
  "Shared Hit Blocks": 120, "Shared Read Blocks": 3,
  "Plans": [
    {"Node Type": "Limit", "Parent Relationship": "InitPlan", "Subplan Name": "CTE ready", "Actual Rows": 10, "Actual Loops": 1,
     "Plans": [{"Node Type": "LockRows", "Parent Relationship": "Outer", "Actual Rows": 10, "Actual Loops": 1,
       "Plans": [{"Node Type": "Index Scan", "Parent Relationship": "Outer", "Index Name": "inbox_messages_ready_idx",
         "Relation Name": "inbox_messages", "Actual Rows": 10, "Actual Loops": 1}]}]},
    {"Node Type": "Limit", "Parent Relationship": "InitPlan", "Subplan Name": "CTE expired", "Actual Rows": 0, "Actual Loops": 1,
     "Plans": [{"Node Type": "LockRows", "Parent Relationship": "Outer", "Actual Rows": 0, "Actual Loops": 1,
       "Plans": [{"Node Type": "Index Scan", "Parent Relationship": "Outer", "Index Name": "inbox_messages_inflight_idx",
         "Relation Name": "inbox_messages", "Actual Rows": 0, "Actual Loops": 1}]}]},
    {"Node Type": "ModifyTable", "Operation": "Update", "Parent Relationship": "InitPlan", "Subplan Name": "CTE claimed",
     "Relation Name": "inbox_messages", "Actual Rows": 10, "Actual Loops": 1,
     "Plans": [{"Node Type": "Sort", "Parent Relationship": "Outer", "Actual Rows": 10, "Actual Loops": 1,
       "Plans": [{"Node Type": "Append", "Parent Relationship": "Outer", "Actual Rows": 10, "Actual Loops": 1,
         "Plans": [{"Node Type": "CTE Scan", "Parent Relationship": "Member", "CTE Name": "ready", "Actual Rows": 10, "Actual Loops": 1}]}]}]},
    {"Node Type": "CTE Scan", "Parent Relationship": "Outer", "CTE Name": "claimed", "Actual Rows": 10, "Actual Loops": 1}]},
  "Planning Time": 0.2, "Execution Time": 0.4567}]`

func TestParseClaimPlan(t *testing.T) {
	t.Parallel()

	t.Run("SeedShape", func(t *testing.T) {
		t.Parallel()
		p, err := parseClaimPlan([]byte(seedPlan), 10)
		require.NoError(t, err)
		require.Equal(t, int64(75800), p.Buffers)
		require.Equal(t, int64(15000), p.TempBlocks)
		require.Equal(t, 512250*time.Microsecond, p.Duration)
		require.True(t, p.SeqScan)
		require.True(t, p.SortOverEligible)
		require.True(t, p.JIT)
		require.Empty(t, p.Indexes)
		require.Equal(t, "        Seq Scan on inbox_messages", p.Nodes[len(p.Nodes)-1])
	})

	t.Run("TwoBranchShape", func(t *testing.T) {
		t.Parallel()
		p, err := parseClaimPlan([]byte(twoBranchPlan), 10)
		require.NoError(t, err)
		require.Equal(t, 10, p.Rows)
		require.Equal(t, int64(123), p.Buffers)
		require.Equal(t, int64(120), p.SharedHit)
		require.Equal(t, 457*time.Microsecond, p.Duration)
		require.Zero(t, p.TempBlocks)
		require.False(t, p.SeqScan)
		require.False(t, p.SortOverEligible)
		require.False(t, p.JIT)
		require.Equal(t, []string{"inbox_messages_ready_idx", "inbox_messages_inflight_idx"}, p.Indexes)
		require.Equal(t, "  Limit (CTE ready)", p.Nodes[1])
		require.Equal(t, "      Index Scan using inbox_messages_ready_idx on inbox_messages", p.Nodes[3])
		require.Equal(t, "  Update on inbox_messages (CTE claimed)", p.Nodes[7])
	})

	t.Run("SortOfManyRows", func(t *testing.T) {
		t.Parallel()
		p, err := parseClaimPlan([]byte(twoBranchPlan), 4) // the merge sorts 10 > 2×4 rows
		require.NoError(t, err)
		require.True(t, p.SortOverEligible)
	})

	t.Run("IncrementalSortIsBounded", func(t *testing.T) {
		t.Parallel()
		plan := strings.Replace(seedPlan, `"Node Type": "Sort"`, `"Node Type": "Incremental Sort"`, 1)
		p, err := parseClaimPlan([]byte(strings.Replace(plan, `"Actual Rows": 1000000`, `"Actual Rows": 33`, 1)), 10)
		require.NoError(t, err)
		require.False(t, p.SortOverEligible)
		p, err = parseClaimPlan([]byte(plan), 10)
		require.NoError(t, err)
		require.True(t, p.SortOverEligible, "an incremental sort of a million rows")
	})

	t.Run("Malformed", func(t *testing.T) {
		t.Parallel()
		_, err := parseClaimPlan([]byte(`{"Plan": 1}`), 10)
		require.Error(t, err)
		_, err = parseClaimPlan([]byte(`[]`), 10)
		require.Error(t, err)
	})
}

// TestClaimStatement checks that the captured statement is the generated
// claim with the parameters Claim sends, and that nothing runs: the pool
// points at a port where no server listens.
func TestClaimStatement(t *testing.T) {
	t.Parallel()
	pool, err := pgxpool.New(context.Background(), "postgres://nobody@127.0.0.1:1/none?connect_timeout=1")
	require.NoError(t, err)
	t.Cleanup(pool.Close)

	now := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, q := range []leasing.Queue{leasing.Inbox, leasing.Outbox} {
		st, err := claimStatement(context.Background(), q, leasing.ClaimRequest{Owner: "o", BatchSize: 7, LeaseFor: time.Minute, Topics: []string{"t"}}, &now)
		require.NoError(t, err)
		name := map[leasing.Queue]string{leasing.Inbox: "InboxClaim", leasing.Outbox: "OutboxClaim"}[q]
		require.True(t, strings.HasPrefix(st.SQL, "-- name: "+name+" :many"), st.SQL)
		require.Len(t, st.Args, 6)
		require.Contains(t, st.Args, []string{"t"})
		require.Contains(t, st.Args, &now)
		require.Contains(t, st.Args, int32(7))
		require.Contains(t, st.Args, "o")
		require.Contains(t, st.Args, time.Minute)
	}

	_, err = Claim(context.Background(), pool, leasing.Inbox, 0, Options{})
	require.ErrorIs(t, err, leasing.ErrInvalidArgument)
	_, err = Claim(context.Background(), pool, leasing.Queue("nope"), 1, Options{})
	require.ErrorIs(t, err, leasing.ErrInvalidArgument)
}
