package integration

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/leasestore/leasestore/gen"
	"github.com/leasestore/leasestore/integration/dbtest"
	"github.com/leasestore/leasestore/leasing"
	"github.com/leasestore/leasestore/leasing/processor"
)

// tableVacuums returns how many VACUUMs ran on q's table, by anyone, and
// its dead row estimate.
func tableVacuums(t *testing.T, pool *pgxpool.Pool, q leasing.Queue) (vacuums, dead int64) {
	t.Helper()
	h, err := gen.New().DiagnosticsTableHealth(context.Background(), pool, gen.DiagnosticsTableHealthParams{TableName: q.Table()})
	require.NoError(t, err)
	return h.VacuumCount + h.AutovacuumCount, h.DeadTuples
}

// churn enqueues n messages and claims and completes them in batches of
// 50 on pool, leaving 2n dead row versions, and flushes this backend's
// statistics so that n_dead_tup counts them (pool must have one connection).
func churn(t *testing.T, pool *pgxpool.Pool, store *leasing.Postgres, n int) {
	t.Helper()
	ctx := context.Background()
	_, err := store.Enqueue(ctx, make([]leasing.NewMessage, n)...)
	require.NoError(t, err)
	req := leasing.ClaimRequest{Owner: "churn", BatchSize: 50, LeaseFor: time.Minute}
	var held []leasing.Lease
	for done := 0; done < n; done += len(held) {
		res, next, err := store.CompleteAndClaim(ctx, held, req)
		require.NoError(t, err)
		require.NoError(t, res.Err())
		held = next
	}
	_, err = pool.Exec(ctx, "SELECT pg_stat_force_next_flush()")
	require.NoError(t, err)
	_, err = pool.Exec(ctx, "SELECT 1") // the flush happens when this backend next goes idle
	require.NoError(t, err)
}

func TestVacuumIfDead(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := dbtest.DatabaseURL(t)
	pool := newPool(t, url, "leasestore-vacuum", 1)
	store, err := leasing.NewPostgres(pool, leasing.Inbox, leasing.PostgresOptions{})
	require.NoError(t, err)

	_, err = store.VacuumIfDead(ctx, 0)
	require.True(t, isArgErr(err), "%v", err)

	churn(t, pool, store, 200)
	before, dead := tableVacuums(t, pool, leasing.Inbox)
	// Claim and complete leave a dead version each; on-access pruning may
	// already have taken some off the count.
	require.GreaterOrEqual(t, dead, int64(200))

	v, err := store.VacuumIfDead(ctx, dead+1)
	require.NoError(t, err)
	require.False(t, v.Ran, "below the threshold nothing runs")
	after, _ := tableVacuums(t, pool, leasing.Inbox)
	require.Equal(t, before, after)

	v, err = store.VacuumIfDead(ctx, dead)
	require.NoError(t, err)
	require.True(t, v.Ran)
	require.Equal(t, dead, v.DeadRows)
	after, deadAfter := tableVacuums(t, pool, leasing.Inbox)
	require.Equal(t, before+1, after)
	require.Less(t, deadAfter, dead)

	// A user who may not VACUUM the table is told so, and nothing runs.
	applyRoles(t, url)
	processorRole := loginRole(t, url, "leasestore_processor")
	roleStore := openStore(t, asUser(t, url, processorRole), leasing.Inbox, leasing.PostgresOptions{})
	_, err = roleStore.VacuumIfDead(ctx, 1)
	require.ErrorIs(t, err, leasing.ErrVacuumNotAllowed)
	var reported atomic.Int32
	require.NoError(t, processor.KeepVacuumed(ctx, roleStore, processor.VacuumPolicy{DeadRows: 1, CheckInterval: time.Millisecond},
		func(err error) {
			require.ErrorIs(t, err, leasing.ErrVacuumNotAllowed)
			reported.Add(1)
		}), "KeepVacuumed gives up on a user who may not VACUUM")
	require.Equal(t, int32(1), reported.Load())
	final, _ := tableVacuums(t, pool, leasing.Inbox)
	require.Equal(t, after, final)

	// Bad policies are argument errors before anything runs.
	for _, p := range []processor.VacuumPolicy{{DeadRows: -1}, {CheckInterval: -time.Second}, {DutyCycle: 1.5}, {DutyCycle: -0.1}} {
		require.True(t, isArgErr(processor.KeepVacuumed(ctx, store, p, nil)), "%+v", p)
		_, err := processor.New(store, func(context.Context, leasing.Lease) error { return nil }, processor.Options{Vacuum: p})
		require.True(t, isArgErr(err), "%+v", p)
	}
}

// TestProcessorVacuumsItsTable: a processor on a Postgres store vacuums
// its table while it drains, by its VacuumPolicy; with the policy
// disabled it does not.
func TestProcessorVacuumsItsTable(t *testing.T) {
	t.Parallel()
	for _, disabled := range []bool{false, true} {
		pool := dbtest.NewPool(t)
		store, err := leasing.NewPostgres(pool, leasing.Outbox, leasing.PostgresOptions{})
		require.NoError(t, err)
		msgs := make([]leasing.NewMessage, 300)
		for i := range msgs {
			msgs[i].Topic = "t"
		}
		_, err = store.Enqueue(context.Background(), msgs...)
		require.NoError(t, err)
		before, _ := tableVacuums(t, pool, leasing.Outbox)

		var handled atomic.Int32
		p, err := processor.New(store, func(context.Context, leasing.Lease) error { handled.Add(1); return nil },
			processor.Options{
				BatchSize: 50, Concurrency: 8, PollInterval: 10 * time.Millisecond,
				Vacuum:  processor.VacuumPolicy{Disabled: disabled, DeadRows: 100, CheckInterval: 10 * time.Millisecond},
				OnError: func(err error) { t.Errorf("processor: %v", err) },
			})
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- p.Run(ctx) }()
		require.Eventually(t, func() bool { return handled.Load() == 300 }, 20*time.Second, 10*time.Millisecond)
		if disabled {
			// Long enough for the workers' statistics to reach n_dead_tup.
			time.Sleep(1500 * time.Millisecond)
		} else {
			// Backends report dead rows about once a second, when they next go idle.
			require.Eventually(t, func() bool {
				after, _ := tableVacuums(t, pool, leasing.Outbox)
				return after > before
			}, 15*time.Second, 20*time.Millisecond, "the processor vacuumed its table")
		}
		cancel()
		require.NoError(t, <-done)
		if disabled {
			after, dead := tableVacuums(t, pool, leasing.Outbox)
			require.Equal(t, before, after, "disabled policy: no VACUUM (autovacuum is off or far away)")
			t.Logf("disabled policy: %d dead rows left", dead)
		}
	}
}

// TestVacuumNeedsOwnerPrivileges: the vacuum policy runs VACUUM only for a
// user who has the privileges of the table owner's role as VACUUM checks
// them. A member that inherits them may; a NOINHERIT member may not (its
// VACUUM would be skipped with a WARNING, not fail), so it is told
// ErrVacuumNotAllowed and nothing runs.
func TestVacuumNeedsOwnerPrivileges(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := dbtest.DatabaseURL(t)
	admin := adminConn(t, url)
	ownerName := dbtest.RoleName(t)
	owner := pgx.Identifier{ownerName}.Sanitize()
	t.Cleanup(func() {
		// Runs after the login roles are dropped and before the database
		// is: hand the table back so that the owner role can go.
		c, err := pgx.Connect(context.Background(), url)
		if err != nil {
			t.Errorf("drop %s: %v", ownerName, err)
			return
		}
		defer c.Close(context.Background())
		for _, stmt := range []string{"ALTER TABLE inbox_messages OWNER TO CURRENT_USER", "DROP ROLE IF EXISTS " + owner} {
			if _, err := c.Exec(context.Background(), stmt); err != nil {
				t.Errorf("%s: %v", stmt, err)
			}
		}
	})
	for _, stmt := range []string{"CREATE ROLE " + owner + " NOLOGIN", "ALTER TABLE inbox_messages OWNER TO " + owner} {
		_, err := admin.Exec(ctx, stmt)
		require.NoError(t, err, stmt)
	}
	inherit := loginRole(t, url, ownerName, "INHERIT")
	noInherit := loginRole(t, url, ownerName, "NOINHERIT")
	pool := newPool(t, url, "leasestore-vacuum-roles", 1)
	store, err := leasing.NewPostgres(pool, leasing.Inbox, leasing.PostgresOptions{})
	require.NoError(t, err)
	churn(t, pool, store, 100)
	before, _ := tableVacuums(t, pool, leasing.Inbox)

	_, err = openStore(t, asUser(t, url, noInherit), leasing.Inbox, leasing.PostgresOptions{}).VacuumIfDead(ctx, 1)
	require.ErrorIs(t, err, leasing.ErrVacuumNotAllowed)
	after, _ := tableVacuums(t, pool, leasing.Inbox)
	require.Equal(t, before, after, "nothing ran")

	v, err := openStore(t, asUser(t, url, inherit), leasing.Inbox, leasing.PostgresOptions{}).VacuumIfDead(ctx, 1)
	require.NoError(t, err)
	require.True(t, v.Ran)
	after, _ = tableVacuums(t, pool, leasing.Inbox)
	require.Equal(t, before+1, after)
}
