package leasing_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/leasestore/leasestore/internal/dbtest"
	"github.com/leasestore/leasestore/internal/explain"
	"github.com/leasestore/leasestore/leasing"
)

// TestExplainClaim runs both explains on a table large enough for index
// plans, on a pool of one connection, so that a prepared statement left
// behind by the generic explain would make the next one fail.
func TestExplainClaim(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	cfg, err := pgxpool.ParseConfig(dbtest.DatabaseURL(t))
	require.NoError(t, err)
	cfg.MaxConns = 1
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	benchFill(t, pool, 20_000, 20_000)
	store, err := leasing.NewPostgres(pool, leasing.Inbox, leasing.PostgresOptions{})
	require.NoError(t, err)

	for _, run := range []struct {
		name string
		fn   func(context.Context, *pgxpool.Pool, leasing.Queue, int, explain.Options) (explain.ClaimPlan, error)
	}{
		{"Claim", explain.Claim},
		{"ClaimGeneric", explain.ClaimGeneric},
	} {
		for range 3 {
			p, err := run.fn(ctx, pool, leasing.Inbox, 10, explain.Options{})
			require.NoError(t, err, run.name)
			require.Equal(t, 10, p.Rows, run.name)
			require.Contains(t, p.Indexes, "inbox_messages_ready_idx", run.name)
			require.Contains(t, p.Indexes, "inbox_messages_inflight_idx", run.name)
			require.False(t, p.SeqScan, "%s: %v", run.name, p.Nodes)
			require.False(t, p.SortOverEligible, "%s: %v", run.name, p.Nodes)
			require.Positive(t, p.Buffers, run.name)
			require.Positive(t, p.Duration, run.name)
			require.Zero(t, p.TempBlocks, run.name)
			require.Less(t, p.Buffers, int64(400), run.name)
		}
	}

	// A pinned clock before every row's due time: nothing is due, in
	// either plan.
	past := time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)
	pinned := explain.Options{Now: func() time.Time { return past }}
	p, err := explain.Claim(ctx, pool, leasing.Inbox, 10, pinned)
	require.NoError(t, err)
	require.Zero(t, p.Rows)
	p, err = explain.ClaimGeneric(ctx, pool, leasing.Inbox, 10, pinned)
	require.NoError(t, err)
	require.Zero(t, p.Rows)

	// Nothing was claimed for good.
	st, err := store.Stats(ctx)
	require.NoError(t, err)
	require.Equal(t, int64(20_000), st.Depth[leasing.StatusPending])
	require.Zero(t, st.Depth[leasing.StatusProcessing])
	leases, err := store.Claim(ctx, leasing.ClaimRequest{Owner: "o", BatchSize: 1, LeaseFor: time.Minute})
	require.NoError(t, err)
	var created int64 // the generation the row was enqueued with
	require.NoError(t, pool.QueryRow(ctx, "SELECT max(lease_generation) FROM inbox_messages WHERE status = 'pending'").Scan(&created))
	require.Equal(t, created+1, leases[0].Generation, "rolled-back claims leave the generation alone")
}

// TestClaimNeverJIT: the store's claims run without JIT whatever the
// server's jit settings. Here every plan would be compiled (jit_above_cost
// = 0): the claim explained with the session's settings is, the generic
// claim with the store's settings (gen.UseHotPathSettings) is not. JIT
// compiled about 120 functions for every generic claim, some 40 ms each,
// once a table's size put the plan's estimate above the default 100,000.
func TestClaimNeverJIT(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	cfg, err := pgxpool.ParseConfig(dbtest.DatabaseURL(t))
	require.NoError(t, err)
	cfg.ConnConfig.RuntimeParams["jit"] = "on"
	cfg.ConnConfig.RuntimeParams["jit_above_cost"] = "0"
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	var available bool
	require.NoError(t, pool.QueryRow(ctx, "SELECT pg_jit_available()").Scan(&available))
	if !available {
		t.Skip("this server has no JIT")
	}
	benchFill(t, pool, 1_000, 0)

	p, err := explain.Claim(ctx, pool, leasing.Inbox, 10, explain.Options{})
	require.NoError(t, err)
	require.True(t, p.JIT, "with jit_above_cost = 0 the session's settings compile the claim")
	p, err = explain.ClaimGeneric(ctx, pool, leasing.Inbox, 10, explain.Options{})
	require.NoError(t, err)
	require.Equal(t, 10, p.Rows)
	require.False(t, p.JIT, "the store's claim settings turn JIT off")
}
