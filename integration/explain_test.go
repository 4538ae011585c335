package integration

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/leasestore/leasestore/integration/dbtest"
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

	for _, explain := range []struct {
		name string
		fn   func() (leasing.ClaimPlan, error)
	}{
		{"ExplainClaim", func() (leasing.ClaimPlan, error) { return store.ExplainClaim(ctx, 10) }},
		{"ExplainClaimGeneric", func() (leasing.ClaimPlan, error) { return store.ExplainClaimGeneric(ctx, 10) }},
	} {
		for range 3 {
			p, err := explain.fn()
			require.NoError(t, err, explain.name)
			require.Equal(t, 10, p.Rows, explain.name)
			require.Contains(t, p.Indexes, "inbox_messages_ready_idx", explain.name)
			require.Contains(t, p.Indexes, "inbox_messages_inflight_idx", explain.name)
			require.False(t, p.SeqScan, "%s: %v", explain.name, p.Nodes)
			require.False(t, p.SortOverEligible, "%s: %v", explain.name, p.Nodes)
			require.Positive(t, p.Buffers, explain.name)
			require.Positive(t, p.Duration, explain.name)
			require.Zero(t, p.TempBlocks, explain.name)
			require.Less(t, p.Buffers, int64(400), explain.name)
		}
	}

	// A pinned clock before every row's due time: nothing is due, in
	// either plan.
	past := time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)
	pinned, err := leasing.NewPostgres(pool, leasing.Inbox, leasing.PostgresOptions{Now: func() time.Time { return past }})
	require.NoError(t, err)
	p, err := pinned.ExplainClaim(ctx, 10)
	require.NoError(t, err)
	require.Zero(t, p.Rows)
	p, err = pinned.ExplainClaimGeneric(ctx, 10)
	require.NoError(t, err)
	require.Zero(t, p.Rows)

	// Nothing was claimed for good.
	st, err := store.Stats(ctx)
	require.NoError(t, err)
	require.Equal(t, int64(20_000), st.Depth[leasing.StatusPending])
	require.Zero(t, st.Depth[leasing.StatusProcessing])
	leases, err := store.Claim(ctx, leasing.ClaimRequest{Owner: "o", BatchSize: 1, LeaseFor: time.Minute})
	require.NoError(t, err)
	require.Equal(t, int64(1), leases[0].Generation, "rolled-back claims leave the generation alone")
}
