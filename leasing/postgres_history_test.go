package leasing_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/leasestore/leasestore/db"
	"github.com/leasestore/leasestore/internal/dbtest"
	"github.com/leasestore/leasestore/leasing"
	"github.com/leasestore/leasestore/leasing/leasingtest"
)

// historyStore is a store on a fresh database with its clock pinned to a
// manual clock, for the attempt-history tests.
func historyStore(t *testing.T, q leasing.Queue) (*leasing.Postgres, *leasingtest.Clock) {
	t.Helper()
	clock := leasingtest.NewClock(leasingtest.Start)
	return openStore(t, dbtest.DatabaseURL(t), q, leasing.PostgresOptions{Now: clock.Now}), clock
}

func claimOne(t *testing.T, s *leasing.Postgres, owner string) leasing.Lease {
	t.Helper()
	leases, err := s.Claim(t.Context(), leasing.ClaimRequest{Owner: owner, BatchSize: 1, LeaseFor: time.Minute})
	require.NoError(t, err)
	require.Len(t, leases, 1)
	return leases[0]
}

// TestRetryAfterLaterLeaseIsAlreadyApplied: a Fail, Release or DeadLetter
// whose reply was lost after it committed is retried after a later lease
// claimed the message and wrote a Fail or Release of its own. The retry
// reports already_applied and changes nothing. Before the attempt history
// the outcome was read from outcome/outcome_generation, which the later
// lease's write had overwritten, and the retry reported lost.
func TestRetryAfterLaterLeaseIsAlreadyApplied(t *testing.T) {
	t.Parallel()
	firsts := []string{"Fail", "Release", "DeadLetter"}
	laters := []string{"Fail", "Release"}
	for _, q := range queuesBoth {
		for _, first := range firsts {
			for _, later := range laters {
				t.Run(fmt.Sprintf("%s/%s/After%s", q, first, later), func(t *testing.T) {
					t.Parallel()
					ctx := t.Context()
					store, clock := historyStore(t, q)
					write := func(name string, l leasing.Lease) leasing.WriteResult {
						var res leasing.WriteResult
						var err error
						switch name {
						case "Fail":
							res, err = store.Fail(ctx, leasing.Failure{Lease: l, RetryAfter: time.Second, Error: "boom"})
						case "Release":
							res, err = store.Release(ctx, l)
						case "DeadLetter":
							res, err = store.DeadLetter(ctx, leasing.Failure{Lease: l, Error: "poison"})
						}
						require.NoError(t, err)
						return res
					}
					msg := plainMessage(q)
					enq, err := store.Enqueue(ctx, msg)
					require.NoError(t, err)
					id := enq.IDs[0]

					lease := claimOne(t, store, "worker-a")
					require.Equal(t, leasing.OutcomeApplied, write(first, lease).Outcomes[0].Outcome)
					if first == "DeadLetter" {
						_, err := store.Requeue(ctx, id)
						require.NoError(t, err)
					}
					clock.Advance(time.Second)
					next := claimOne(t, store, "worker-b")
					require.Equal(t, leasing.OutcomeApplied, write(later, next).Outcomes[0].Outcome)
					before, err := store.Get(ctx, id)
					require.NoError(t, err)

					retry := write(first, lease)
					require.Equal(t, leasing.OutcomeAlreadyApplied, retry.Outcomes[0].Outcome,
						"a retried %s after a later lease's %s", first, later)
					require.NoError(t, retry.Err())
					after, err := store.Get(ctx, id)
					require.NoError(t, err)
					require.Equal(t, before, after, "the retry changed nothing")
				})
			}
		}
	}
}

// TestAttemptHistorySequence: claim, fail, reclaim after expiry and
// dead-letter leave one entry each, in order, with the database clock's
// times; an operator's forced dead-letter of a requeued, leased message
// fences its holder and is recorded as forced with the reason.
func TestAttemptHistorySequence(t *testing.T) {
	t.Parallel()
	for _, q := range queuesBoth {
		t.Run(string(q), func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			store, clock := historyStore(t, q)
			msg := plainMessage(q)
			enq, err := store.Enqueue(ctx, msg)
			require.NoError(t, err)
			id := enq.IDs[0]

			t1 := clock.Now()
			l1 := claimOne(t, store, "worker-a")
			clock.Advance(time.Second)
			t2 := clock.Now()
			res, err := store.Fail(ctx, leasing.Failure{Lease: l1, Error: "connection refused"})
			require.NoError(t, err)
			require.NoError(t, res.Err())
			t3 := clock.Now()
			l2 := claimOne(t, store, "worker-b") // never finishes
			clock.Advance(2 * time.Minute)
			t4 := clock.Now()
			l3 := claimOne(t, store, "worker-c") // reclaims b's expired lease
			clock.Advance(time.Second)
			t5 := clock.Now()
			res, err = store.DeadLetter(ctx, leasing.Failure{Lease: l3, Error: "schema mismatch"})
			require.NoError(t, err)
			require.NoError(t, res.Err())

			row, err := store.Get(ctx, id)
			require.NoError(t, err)
			want := []leasing.Attempt{
				{Attempt: 1, Generation: l1.Generation, Owner: "worker-a", ClaimedAt: &t1, FinishedAt: t2,
					End: leasing.AttemptFailed, Error: "connection refused"},
				{Attempt: 2, Generation: l2.Generation, Owner: "worker-b", ClaimedAt: &t3, FinishedAt: l2.ExpiresAt,
					End: leasing.AttemptExpired},
				{Attempt: 3, Generation: l3.Generation, Owner: "worker-c", ClaimedAt: &t4, FinishedAt: t5,
					End: leasing.AttemptDeadLettered, Error: "schema mismatch"},
			}
			require.Equal(t, want, row.Attempts)

			// Requeued and claimed again, then stopped by an operator.
			_, err = store.Requeue(ctx, id)
			require.NoError(t, err)
			t6 := clock.Now()
			l4 := claimOne(t, store, "worker-d")
			_, err = store.DeadLetterByID(ctx, leasing.DeadLetterByIDRequest{ID: id, Reason: "poison: see ticket 42"})
			require.ErrorIs(t, err, leasing.ErrLeaseHeld)
			clock.Advance(time.Second)
			t7 := clock.Now()
			entry, err := store.DeadLetterByID(ctx, leasing.DeadLetterByIDRequest{ID: id, Reason: "poison: see ticket 42", Force: true})
			require.NoError(t, err)
			forced := leasing.Attempt{Attempt: 1, Generation: l4.Generation, Owner: "worker-d", ClaimedAt: &t6, FinishedAt: t7,
				End: leasing.AttemptDeadLettered, Error: "poison: see ticket 42", Operator: true, Forced: true}
			require.Equal(t, forced, entry)
			res, err = store.Complete(ctx, l4)
			require.NoError(t, err)
			require.Equal(t, leasing.OutcomeTerminal, res.Outcomes[0].Outcome, "the forced holder is fenced")

			row, err = store.Get(ctx, id)
			require.NoError(t, err)
			want = append(want, leasing.Attempt{Attempt: 3, FinishedAt: t6, End: leasing.AttemptRequeued, Operator: true}, forced)
			require.Equal(t, want, row.Attempts)
			require.Equal(t, leasing.StatusDeadLettered, row.Status)
			require.Equal(t, l4.Generation+1, row.LeaseGeneration)
		})
	}
}

// TestCompletedHistoryFromLeaseColumns: Complete stores no history entry,
// and Get still ends a completed row's history with the completing
// attempt, read from its lease columns: after earlier attempts, at the
// history's limit, and once only for a row an earlier version completed
// with the entry stored. A retried Complete is already applied.
func TestCompletedHistoryFromLeaseColumns(t *testing.T) {
	t.Parallel()
	for _, q := range queuesBoth {
		t.Run(string(q), func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			store, clock := historyStore(t, q)
			msg := plainMessage(q)
			enq, err := store.Enqueue(ctx, msg, msg)
			require.NoError(t, err)
			id, full := enq.IDs[0], enq.IDs[1]
			stored := func(id uuid.UUID) (n int, done int) {
				t.Helper()
				require.NoError(t, store.Pool().QueryRow(ctx,
					"SELECT jsonb_array_length(attempts), jsonb_array_length(jsonb_path_query_array(attempts, '$[*] ? (@.outcome == $o)', jsonb_build_object('o', $2::text))) FROM "+
						tableOf(q)+" WHERE message_id = $1", id, string(q.Succeeded())).Scan(&n, &done))
				return n, done
			}
			done := leasing.AttemptEnd(q.Succeeded())

			t1 := clock.Now()
			l1 := claimOne(t, store, "worker-a")
			clock.Advance(time.Second)
			t2 := clock.Now()
			_, err = store.Fail(ctx, leasing.Failure{Lease: l1, Error: "boom"})
			require.NoError(t, err)
			t3 := clock.Now()
			l2 := claimOne(t, store, "worker-b")
			require.Equal(t, id, l2.Message.ID)
			clock.Advance(time.Second)
			t4 := clock.Now()
			res, err := store.Complete(ctx, l2)
			require.NoError(t, err)
			require.Equal(t, leasing.OutcomeApplied, res.Outcomes[0].Outcome)
			n, doneStored := stored(id)
			require.Equal(t, 1, n, "only the failed attempt is stored")
			require.Zero(t, doneStored)

			row, err := store.Get(ctx, id)
			require.NoError(t, err)
			require.Equal(t, []leasing.Attempt{
				{Attempt: 1, Generation: l1.Generation, Owner: "worker-a", ClaimedAt: &t1, FinishedAt: t2,
					End: leasing.AttemptFailed, Error: "boom"},
				{Attempt: 2, Generation: l2.Generation, Owner: "worker-b", ClaimedAt: &t3, FinishedAt: t4, End: done},
			}, row.Attempts)
			res, err = store.Complete(ctx, l2)
			require.NoError(t, err)
			require.Equal(t, leasing.OutcomeAlreadyApplied, res.Outcomes[0].Outcome)
			res, err = store.Complete(ctx, l1)
			require.NoError(t, err)
			require.Equal(t, leasing.OutcomeTerminal, res.Outcomes[0].Outcome)

			// An earlier version stored the entry: Get shows it once.
			_, err = store.Pool().Exec(ctx, "UPDATE "+tableOf(q)+` SET attempts = attempts || jsonb_build_array(jsonb_build_object(
				'attempt', attempt_count, 'generation', lease_generation, 'owner', lease_owner,
				'claimed_at', last_attempted_at, 'finished_at', `+string(q.Succeeded())+`_at, 'outcome', $2::text))
				WHERE message_id = $1`, id, string(q.Succeeded()))
			require.NoError(t, err)
			again, err := store.Get(ctx, id)
			require.NoError(t, err)
			require.Equal(t, row.Attempts, again.Attempts)

			// At the limit the oldest entry makes room, as a stored append does.
			var history []leasing.Attempt
			for i := range leasing.AttemptHistoryLimit + 1 {
				claimed := clock.Now()
				l := claimOne(t, store, fmt.Sprintf("worker-%d", i))
				require.Equal(t, full, l.Message.ID)
				clock.Advance(time.Millisecond)
				entry := leasing.Attempt{Attempt: l.Attempt, Generation: l.Generation, Owner: l.Owner,
					ClaimedAt: &claimed, FinishedAt: clock.Now(), End: done}
				if i < leasing.AttemptHistoryLimit {
					entry.End, entry.Error = leasing.AttemptFailed, "again"
					_, err = store.Fail(ctx, leasing.Failure{Lease: l, Error: "again"})
				} else {
					_, err = store.Complete(ctx, l)
				}
				require.NoError(t, err)
				history = append(history, entry)
			}
			n, _ = stored(full)
			require.Equal(t, leasing.AttemptHistoryLimit, n)
			row, err = store.Get(ctx, full)
			require.NoError(t, err)
			require.Equal(t, history[1:], row.Attempts)
		})
	}
}

// TestRetryOfRowWithoutHistory: a row whose Fail an earlier version wrote
// (outcome columns set, no history entry, as during a rolling deploy) still
// answers a retry with already_applied.
func TestRetryOfRowWithoutHistory(t *testing.T) {
	t.Parallel()
	for _, q := range queuesBoth {
		t.Run(string(q), func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			store, _ := historyStore(t, q)
			msg := plainMessage(q)
			_, err := store.Enqueue(ctx, msg)
			require.NoError(t, err)
			l := claimOne(t, store, "old-version")
			_, err = store.Fail(ctx, leasing.Failure{Lease: l, Error: "boom"})
			require.NoError(t, err)
			_, err = store.Pool().Exec(ctx, "UPDATE "+tableOf(q)+" SET attempts = '[]' WHERE message_id = $1", l.Message.ID)
			require.NoError(t, err)
			res, err := store.Fail(ctx, leasing.Failure{Lease: l, Error: "boom"})
			require.NoError(t, err)
			require.Equal(t, leasing.OutcomeAlreadyApplied, res.Outcomes[0].Outcome)
		})
	}
}

// TestClaimLeavesHistoryOfDueRows: a claim of pending and failed rows
// writes nothing to their history, so the claim's row versions grow only
// when a lease is reclaimed.
func TestClaimLeavesHistoryOfDueRows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store, _ := historyStore(t, leasing.Inbox)
	_, err := store.Enqueue(ctx, make([]leasing.NewMessage, 3)...)
	require.NoError(t, err)
	leases, err := store.Claim(ctx, leasing.ClaimRequest{Owner: "w", BatchSize: 3, LeaseFor: time.Minute})
	require.NoError(t, err)
	var n int
	require.NoError(t, store.Pool().QueryRow(ctx,
		"SELECT count(*) FROM inbox_messages WHERE attempts <> '[]' OR message_id <> ALL($1::uuid[])",
		[]uuid.UUID{leases[0].Message.ID, leases[1].Message.ID, leases[2].Message.ID}).Scan(&n))
	require.Zero(t, n)
}

// TestRolesKeepWorkingAcross00006: a database whose roles were applied at
// migration 00005 is migrated to 00006 and db/roles.sql is not run again:
// processors of this version, which write the attempts column, still work,
// because the migration grants leasestore_processor UPDATE on it.
func TestRolesKeepWorkingAcross00006(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	url := dbtest.NewEmptyDatabase(t)
	pool := newPool(t, url, "", 2)
	provider, sqlDB, err := db.NewMigrator(pool)
	require.NoError(t, err)
	t.Cleanup(func() { _ = sqlDB.Close() })
	_, err = provider.UpTo(ctx, 5)
	require.NoError(t, err)
	// db/roles.sql as it was before 00006: without the attempts column
	// (nor what 00010 added).
	before := strings.ReplaceAll(rolesBefore00010(t), ", attempts)", ")")
	require.NotEqual(t, rolesBefore00010(t), before)
	rolesMu.Lock()
	_, err = adminConn(t, url).Exec(ctx, before)
	rolesMu.Unlock()
	require.NoError(t, err)
	_, err = provider.Up(ctx)
	require.NoError(t, err)

	role := loginRole(t, url, "leasestore_processor")
	for _, q := range queuesBoth {
		store := openStore(t, asUser(t, url, role), q, leasing.PostgresOptions{})
		msg := plainMessage(q)
		_, err := store.Enqueue(ctx, msg)
		require.NoError(t, err)
		l := claimOne(t, store, "w")
		res, err := store.Fail(ctx, leasing.Failure{Lease: l, Error: "boom"})
		require.NoError(t, err, q)
		require.NoError(t, res.Err())
		l = claimOne(t, store, "w")
		res, err = store.Complete(ctx, l)
		require.NoError(t, err, q)
		require.NoError(t, res.Err())
		row, err := store.Get(ctx, l.Message.ID)
		require.NoError(t, err)
		require.Len(t, row.Attempts, 2)
	}
}

// rolesBefore00010 is db/roles.sql without what migrations 00010 and
// later need: the key_seq column, the ordering keys' tables and the work
// signal's sequences.
func rolesBefore00010(tb testing.TB) string {
	tb.Helper()
	text := strings.ReplaceAll(rolesSQL(tb), ", key_seq)", ")")
	start := strings.Index(text, "-- Ordering keys (migration 00010)")
	end := strings.Index(text, "GRANT DELETE ON inbox_messages")
	require.True(tb, start > 0 && end > start, "db/roles.sql holds the ordering keys' block before the operator's DELETE")
	text = text[:start] + text[end:]
	// Nor the work signal's block (migration 00014), which ends the file.
	start, end = strings.Index(text, "-- The work signal (migration 00014)"), strings.Index(text, "COMMIT;")
	require.True(tb, start > 0 && end > start, "db/roles.sql ends with the work signal's block")
	return text[:start] + text[end:]
}

// TestRolesKeepWorkingAcross00010: a database whose roles were applied at
// migration 00009 is migrated on and db/roles.sql is not run again:
// processors still enqueue, claim and complete keyed messages, because
// 00010 grants leasestore_processor what they need.
func TestRolesKeepWorkingAcross00010(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	url := dbtest.NewEmptyDatabase(t)
	pool := newPool(t, url, "", 2)
	provider, sqlDB, err := db.NewMigrator(pool)
	require.NoError(t, err)
	t.Cleanup(func() { _ = sqlDB.Close() })
	_, err = provider.UpTo(ctx, 9)
	require.NoError(t, err)
	rolesMu.Lock()
	_, err = adminConn(t, url).Exec(ctx, rolesBefore00010(t))
	rolesMu.Unlock()
	require.NoError(t, err)
	_, err = provider.Up(ctx)
	require.NoError(t, err)

	role := loginRole(t, url, "leasestore_processor")
	for _, q := range queuesBoth {
		store := openStore(t, asUser(t, url, role), q, leasing.PostgresOptions{})
		res, err := store.Enqueue(ctx, leasing.NewMessage{OrderingKey: "k"}, leasing.NewMessage{OrderingKey: "k"})
		require.NoError(t, err)
		for _, id := range res.IDs {
			l := claimOne(t, store, "w")
			require.Equal(t, id, l.Message.ID)
			w, err := store.Complete(ctx, l)
			require.NoError(t, err, q)
			require.NoError(t, w.Err())
		}
	}
}
