package reliability_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/leasestore/leasestore/leasing"
	"github.com/leasestore/leasestore/leasing/leasingtest"
)

// Unknown commit. Two real, deterministic forms:
//   - ReplyLostAfterCommit: the statement reaches the server and commits,
//     and the connection dies before the client reads the reply. A net.Conn
//     wrapper holds back the client's read of the reply until an admin
//     connection sees the committed change, then closes the socket: the
//     call returns a connection error though the write applied. The retry
//     of the same lease must report already_applied (never applied twice,
//     never lost) and change nothing.
//   - KilledBeforeCommit: the statement reaches the server and blocks on a
//     row lock an admin transaction holds; the admin terminates the
//     worker's backend (pg_terminate_backend) while it waits. The call
//     returns an error, nothing changed, and the retry applies.
// A pg_terminate_backend that lands exactly between commit and reply
// cannot be scheduled deterministically from outside; the chaos runs in
// fault_chaos_test.go (TerminateBackends, DroppedReplies) produce both
// cases at random, and the stress checks assert the same invariants there.

func TestFaultUnknownCommit(t *testing.T) {
	t.Parallel()

	t.Run("ReplyLostAfterCommit", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		url := freshURL(t)
		admin := adminConn(t, url)
		dropper := &dropAfterCommit{}
		cfg, err := pgxpool.ParseConfig(url)
		require.NoError(t, err)
		cfg.MaxConns = 1
		cfg.ConnConfig.DialFunc = dropper.dial
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		require.NoError(t, err)
		t.Cleanup(pool.Close)
		for _, q := range queuesBoth {
			store, err := leasing.NewPostgres(pool, q, leasing.PostgresOptions{})
			require.NoError(t, err)
			for _, w := range faultWrites {
				_, err := store.Enqueue(ctx, leasing.NewMessage{})
				require.NoError(t, err)
				ls, err := store.Claim(ctx, leasing.ClaimRequest{Owner: "w", BatchSize: 1, LeaseFor: time.Hour})
				require.NoError(t, err)
				require.Len(t, ls, 1)
				l := ls[0]
				dropper.arm([]byte(l.Message.ID.String()), waitStatus(t, url, q, l.Message.ID, w.status(q)))
				fired := dropper.fired.Load()
				_, err = w.do(ctx, store, l)
				require.Error(t, err, "%s %s: the reply was lost", q, w.name)
				require.False(t, isArgErr(err))
				require.Equal(t, fired+1, dropper.fired.Load(), "%s %s: the fault did not fire", q, w.name)
				status, gen := rowState(t, admin, q, l.Message.ID)
				require.Equal(t, w.status(q), status, "%s %s: the write committed", q, w.name)
				require.Equal(t, l.Generation, gen)

				before := tableDigest(t, admin)
				res, err := w.do(ctx, store, l) // the retry, on a new connection
				require.NoError(t, err, "%s %s retry", q, w.name)
				require.Equal(t, leasing.OutcomeAlreadyApplied, res.Outcomes[0].Outcome, "%s %s retry", q, w.name)
				require.NoError(t, res.Err())
				require.Equal(t, before, tableDigest(t, admin), "%s %s: the retry changed something", q, w.name)
				if w.name == "Release" || w.name == "Fail" {
					// Settle the row so the next claim takes the next message.
					_, err = admin.Exec(ctx, "UPDATE "+tableOf(q)+" SET status = 'dead_lettered', dead_lettered_at = now() WHERE message_id = $1", l.Message.ID)
					require.NoError(t, err)
				}
			}

			// Enqueue: the inbox reports the retried message as a duplicate
			// (it was accepted); the outbox, which does not deduplicate,
			// fails the retry with ErrDuplicate and holds the row once.
			id := uuid.New()
			msg := leasing.NewMessage{ID: id}
			dropper.arm([]byte(id.String()), waitStatus(t, url, q, id, "pending"))
			_, err = store.Enqueue(ctx, msg)
			require.Error(t, err)
			res, err := store.Enqueue(ctx, msg)
			if q == leasing.Inbox {
				require.NoError(t, err)
				require.Equal(t, []leasing.Duplicate{{Index: 0, ID: id}}, res.Duplicates)
			} else {
				require.ErrorIs(t, err, leasing.ErrDuplicate)
			}
			var n int
			require.NoError(t, admin.QueryRow(ctx, "SELECT count(*) FROM "+tableOf(q)+" WHERE message_id = $1", id).Scan(&n))
			require.Equal(t, 1, n)
		}
	})

	t.Run("KilledBeforeCommit", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		url := freshURL(t)
		admin := adminConn(t, url)
		const app = "leasestore-fault-killed"
		pool := newPool(t, url, app, 1)
		for _, q := range queuesBoth {
			store, err := leasing.NewPostgres(pool, q, leasing.PostgresOptions{})
			require.NoError(t, err)
			for _, w := range faultWrites {
				_, err := store.Enqueue(ctx, leasing.NewMessage{})
				require.NoError(t, err)
				ls, err := store.Claim(ctx, leasing.ClaimRequest{Owner: "w", BatchSize: 1, LeaseFor: time.Hour})
				require.NoError(t, err)
				l := ls[0]
				before := tableDigest(t, admin)

				locker := adminConn(t, url)
				tx, err := locker.Begin(ctx)
				require.NoError(t, err)
				_, err = tx.Exec(ctx, "SELECT 1 FROM "+tableOf(q)+" WHERE message_id = $1 FOR UPDATE", l.Message.ID)
				require.NoError(t, err)
				done := make(chan error, 1)
				go func() { _, err := w.do(ctx, store, l); done <- err }()
				waitForLockWait(t, admin, app)
				var killed bool
				require.NoError(t, admin.QueryRow(ctx, `
					SELECT pg_terminate_backend(pid) FROM pg_stat_activity
					WHERE application_name = $1 AND wait_event_type = 'Lock'`, app).Scan(&killed))
				require.True(t, killed)
				select {
				case err := <-done:
					require.Error(t, err, "%s %s", q, w.name)
					require.True(t, isConnErr(err), "%s %s: %v", q, w.name, err)
				case <-time.After(10 * time.Second):
					t.Fatalf("%s %s: still running after its backend was terminated", q, w.name)
				}
				require.NoError(t, tx.Rollback(ctx))
				require.Equal(t, before, tableDigest(t, admin), "%s %s: a terminated statement changed rows", q, w.name)

				res, err := w.do(ctx, store, l)
				require.NoError(t, err)
				require.Equal(t, leasing.OutcomeApplied, res.Outcomes[0].Outcome, "%s %s retry", q, w.name)
				status, _ := rowState(t, admin, q, l.Message.ID)
				require.Equal(t, w.status(q), status)
				if w.name == "Release" || w.name == "Fail" {
					_, err = admin.Exec(ctx, "UPDATE "+tableOf(q)+" SET status = 'dead_lettered', dead_lettered_at = now() WHERE message_id = $1", l.Message.ID)
					require.NoError(t, err)
				}
			}
		}
	})
}

// TestFaultRetriedWriteAfterReclaim: a Fail (or Release) commits, its reply
// is lost, the message becomes due and another worker claims it; the
// retry of the first write then reports lost although it had applied. The
// issue asks that a retried outcome write never reports a false lease lost.
// The row keeps no trace of which generation wrote failed/pending, so the
// store cannot tell this retry from a write whose lease expired unused.
func TestFaultRetriedWriteAfterReclaim(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	clock := leasingtest.NewClock(leasingtest.Start)
	url := freshURL(t)
	for _, q := range queuesBoth {
		for _, w := range []string{"Fail", "Release"} {
			store := openStore(t, url, q, leasing.PostgresOptions{Now: clock.Now})
			_, err := store.Enqueue(ctx, leasing.NewMessage{})
			require.NoError(t, err)
			first, err := store.Claim(ctx, leasing.ClaimRequest{Owner: "a", BatchSize: 1, LeaseFor: time.Minute})
			require.NoError(t, err)
			write := func() (leasing.WriteResult, error) {
				if w == "Fail" {
					return store.Fail(ctx, leasing.Failure{Lease: first[0], Error: "boom"})
				}
				return store.Release(ctx, first[0])
			}
			res, err := write() // applies; suppose its reply was lost
			require.NoError(t, err)
			require.Equal(t, leasing.OutcomeApplied, res.Outcomes[0].Outcome)
			second, err := store.Claim(ctx, leasing.ClaimRequest{Owner: "b", BatchSize: 1, LeaseFor: time.Minute})
			require.NoError(t, err)
			require.Len(t, second, 1) // b now works the message
			res, err = write()        // a's retry
			require.NoError(t, err)
			require.NotEqual(t, leasing.OutcomeLost, res.Outcomes[0].Outcome,
				"%s %s: a retried write that had applied reports lost after the message was reclaimed", q, w)
			_, err = store.Complete(ctx, second...)
			require.NoError(t, err)
		}
	}
}
