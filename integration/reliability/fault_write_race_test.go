package reliability_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/leasestore/leasestore/leasing"
)

// TestFaultWriteRacesCommittedChange: a fenced write whose statement
// started before another transaction's change to its row committed waits
// for that row's lock and then judges the fence on the row as that change
// left it (the writes check the fence on their locked copy of the row, not
// on the version their snapshot saw). A reclaim by another owner that
// commits meanwhile makes every write report lost and renew renew nothing;
// a change that keeps the lease (a renew's new expiry) lets every write apply.
func TestFaultWriteRacesCommittedChange(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := freshURL(t)
	admin := adminConn(t, url)
	const app = "leasestore-fault-race"
	pool := newPool(t, url, app, 1)
	writes := append([]faultWrite{{"Renew", func(q leasing.Queue) string { return string(q.InFlight()) },
		func(ctx context.Context, s leasing.Store, l leasing.Lease) (leasing.WriteResult, error) {
			res, err := s.Renew(ctx, time.Hour, l)
			if err != nil {
				return leasing.WriteResult{}, err
			}
			outcome := leasing.OutcomeLost
			if len(res.Renewed) == 1 {
				outcome = leasing.OutcomeApplied
			}
			return leasing.WriteResult{Outcomes: []leasing.MessageOutcome{{MessageID: l.Message.ID, Outcome: outcome}}}, nil
		}}}, faultWrites...)
	for _, q := range queuesBoth {
		store, err := leasing.NewPostgres(pool, q, leasing.PostgresOptions{})
		require.NoError(t, err)
		for _, w := range writes {
			for _, c := range []struct {
				name   string
				change string // run by the other transaction on the row ($1)
				want   leasing.Outcome
			}{
				{"Reclaimed", "UPDATE " + tableOf(q) + " SET lease_owner = 'other', lease_generation = lease_generation + 1 WHERE message_id = $1", leasing.OutcomeLost},
				{"Renewed", "UPDATE " + tableOf(q) + " SET lease_expires_at = now() + interval '2 hours' WHERE message_id = $1", leasing.OutcomeApplied},
			} {
				msg := leasing.NewMessage{}
				if q == leasing.Outbox {
					msg.Topic = "t"
				}
				_, err := store.Enqueue(ctx, msg)
				require.NoError(t, err)
				ls, err := store.Claim(ctx, leasing.ClaimRequest{Owner: "w", BatchSize: 1, LeaseFor: time.Hour})
				require.NoError(t, err)
				require.Len(t, ls, 1)
				l := ls[0]

				other := adminConn(t, url)
				tx, err := other.Begin(ctx)
				require.NoError(t, err)
				_, err = tx.Exec(ctx, c.change, l.Message.ID)
				require.NoError(t, err)
				done := make(chan error, 1)
				var res leasing.WriteResult
				go func() {
					var err error
					res, err = w.do(ctx, store, l)
					done <- err
				}()
				waitForLockWait(t, admin, app) // its snapshot predates the change
				require.NoError(t, tx.Commit(ctx))
				select {
				case err := <-done:
					require.NoError(t, err, "%s %s %s", q, w.name, c.name)
				case <-time.After(10 * time.Second):
					t.Fatalf("%s %s %s: still waiting after the change committed", q, w.name, c.name)
				}
				require.Len(t, res.Outcomes, 1)
				require.Equal(t, c.want, res.Outcomes[0].Outcome, "%s %s %s", q, w.name, c.name)
				status, gen := rowState(t, admin, q, l.Message.ID)
				if c.want == leasing.OutcomeLost {
					require.Equal(t, string(q.InFlight()), status, "%s %s %s: the other owner's lease must stand", q, w.name, c.name)
					require.Equal(t, l.Generation+1, gen, "%s %s %s", q, w.name, c.name)
				} else {
					require.Equal(t, w.status(q), status, "%s %s %s", q, w.name, c.name)
				}
				// Leave nothing due for the next claim.
				_, err = admin.Exec(ctx, "UPDATE "+tableOf(q)+" SET status = 'dead_lettered', dead_lettered_at = now(), lease_expires_at = NULL WHERE message_id = $1 AND status IN ('pending', 'failed', 'processing', 'publishing')", l.Message.ID)
				require.NoError(t, err)
			}
		}
	}
}
