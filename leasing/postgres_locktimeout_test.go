package leasing_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/leasestore/leasestore/internal/dbtest"
	"github.com/leasestore/leasestore/leasing"
	"github.com/leasestore/leasestore/leasing/processor"
)

// testLockTimeout is the PostgresOptions.LockTimeout of these tests.
const testLockTimeout = 100 * time.Millisecond

// lockCallWait bounds each call's context while the table is locked: a
// call that returns the lock timeout error before it ended did not wait
// for the lock to go.
const lockCallWait = 30 * time.Second

// lockFixture is the state one run of lockCalls needs: six leases of
// tenant owned by owner and one dead-lettered message.
type lockFixture struct {
	tenant string
	owner  string
	leases []leasing.Lease
	dead   uuid.UUID
}

func newLockFixture(t *testing.T, store *leasing.Postgres, tenant string) lockFixture {
	t.Helper()
	ctx := context.Background()
	f := lockFixture{tenant: tenant, owner: "owner-" + tenant}
	msgs := make([]leasing.NewMessage, 7)
	for i := range msgs {
		msgs[i] = leasing.NewMessage{Type: "lock", TenantID: tenant}
	}
	_, err := store.Enqueue(ctx, msgs...)
	require.NoError(t, err)
	leases, err := store.Claim(ctx, leasing.ClaimRequest{Owner: f.owner, BatchSize: 7, LeaseFor: time.Hour, TenantID: tenant})
	require.NoError(t, err)
	require.Len(t, leases, 7)
	res, err := store.DeadLetter(ctx, leasing.Failure{Lease: leases[6], Error: "poison"})
	require.NoError(t, err)
	require.NoError(t, res.Err())
	f.leases, f.dead = leases[:6], leases[6].Message.ID
	return f
}

// lockCalls returns one call of every store method that runs a statement
// on the queue table, on f's rows.
func lockCalls(store *leasing.Postgres, f lockFixture) []struct {
	name string
	call func(ctx context.Context) error
} {
	claim := leasing.ClaimRequest{Owner: f.owner, BatchSize: 1, LeaseFor: time.Hour, TenantID: f.tenant}
	held := make([]uuid.UUID, len(f.leases))
	for i, l := range f.leases {
		held[i] = l.Message.ID
	}
	write := func(res leasing.WriteResult, err error) error { return errors.Join(err, res.Err()) }
	return []struct {
		name string
		call func(ctx context.Context) error
	}{
		{"Claim", func(ctx context.Context) error { _, err := store.Claim(ctx, claim); return err }},
		{"CompleteAndClaim", func(ctx context.Context) error {
			res, _, err := store.CompleteAndClaim(ctx, f.leases[:1], claim)
			return write(res, err)
		}},
		{"Renew", func(ctx context.Context) error {
			res, err := store.Renew(ctx, time.Hour, f.leases[1])
			return errors.Join(err, res.Err())
		}},
		{"Release", func(ctx context.Context) error { return write(store.Release(ctx, f.leases[2])) }},
		{"Complete", func(ctx context.Context) error { return write(store.Complete(ctx, f.leases[3])) }},
		{"Fail", func(ctx context.Context) error {
			return write(store.Fail(ctx, leasing.Failure{Lease: f.leases[4], RetryAfter: time.Hour, Error: "boom"}))
		}},
		{"DeadLetter", func(ctx context.Context) error {
			return write(store.DeadLetter(ctx, leasing.Failure{Lease: f.leases[5], Error: "poison"}))
		}},
		{"ReleaseOrphans", func(ctx context.Context) error { _, err := store.ReleaseOrphans(ctx, f.owner, held); return err }},
		{"Requeue", func(ctx context.Context) error { _, err := store.Requeue(ctx, f.dead); return err }},
		{"RequeueAll", func(ctx context.Context) error { _, err := store.RequeueAll(ctx); return err }},
		{"Purge", func(ctx context.Context) error {
			_, err := store.Purge(ctx, leasing.PurgeRequest{OlderThan: time.Hour, BatchSize: 10})
			return err
		}},
		{"Stats", func(ctx context.Context) error { _, err := store.Stats(ctx); return err }},
		{"Get", func(ctx context.Context) error { _, err := store.Get(ctx, f.dead); return err }},
		{"List", func(ctx context.Context) error { _, err := store.List(ctx, leasing.ListRequest{Limit: 10}); return err }},
		{"Enqueue", func(ctx context.Context) error {
			_, err := store.Enqueue(ctx, leasing.NewMessage{Type: "lock", TenantID: f.tenant})
			return err
		}},
	}
}

// lockTable takes ACCESS EXCLUSIVE on the inbox table, as ALTER TABLE
// does, in a transaction on conn; release rolls it back.
func lockTable(t *testing.T, conn *pgx.Conn) (release func()) {
	t.Helper()
	ctx := context.Background()
	tx, err := conn.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, "LOCK TABLE inbox_messages IN ACCESS EXCLUSIVE MODE")
	require.NoError(t, err)
	var once sync.Once
	release = func() { once.Do(func() { require.NoError(t, tx.Rollback(ctx)) }) }
	t.Cleanup(release)
	return release
}

// lockPool returns a pool of one connection on u in query mode mode, with
// the session lock_timeout sessionLockTimeout unless it is "".
func lockPool(t *testing.T, u, mode, sessionLockTimeout string) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(withQueryMode(t, u, mode))
	require.NoError(t, err)
	cfg.MaxConns = 1
	if sessionLockTimeout != "" {
		cfg.ConnConfig.RuntimeParams["lock_timeout"] = sessionLockTimeout
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// TestLockTimeoutBehindDDL: while another transaction holds ACCESS
// EXCLUSIVE on the queue table, every store call on it fails with
// leasing.ErrLockTimeout, before its context ends and while the lock is
// still held, and changes nothing; once the lock is gone the same calls
// succeed. In exec and simple_protocol modes the store's LockTimeout alone
// does it; in cache_statement mode (pgx's default) the session also needs a
// lock_timeout for the statements pgx prepares again after a failed call
// (see TestLockTimeoutCachedStatements).
func TestLockTimeoutBehindDDL(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ mode, sessionLockTimeout string }{
		{"exec", ""},
		{"simple_protocol", ""},
		{"cache_statement", "200ms"},
	} {
		t.Run(c.mode, func(t *testing.T) {
			ctx := context.Background()
			u := dbtest.DatabaseURL(t)
			pool := lockPool(t, u, c.mode, c.sessionLockTimeout)
			store, err := leasing.NewPostgres(pool, leasing.Inbox, leasing.PostgresOptions{LockTimeout: testLockTimeout})
			require.NoError(t, err)
			f := newLockFixture(t, store, "locked")
			admin := adminConn(t, u)
			before := tableDigest(t, admin)

			release := lockTable(t, adminConn(t, u))
			for _, c := range lockCalls(store, f) {
				cctx, cancel := context.WithTimeout(ctx, lockCallWait)
				err := c.call(cctx)
				ended := cctx.Err()
				cancel()
				require.ErrorIs(t, err, leasing.ErrLockTimeout, "%s behind ACCESS EXCLUSIVE", c.name)
				require.NoError(t, ended, "%s returned before its context ended", c.name)
			}
			_, err = store.VacuumIfDead(ctx, 1)
			require.NoError(t, err, "the vacuum policy's check takes no table lock")
			release()

			require.Equal(t, before, tableDigest(t, admin), "the calls that timed out changed nothing")
			for _, c := range lockCalls(store, f) {
				require.NoError(t, c.call(ctx), "%s after the lock is gone", c.name)
			}
			// Each failed call rolled its transaction back: the pool kept
			// its one connection instead of replacing it.
			require.EqualValues(t, 1, pool.Stat().NewConnsCount(), "connections the pool opened")
		})
	}
}

// TestLockTimeoutCachedStatements pins down the limit of cache_statement
// mode without a session lock_timeout: a claim whose statements the
// connection has prepared fails with ErrLockTimeout; pgx then drops the
// statements of the failed batch from its cache, and the next claim on that
// connection prepares them again in a round trip of its own, before the
// store's transaction settings apply, so that preparation waits for the
// lock until the context ends. A session lock_timeout bounds it.
func TestLockTimeoutCachedStatements(t *testing.T) {
	t.Parallel()
	for _, sessionLockTimeout := range []string{"", "200ms"} {
		t.Run("session_lock_timeout="+sessionLockTimeout, func(t *testing.T) {
			ctx := context.Background()
			u := dbtest.DatabaseURL(t)
			store, err := leasing.NewPostgres(lockPool(t, u, "cache_statement", sessionLockTimeout), leasing.Inbox, leasing.PostgresOptions{LockTimeout: testLockTimeout})
			require.NoError(t, err)
			claim := leasing.ClaimRequest{Owner: "cached", BatchSize: 1, LeaseFor: time.Minute}
			_, err = store.Claim(ctx, claim) // prepares the statements
			require.NoError(t, err)
			release := lockTable(t, adminConn(t, u))
			defer release()

			cctx, cancel := context.WithTimeout(ctx, lockCallWait)
			_, err = store.Claim(cctx, claim)
			require.ErrorIs(t, err, leasing.ErrLockTimeout, "prepared: the store's lock timeout applies")
			require.NoError(t, cctx.Err())
			cancel()

			wait := lockCallWait
			if sessionLockTimeout == "" {
				wait = time.Second
			}
			cctx, cancel = context.WithTimeout(ctx, wait)
			defer cancel()
			_, err = store.Claim(cctx, claim)
			if sessionLockTimeout == "" {
				require.ErrorIs(t, err, context.DeadlineExceeded, "prepared again outside the transaction: waits for the lock")
				return
			}
			require.ErrorIs(t, err, leasing.ErrLockTimeout, "prepared again under the session's lock_timeout")
			require.NoError(t, cctx.Err())
		})
	}
}

// TestLockTimeoutProcessorRecovers: a processor whose claims and outcome
// writes fail with the lock timeout while DDL holds the queue table goes on
// by itself once the lock is gone: it reports the errors through OnError,
// drains the queue, and writes each outcome under the lease that ran it.
func TestLockTimeoutProcessorRecovers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	u := dbtest.DatabaseURL(t)
	producer, err := leasing.NewPostgres(newPool(t, u, "", 2), leasing.Inbox, leasing.PostgresOptions{})
	require.NoError(t, err)
	// exec mode: in cache_statement mode without a session lock_timeout,
	// statements that pgx prepares while the table is locked would wait
	// for the lock (see TestLockTimeoutCachedStatements).
	store, err := leasing.NewPostgres(newPool(t, withQueryMode(t, u, "exec"), "", 4), leasing.Inbox, leasing.PostgresOptions{LockTimeout: testLockTimeout})
	require.NoError(t, err)

	var lockErrs atomic.Int64
	var others sync.Map // unexpected errors
	gate := make(chan struct{})
	var running atomic.Int64
	var handled sync.Map // message id -> attempts seen
	handler := func(ctx context.Context, l leasing.Lease) error {
		handled.Store(l.Message.ID, l.Attempt)
		running.Add(1)
		select {
		case <-gate:
		case <-ctx.Done():
			return ctx.Err()
		}
		return nil
	}
	p, err := processor.New(store, handler, processor.Options{
		Owner: "recovers", BatchSize: 4, Concurrency: 4, PollInterval: 10 * time.Millisecond,
		LeaseDuration: time.Minute, Vacuum: processor.VacuumPolicy{Disabled: true},
		OnError: func(err error) {
			if errors.Is(err, leasing.ErrLockTimeout) {
				lockErrs.Add(1)
				return
			}
			others.Store(err.Error(), true)
		},
	})
	require.NoError(t, err)
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- p.Run(runCtx) }()
	defer func() {
		stop()
		require.NoError(t, <-done)
	}()

	// Outcome writes behind the lock: four handlers hold their leases
	// until the table is locked, then finish; the writer's tries fail
	// until the lock goes, within its retries.
	first, err := producer.Enqueue(ctx, make4("first", 0)...)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return running.Load() == 4 }, time.Minute, 5*time.Millisecond)
	release := lockTable(t, adminConn(t, u))
	close(gate)
	require.Eventually(t, func() bool { return lockErrs.Load() > 0 }, time.Minute, 5*time.Millisecond, "no call failed with the lock timeout")
	release()
	for _, id := range first.IDs {
		waitRow(t, producer, id, leasing.StatusCompleted)
	}

	// Claims behind the lock: messages that fall due while the table is
	// locked are claimed once it is gone.
	seen := lockErrs.Load()
	second, err := producer.Enqueue(ctx, make4("second", 300*time.Millisecond)...)
	require.NoError(t, err)
	release = lockTable(t, adminConn(t, u))
	locked := time.Now()
	require.Eventually(t, func() bool { return lockErrs.Load() > seen+2 && time.Since(locked) > time.Second },
		time.Minute, 5*time.Millisecond, "no claim failed with the lock timeout")
	release()
	for _, id := range second.IDs {
		waitRow(t, producer, id, leasing.StatusCompleted)
	}
	for _, id := range append(first.IDs, second.IDs...) {
		r, err := producer.Get(ctx, id)
		require.NoError(t, err)
		require.Equal(t, 1, r.AttemptCount, "message %s ran once: no write was lost, no lease expired", id)
	}
	others.Range(func(k, _ any) bool { t.Logf("other error: %s", k); return true })
}

// make4 returns four messages of type kind-i, due after delay.
func make4(kind string, delay time.Duration) []leasing.NewMessage {
	msgs := make([]leasing.NewMessage, 4)
	for i := range msgs {
		msgs[i] = leasing.NewMessage{Type: fmt.Sprintf("%s-%d", kind, i), Delay: delay}
	}
	return msgs
}

// waitRow waits until message id has status s.
func waitRow(t *testing.T, store *leasing.Postgres, id uuid.UUID, s leasing.Status) {
	t.Helper()
	require.Eventually(t, func() bool {
		r, err := store.Get(context.Background(), id)
		return err == nil && r.Status == s
	}, time.Minute, 5*time.Millisecond, "message %s never became %s", id, s)
}
