package leasing_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/leasestore/leasestore/gen"
	"github.com/leasestore/leasestore/internal/dbtest"
	"github.com/leasestore/leasestore/leasing"
	"github.com/leasestore/leasestore/leasing/processor"
)

// tableVacuums returns how many VACUUMs ran on table (a queue's table or
// its keys' table), by anyone, and its dead row estimate.
func tableVacuums(t *testing.T, pool *pgxpool.Pool, table string) (vacuums, dead int64) {
	t.Helper()
	h := tableHealth(t, pool, table)
	return h.VacuumCount + h.AutovacuumCount, h.DeadTuples
}

// tableHealth returns table's statistics.
func tableHealth(t *testing.T, pool *pgxpool.Pool, table string) *gen.DiagnosticsTableHealthRow {
	t.Helper()
	h, err := gen.New().DiagnosticsTableHealth(context.Background(), pool, gen.DiagnosticsTableHealthParams{TableName: table})
	require.NoError(t, err)
	return h
}

// flushStats flushes the statistics of pool's backend (pool must have one
// connection), so that n_dead_tup and n_live_tup count what it did.
func flushStats(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	ctx := context.Background()
	_, err := pool.Exec(ctx, "SELECT pg_stat_force_next_flush()")
	require.NoError(t, err)
	_, err = pool.Exec(ctx, "SELECT 1") // the flush happens when this backend next goes idle
	require.NoError(t, err)
}

// autovacuumOff turns autovacuum off for the queue's table and its
// ordering keys' table (or the table alone, on a schema before migration
// 00010), so that only the calls under test vacuum them: the server's
// autovacuum may otherwise take the dead rows a test counted on, or add
// to the VACUUMs it counts.
func autovacuumOff(t *testing.T, pool *pgxpool.Pool, q leasing.Queue) {
	t.Helper()
	ctx := context.Background()
	for _, table := range []string{q.Table(), q.KeyTable()} {
		var exists bool
		require.NoError(t, pool.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", table).Scan(&exists))
		if exists {
			_, err := pool.Exec(ctx, "ALTER TABLE "+pgx.Identifier{table}.Sanitize()+" SET (autovacuum_enabled = false)")
			require.NoError(t, err)
		}
	}
}

// keyedMessages returns n messages over keys ordering keys, round robin.
func keyedMessages(n, keys int) []leasing.NewMessage {
	msgs := make([]leasing.NewMessage, n)
	for i := range msgs {
		msgs[i].OrderingKey = fmt.Sprintf("k%d", i%keys)
	}
	return msgs
}

// churn enqueues n messages and claims and completes them (finishAll),
// leaving 2n dead row versions in the queue's table, fewer what on-access
// pruning took off the count.
func churn(t *testing.T, pool *pgxpool.Pool, store *leasing.Postgres, n int) {
	t.Helper()
	_, err := store.Enqueue(context.Background(), make([]leasing.NewMessage, n)...)
	require.NoError(t, err)
	finishAll(t, pool, store)
}

// finishAll claims and completes messages in batches of 50 on pool until
// none is left to claim, and flushes this backend's statistics so that
// n_dead_tup counts the dead row versions they left (pool must have one
// connection).
func finishAll(t *testing.T, pool *pgxpool.Pool, store *leasing.Postgres) {
	t.Helper()
	req := leasing.ClaimRequest{Owner: "churn", BatchSize: 50, LeaseFor: time.Minute}
	var held []leasing.Lease
	for {
		res, next, err := store.CompleteAndClaim(context.Background(), held, req)
		require.NoError(t, err)
		require.NoError(t, res.Err())
		if held = next; len(held) == 0 {
			break
		}
	}
	flushStats(t, pool)
}

func TestVacuumIfDead(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := dbtest.DatabaseURL(t)
	pool := newPool(t, url, "leasestore-vacuum", 1)
	store, err := leasing.NewPostgres(pool, leasing.Inbox, leasing.PostgresOptions{})
	require.NoError(t, err)
	autovacuumOff(t, pool, leasing.Inbox)

	_, err = store.VacuumIfDead(ctx, 0)
	require.True(t, isArgErr(err), "%v", err)

	churn(t, pool, store, 200)
	before, dead := tableVacuums(t, pool, leasing.Inbox.Table())
	// Claim and complete leave a dead version each; on-access pruning may
	// already have taken some off the count.
	require.GreaterOrEqual(t, dead, int64(200))

	v, err := store.VacuumIfDead(ctx, dead+1)
	require.NoError(t, err)
	require.False(t, v.Ran, "below the threshold nothing runs")
	after, _ := tableVacuums(t, pool, leasing.Inbox.Table())
	require.Equal(t, before, after)

	v, err = store.VacuumIfDead(ctx, dead)
	require.NoError(t, err)
	require.True(t, v.Ran)
	require.Equal(t, dead, v.DeadRows)
	after, deadAfter := tableVacuums(t, pool, leasing.Inbox.Table())
	require.Equal(t, before+1, after)
	require.Less(t, deadAfter, dead)

	// A user who may not VACUUM the table is told so, and nothing runs.
	applyRoles(t, url)
	revokeMaintain(t, url)
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
	final, _ := tableVacuums(t, pool, leasing.Inbox.Table())
	require.Equal(t, after, final)

	// Bad policies are argument errors before anything runs.
	for _, p := range []processor.VacuumPolicy{{DeadRows: -1}, {CheckInterval: -time.Second}, {DutyCycle: 1.5}, {DutyCycle: -0.1}} {
		require.True(t, isArgErr(processor.KeepVacuumed(ctx, store, p, nil)), "%+v", p)
		_, err := processor.New(store, func(context.Context, leasing.Lease) error { return nil }, processor.Options{Vacuum: p})
		require.True(t, isArgErr(err), "%+v", p)
	}
}

// TestVacuumIfDeadKeys: VacuumIfDead vacuums and analyses the queue's
// ordering keys' table too: once when it holds rows and was never
// analysed, then at the same dead-row threshold as the queue's table.
func TestVacuumIfDeadKeys(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := newPool(t, dbtest.DatabaseURL(t), "leasestore-vacuum-keys", 1)
	store, err := leasing.NewPostgres(pool, leasing.Inbox, leasing.PostgresOptions{})
	require.NoError(t, err)
	autovacuumOff(t, pool, leasing.Inbox)
	keys := leasing.Inbox.KeyTable()
	const never = 1 << 40 // a threshold no table reaches

	churn(t, pool, store, 100)
	v, err := store.VacuumIfDead(ctx, never)
	require.NoError(t, err)
	require.Zero(t, v.Keys, "unkeyed messages leave the keys' table empty and alone")

	_, err = store.Enqueue(ctx, keyedMessages(400, 100)...)
	require.NoError(t, err)
	flushStats(t, pool)
	h := tableHealth(t, pool, keys)
	require.Nil(t, h.LastAnalyze)
	require.Nil(t, h.LastAutoanalyze)
	before := h.VacuumCount + h.AutovacuumCount
	v, err = store.VacuumIfDead(ctx, never)
	require.NoError(t, err)
	require.False(t, v.Ran, "the queue's table is below the threshold")
	require.True(t, v.Keys.Ran, "key rows never analysed are vacuumed and analysed")
	require.Positive(t, v.Keys.Duration)
	h = tableHealth(t, pool, keys)
	require.NotNil(t, h.LastVacuum)
	require.NotNil(t, h.LastAnalyze)
	require.Equal(t, before+1, h.VacuumCount+h.AutovacuumCount)
	v, err = store.VacuumIfDead(ctx, never)
	require.NoError(t, err)
	require.False(t, v.Keys.Ran, "analysed now and below the threshold")

	// A keyed drain: each finished head moves its key row on, the last
	// message of a key deletes it.
	finishAll(t, pool, store)
	before, dead := tableVacuums(t, pool, keys)
	require.Positive(t, dead)
	v, err = store.VacuumIfDead(ctx, dead+1)
	require.NoError(t, err)
	require.Equal(t, dead, v.Keys.DeadRows)
	require.False(t, v.Keys.Ran, "below the threshold nothing runs")
	after, _ := tableVacuums(t, pool, keys)
	require.Equal(t, before, after)

	v, err = store.VacuumIfDead(ctx, dead)
	require.NoError(t, err)
	require.True(t, v.Keys.Ran)
	require.Equal(t, dead, v.Keys.DeadRows)
	after, deadAfter := tableVacuums(t, pool, keys)
	require.Equal(t, before+1, after)
	require.Less(t, deadAfter, dead)
}

// TestVacuumIfDeadBefore00010: on a schema without the ordering keys'
// tables (before migration 00010) VacuumIfDead vacuums the queue's table
// alone, and reports nothing of the keys' table.
func TestVacuumIfDeadBefore00010(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := newPool(t, migratedTo(t, 9).Config().ConnString(), "leasestore-vacuum-9", 1)
	store, err := leasing.NewPostgres(pool, leasing.Inbox, leasing.PostgresOptions{})
	require.NoError(t, err)
	autovacuumOff(t, pool, leasing.Inbox)
	_, err = store.Enqueue(ctx, make([]leasing.NewMessage, 100)...)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, "DELETE FROM inbox_messages")
	require.NoError(t, err)
	flushStats(t, pool)
	before, dead := tableVacuums(t, pool, leasing.Inbox.Table())
	require.GreaterOrEqual(t, dead, int64(100))

	v, err := store.VacuumIfDead(ctx, dead)
	require.NoError(t, err)
	require.True(t, v.Ran)
	require.Zero(t, v.Keys)
	after, _ := tableVacuums(t, pool, leasing.Inbox.Table())
	require.Equal(t, before+1, after)
}

// TestProcessorVacuumsItsTable: a processor on a Postgres store vacuums
// its table and its ordering keys' table (and analyses the latter) while
// it drains keyed messages, by its VacuumPolicy; with the policy disabled
// it does not (autovacuum is off for both tables).
//
// Ten keys hold a message due in an hour, so that the keys' table keeps
// live rows after the drain: the policy's first ANALYZE of it does not
// depend on whether its dead rows, which pruning takes off the count,
// reach the threshold while the policy still checks.
func TestProcessorVacuumsItsTable(t *testing.T) {
	t.Parallel()
	for _, disabled := range []bool{false, true} {
		url := dbtest.DatabaseURL(t)
		pool := newPool(t, url, "leasestore-processor-vacuum", 10)
		store, err := leasing.NewPostgres(pool, leasing.Outbox, leasing.PostgresOptions{})
		require.NoError(t, err)
		autovacuumOff(t, pool, leasing.Outbox)
		msgs := keyedMessages(300, 10)
		for i := range 10 {
			msgs = append(msgs, leasing.NewMessage{OrderingKey: fmt.Sprintf("held-%d", i), Delay: time.Hour})
		}
		for i := range msgs {
			msgs[i].Topic = "t"
		}
		// Enqueued on a connection of its own, whose statistics are then
		// flushed: the policy sees the keys' live rows at its first check.
		producer := newPool(t, url, "leasestore-processor-vacuum-producer", 1)
		producerStore, err := leasing.NewPostgres(producer, leasing.Outbox, leasing.PostgresOptions{})
		require.NoError(t, err)
		_, err = producerStore.Enqueue(context.Background(), msgs...)
		require.NoError(t, err)
		flushStats(t, producer)
		before, _ := tableVacuums(t, pool, leasing.Outbox.Table())
		keysBefore, _ := tableVacuums(t, pool, leasing.Outbox.KeyTable())

		var handled atomic.Int32
		p, err := processor.New(store, func(context.Context, leasing.Lease) error { handled.Add(1); return nil },
			processor.Options{
				BatchSize: 50, Concurrency: 8, PollInterval: 10 * time.Millisecond,
				Vacuum:  processor.VacuumPolicy{Disabled: disabled, DeadRows: 100, CheckInterval: 10 * time.Millisecond},
				OnError: func(err error) { t.Errorf("processor: %v", err) },
			})
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(context.Background())
		var runErr error
		stopped := make(chan struct{})
		go func() { runErr = p.Run(ctx); close(stopped) }()
		// A failed assertion ends the test before the pools close: stop the
		// processor first, or it reports the closed pool to a finished test.
		t.Cleanup(func() { cancel(); <-stopped })
		require.Eventually(t, func() bool { return handled.Load() == 300 }, 20*time.Second, 10*time.Millisecond)
		if disabled {
			// Long enough for the workers' statistics to reach n_dead_tup.
			time.Sleep(1500 * time.Millisecond)
		} else {
			// Backends report dead rows about once a second, when they next go idle.
			require.Eventually(t, func() bool {
				after, _ := tableVacuums(t, pool, leasing.Outbox.Table())
				keys := tableHealth(t, pool, leasing.Outbox.KeyTable())
				return after > before && keys.VacuumCount+keys.AutovacuumCount > keysBefore && keys.LastAnalyze != nil
			}, 15*time.Second, 20*time.Millisecond, "the processor vacuumed both tables and analysed the keys' table")
		}
		cancel()
		<-stopped
		require.NoError(t, runErr)
		after, dead := tableVacuums(t, pool, leasing.Outbox.Table())
		keys := tableHealth(t, pool, leasing.Outbox.KeyTable())
		if disabled {
			require.Equal(t, before, after, "disabled policy: no VACUUM")
			require.Equal(t, keysBefore, keys.VacuumCount+keys.AutovacuumCount, "disabled policy: the keys' table neither")
			require.Nil(t, keys.LastAnalyze)
			t.Logf("disabled policy: %d dead rows left, %d in the keys' table", dead, keys.DeadTuples)
		}
	}
}

// TestVacuumNeedsOwnerPrivileges: the vacuum policy runs VACUUM only for a
// user who has the privileges of the tables' owner's role as VACUUM checks
// them, on the queue's table and on its ordering keys' table. A member
// that inherits them may; a NOINHERIT member may not (its VACUUM would be
// skipped with a WARNING, not fail), so it is told ErrVacuumNotAllowed and
// nothing runs; nor does it for a member that owns only one of the tables.
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
		for _, stmt := range []string{
			"ALTER TABLE inbox_messages OWNER TO CURRENT_USER", "ALTER TABLE inbox_ordering_keys OWNER TO CURRENT_USER",
			"DROP ROLE IF EXISTS " + owner,
		} {
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
	before, _ := tableVacuums(t, pool, leasing.Inbox.Table())

	_, err = openStore(t, asUser(t, url, noInherit), leasing.Inbox, leasing.PostgresOptions{}).VacuumIfDead(ctx, 1)
	require.ErrorIs(t, err, leasing.ErrVacuumNotAllowed)
	after, _ := tableVacuums(t, pool, leasing.Inbox.Table())
	require.Equal(t, before, after, "nothing ran")

	inheritStore := openStore(t, asUser(t, url, inherit), leasing.Inbox, leasing.PostgresOptions{})
	_, err = inheritStore.VacuumIfDead(ctx, 1)
	require.ErrorIs(t, err, leasing.ErrVacuumNotAllowed, "the keys' table has another owner")
	require.ErrorContains(t, err, "inbox_ordering_keys")
	require.NotContains(t, err.Error(), "inbox_messages")
	after, _ = tableVacuums(t, pool, leasing.Inbox.Table())
	require.Equal(t, before, after, "nothing ran")

	_, err = admin.Exec(ctx, "ALTER TABLE inbox_ordering_keys OWNER TO "+owner)
	require.NoError(t, err)
	v, err := inheritStore.VacuumIfDead(ctx, 1)
	require.NoError(t, err)
	require.True(t, v.Ran)
	after, _ = tableVacuums(t, pool, leasing.Inbox.Table())
	require.Equal(t, before+1, after)
}
