package leasing_test

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/leasestore/leasestore/leasing"
)

// Bad input at the store level, beyond the contract suite's
// BadInput/RejectedAndNothingChanged case (which covers batch sizes, owners,
// lease durations, empty lists, other-queue leases for Renew, Release,
// Complete and DeadLetter, payload limit and +1, and Fail's sanitised error
// text on both stores). Every case asserts the error kind and that the
// database is unchanged, by a digest of every row of both tables.

// badInputFixture is a database with pending and in-flight rows on both
// queues and leases on the in-flight ones.
type badInputFixture struct {
	url    string
	admin  *pgx.Conn
	stores map[leasing.Queue]*leasing.Postgres
	held   map[leasing.Queue]leasing.Lease
	ids    map[leasing.Queue][]uuid.UUID
}

func newBadInputFixture(t *testing.T, appName string) *badInputFixture {
	t.Helper()
	ctx := context.Background()
	f := &badInputFixture{
		url:    freshURL(t),
		stores: map[leasing.Queue]*leasing.Postgres{},
		held:   map[leasing.Queue]leasing.Lease{},
		ids:    map[leasing.Queue][]uuid.UUID{},
	}
	f.admin = adminConn(t, f.url)
	pool := newPool(t, f.url, appName, 2)
	for _, q := range queuesBoth {
		s, err := leasing.NewPostgres(pool, q, leasing.PostgresOptions{})
		require.NoError(t, err)
		res, err := s.Enqueue(ctx, leasing.NewMessage{}, leasing.NewMessage{}, leasing.NewMessage{})
		require.NoError(t, err)
		ls, err := s.Claim(ctx, leasing.ClaimRequest{Owner: "held", BatchSize: 1, LeaseFor: time.Hour})
		require.NoError(t, err)
		require.Len(t, ls, 1)
		f.stores[q], f.held[q], f.ids[q] = s, ls[0], res.IDs
	}
	return f
}

// storeCalls is every Store method (and the Postgres extras) called with
// valid arguments, so that only the context or the pool can make it fail.
func storeCalls(s *leasing.Postgres, held leasing.Lease, ids []uuid.UUID) map[string]func(context.Context) error {
	msg := plainMessage(s.Queue())
	failure := leasing.Failure{Lease: held, RetryAfter: time.Second, Error: "x"}
	return map[string]func(context.Context) error{
		"Enqueue": func(ctx context.Context) error { _, err := s.Enqueue(ctx, msg); return err },
		"EnqueueTx": func(ctx context.Context) error {
			return pgx.BeginFunc(ctx, s.Pool(), func(tx pgx.Tx) error { _, err := s.EnqueueTx(ctx, tx, msg); return err })
		},
		"EnqueueCopy": func(ctx context.Context) error {
			return pgx.BeginFunc(ctx, s.Pool(), func(tx pgx.Tx) error { _, err := s.EnqueueCopy(ctx, tx, msg); return err })
		},
		"Claim": func(ctx context.Context) error {
			_, err := s.Claim(ctx, leasing.ClaimRequest{Owner: "w", BatchSize: 10, LeaseFor: time.Minute})
			return err
		},
		"Renew":    func(ctx context.Context) error { _, err := s.Renew(ctx, time.Minute, held); return err },
		"Release":  func(ctx context.Context) error { _, err := s.Release(ctx, held); return err },
		"Complete": func(ctx context.Context) error { _, err := s.Complete(ctx, held); return err },
		"Fail":     func(ctx context.Context) error { _, err := s.Fail(ctx, failure); return err },
		"CompleteAndClaim": func(ctx context.Context) error {
			_, _, err := s.CompleteAndClaim(ctx, []leasing.Lease{held}, leasing.ClaimRequest{Owner: "w", BatchSize: 10, LeaseFor: time.Minute})
			return err
		},
		"DeadLetter": func(ctx context.Context) error { _, err := s.DeadLetter(ctx, failure); return err },
		"Requeue":    func(ctx context.Context) error { _, err := s.Requeue(ctx, ids...); return err },
		"RequeueAll": func(ctx context.Context) error { _, err := s.RequeueAll(ctx); return err },
		"Purge": func(ctx context.Context) error {
			_, err := s.Purge(ctx, leasing.PurgeRequest{OlderThan: time.Nanosecond, BatchSize: 10, IncludeDeadLettered: true})
			return err
		},
		"Stats": func(ctx context.Context) error { _, err := s.Stats(ctx); return err },
		"Get":   func(ctx context.Context) error { _, err := s.Get(ctx, ids[0]); return err },
		"List":  func(ctx context.Context) error { _, err := s.List(ctx, leasing.ListRequest{Limit: 10}); return err },
		"CountMatching": func(ctx context.Context) error {
			_, err := s.CountMatching(ctx, leasing.ListFilter{Status: leasing.StatusDeadLettered})
			return err
		},
		"DeadLetterGroups": func(ctx context.Context) error { _, err := s.DeadLetterGroups(ctx, 10); return err },
		"PurgeByID":        func(ctx context.Context) error { _, err := s.PurgeByID(ctx, ids...); return err },
		"KeyLines":         func(ctx context.Context) error { _, err := s.KeyLines(ctx, 10); return err },
		"Bulk": func(ctx context.Context) error {
			_, err := s.Bulk(ctx, leasing.BulkRequest{Action: leasing.BulkPurge, Filter: leasing.ListFilter{Type: "none"}, BatchSize: 10})
			return err
		},
	}
}

func TestBadInput(t *testing.T) {
	t.Parallel()

	// A store over a closed pool returns an error from every method, never
	// panics, and changes nothing.
	t.Run("ClosedPool", func(t *testing.T) {
		t.Parallel()
		f := newBadInputFixture(t, "leasestore-badinput-closed")
		before := tableDigest(t, f.admin)
		f.stores[leasing.Inbox].Pool().Close()
		for _, q := range queuesBoth {
			for name, call := range storeCalls(f.stores[q], f.held[q], f.ids[q]) {
				var err error
				require.NotPanics(t, func() { err = call(context.Background()) }, "%s %s", q, name)
				require.Error(t, err, "%s %s", q, name)
				require.False(t, isArgErr(err), "%s %s: %v", q, name, err)
				require.Contains(t, err.Error(), "closed pool", "%s %s", q, name)
			}
		}
		require.Equal(t, before, tableDigest(t, f.admin))
	})

	// A context cancelled before the call: the context's error, nothing sent.
	t.Run("CancelledBeforeCall", func(t *testing.T) {
		t.Parallel()
		f := newBadInputFixture(t, "leasestore-badinput-cancelled")
		before := tableDigest(t, f.admin)
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		for _, q := range queuesBoth {
			for name, call := range storeCalls(f.stores[q], f.held[q], f.ids[q]) {
				err := call(ctx)
				require.ErrorIs(t, err, context.Canceled, "%s %s", q, name)
			}
		}
		require.Equal(t, before, tableDigest(t, f.admin))
	})

	// A context cancelled while the statement waits on a lock: the
	// statement is cancelled, the call returns the context's error, the
	// transaction rolls back, and the pool serves the next call.
	t.Run("CancelledDuringCall", func(t *testing.T) {
		t.Parallel()
		const app = "leasestore-badinput-during"
		f := newBadInputFixture(t, app)
		ctx := context.Background()
		before := tableDigest(t, f.admin)
		locker := adminConn(t, f.url)
		tx, err := locker.Begin(ctx)
		require.NoError(t, err)
		_, err = tx.Exec(ctx, "LOCK TABLE inbox_messages, outbox_messages IN ACCESS EXCLUSIVE MODE")
		require.NoError(t, err)
		for _, q := range queuesBoth {
			for name, call := range storeCalls(f.stores[q], f.held[q], f.ids[q]) {
				callCtx, cancel := context.WithCancel(ctx)
				done := make(chan error, 1)
				go func() { done <- call(callCtx) }()
				waitForLockWait(t, f.admin, app)
				cancel()
				select {
				case err := <-done:
					require.ErrorIs(t, err, context.Canceled, "%s %s", q, name)
				case <-time.After(10 * time.Second):
					t.Fatalf("%s %s: still running 10s after its context was cancelled", q, name)
				}
				// The driver cancels the statement after the call returned:
				// until then its backend still waits, and the next call's
				// wait could not be told from it. A cancel that reached the
				// server before the next call's statement would be ignored,
				// and that call would commit once the lock is released.
				waitForNoLockWait(t, f.admin, app)
			}
		}
		require.NoError(t, tx.Rollback(ctx))
		require.Equal(t, before, tableDigest(t, f.admin))
		// The pool recovered: the held lease is still ours and completes.
		for _, q := range queuesBoth {
			res, err := f.stores[q].Complete(ctx, f.held[q])
			require.NoError(t, err)
			require.NoError(t, res.Err())
		}
	})

	// The largest payload round-trips byte for byte on both queues; one
	// byte more is an argument error and inserts nothing from the batch.
	t.Run("PayloadLimit", func(t *testing.T) {
		t.Parallel()
		f := newBadInputFixture(t, "leasestore-badinput-payload")
		ctx := context.Background()
		for _, q := range queuesBoth {
			s := f.stores[q]
			payload := bytes.Repeat([]byte{0, 0xff, 'x', 0x80}, leasing.MaxPayloadBytes/4)
			require.Len(t, payload, leasing.MaxPayloadBytes)
			before := tableDigest(t, f.admin)
			_, err := s.Enqueue(ctx, leasing.NewMessage{}, leasing.NewMessage{Payload: append(payload, 1)})
			require.ErrorIs(t, err, leasing.ErrInvalidArgument)
			err = pgx.BeginFunc(ctx, s.Pool(), func(tx pgx.Tx) error {
				_, err := s.EnqueueCopy(ctx, tx, leasing.NewMessage{Payload: append(payload, 1)})
				return err
			})
			require.ErrorIs(t, err, leasing.ErrInvalidArgument)
			require.Equal(t, before, tableDigest(t, f.admin))
			res, err := s.Enqueue(ctx, leasing.NewMessage{Payload: payload})
			require.NoError(t, err)
			row, err := s.Get(ctx, res.IDs[0])
			require.NoError(t, err)
			require.True(t, bytes.Equal(payload, row.Payload), "%s: payload changed in the round trip", q)
		}
	})

	// Error texts with NUL bytes and invalid UTF-8 are recorded sanitised by
	// Fail and DeadLetter (the contract checks Fail), cut on a rune boundary,
	// and handed to the next attempt as Lease.LastError.
	t.Run("ErrorTextSanitised", func(t *testing.T) {
		t.Parallel()
		f := newBadInputFixture(t, "leasestore-badinput-errtext")
		ctx := context.Background()
		texts := []string{
			"\x00",
			"a\x00b\xffc\xc3",
			strings.Repeat("€", leasing.MaxErrorBytes), // 3-byte runes: the cut must not split one
			strings.Repeat("\x00", leasing.MaxErrorBytes+1),
		}
		for _, q := range queuesBoth {
			s := f.stores[q]
			rest, err := s.Claim(ctx, leasing.ClaimRequest{Owner: "drain", BatchSize: 10, LeaseFor: time.Minute})
			require.NoError(t, err)
			_, err = s.Complete(ctx, rest...)
			require.NoError(t, err)
			for _, text := range texts {
				_, err := s.Enqueue(ctx, leasing.NewMessage{})
				require.NoError(t, err)
				_, err = s.Enqueue(ctx, leasing.NewMessage{})
				require.NoError(t, err)
				ls, err := s.Claim(ctx, leasing.ClaimRequest{Owner: "w", BatchSize: 2, LeaseFor: time.Minute})
				require.NoError(t, err)
				require.Len(t, ls, 2)
				res, err := s.Fail(ctx, leasing.Failure{Lease: ls[0], Error: text})
				require.NoError(t, err)
				require.NoError(t, res.Err())
				res, err = s.DeadLetter(ctx, leasing.Failure{Lease: ls[1], Error: text})
				require.NoError(t, err)
				require.NoError(t, res.Err())
				want := leasing.SanitizeError(text)
				require.True(t, utf8.ValidString(want))
				require.NotContains(t, want, "\x00")
				require.LessOrEqual(t, len(want), leasing.MaxErrorBytes)
				for _, l := range ls {
					row, err := s.Get(ctx, l.Message.ID)
					require.NoError(t, err)
					require.Equal(t, want, row.LastError, "%s %s", q, row.Status)
				}
				again, err := s.Claim(ctx, leasing.ClaimRequest{Owner: "w", BatchSize: 10, LeaseFor: time.Minute})
				require.NoError(t, err)
				require.Len(t, again, 1, "the failed row is due again, the dead letter is not")
				require.Equal(t, want, again[0].LastError)
				_, err = s.Complete(ctx, again...)
				require.NoError(t, err)
			}
		}
	})

	// Leases and arguments the contract case does not try; each is an
	// argument error that changes nothing, even when the batch also holds
	// a valid lease.
	t.Run("RejectedAndNothingChanged", func(t *testing.T) {
		t.Parallel()
		f := newBadInputFixture(t, "leasestore-badinput-rejected")
		ctx := context.Background()
		for _, q := range queuesBoth {
			s, held := f.stores[q], f.held[q]
			other := f.held[leasing.Outbox]
			if q == leasing.Outbox {
				other = f.held[leasing.Inbox]
			}
			with := func(change func(*leasing.Lease)) leasing.Lease { l := held; change(&l); return l }
			badOwner := with(func(l *leasing.Lease) { l.Owner = "\xff" })
			longOwner := with(func(l *leasing.Lease) { l.Owner = strings.Repeat("o", leasing.MaxOwnerBytes+1) })
			nulOwner := with(func(l *leasing.Lease) { l.Owner = "a\x00" })
			emptyOwner := with(func(l *leasing.Lease) { l.Owner = "" })
			negativeGen := with(func(l *leasing.Lease) { l.Generation = -1 })
			noQueue := with(func(l *leasing.Lease) { l.Queue = "" })
			tooMany := make([]leasing.NewMessage, leasing.MaxBatchSize+1)
			tooManyIDs := make([]uuid.UUID, leasing.MaxBatchSize+1)
			for i := range tooManyIDs {
				tooManyIDs[i] = uuid.New()
			}
			calls := map[string]func() error{
				"fail other queue": func() error { _, err := s.Fail(ctx, leasing.Failure{Lease: other}); return err },
				"complete valid + other queue": func() error {
					_, err := s.Complete(ctx, held, other)
					return err
				},
				"fail valid + other queue": func() error {
					_, err := s.Fail(ctx, leasing.Failure{Lease: held}, leasing.Failure{Lease: other})
					return err
				},
				"renew valid + other queue":    func() error { _, err := s.Renew(ctx, time.Minute, held, other); return err },
				"complete non-UTF-8 owner":     func() error { _, err := s.Complete(ctx, badOwner); return err },
				"complete long owner":          func() error { _, err := s.Complete(ctx, longOwner); return err },
				"complete NUL owner":           func() error { _, err := s.Complete(ctx, nulOwner); return err },
				"release empty owner":          func() error { _, err := s.Release(ctx, emptyOwner); return err },
				"dead-letter negative gen":     func() error { _, err := s.DeadLetter(ctx, leasing.Failure{Lease: negativeGen}); return err },
				"complete lease without queue": func() error { _, err := s.Complete(ctx, noQueue); return err },
				"renew negative duration":      func() error { _, err := s.Renew(ctx, -time.Second, held); return err },
				"renew enormous duration":      func() error { _, err := s.Renew(ctx, leasing.MaxLeaseDuration+1, held); return err },
				"fail enormous delay": func() error {
					_, err := s.Fail(ctx, leasing.Failure{Lease: held, RetryAfter: leasing.MaxDelay + 1})
					return err
				},
				"enqueue enormous delay": func() error { _, err := s.Enqueue(ctx, leasing.NewMessage{Delay: leasing.MaxDelay + 1}); return err },
				"enqueue too many":       func() error { _, err := s.Enqueue(ctx, tooMany...); return err },
				"enqueue invalid UTF-8 tenant": func() error {
					_, err := s.Enqueue(ctx, leasing.NewMessage{TenantID: "\xff"})
					return err
				},
				"enqueue-copy delay": func() error {
					return pgx.BeginFunc(ctx, s.Pool(), func(tx pgx.Tx) error { _, err := s.EnqueueCopy(ctx, tx, leasing.NewMessage{Delay: 1}); return err })
				},
				"enqueue-copy none": func() error {
					return pgx.BeginFunc(ctx, s.Pool(), func(tx pgx.Tx) error { _, err := s.EnqueueCopy(ctx, tx); return err })
				},
				"enqueue-tx none": func() error {
					return pgx.BeginFunc(ctx, s.Pool(), func(tx pgx.Tx) error { _, err := s.EnqueueTx(ctx, tx); return err })
				},
				"requeue too many ids": func() error { _, err := s.Requeue(ctx, tooManyIDs...); return err },
				"requeue nil":          func() error { _, err := s.Requeue(ctx, nil...); return err },
				"purge negative age":   func() error { _, err := s.Purge(ctx, leasing.PurgeRequest{OlderThan: -1, BatchSize: 1}); return err },
				"purge huge batch": func() error {
					_, err := s.Purge(ctx, leasing.PurgeRequest{OlderThan: 1, BatchSize: 1 << 40})
					return err
				},
				"list zero limit": func() error { _, err := s.List(ctx, leasing.ListRequest{}); return err },
				"list huge limit": func() error { _, err := s.List(ctx, leasing.ListRequest{Limit: leasing.MaxBatchSize + 1}); return err },
				"list unknown status": func() error {
					_, err := s.List(ctx, leasing.ListRequest{Filter: leasing.ListFilter{Status: "lost"}, Limit: 1})
					return err
				},
				"list the other queue's column": func() error {
					_, err := s.List(ctx, leasing.ListRequest{Filter: leasing.ListFilter{Topic: "t", IdempotencyKey: "k"}, Limit: 1})
					return err
				},
				"list negative age": func() error {
					_, err := s.List(ctx, leasing.ListRequest{Filter: leasing.ListFilter{OlderThan: -time.Second}, Limit: 1})
					return err
				},
				"list cursor of another status": func() error {
					_, err := s.List(ctx, leasing.ListRequest{Filter: leasing.ListFilter{Status: leasing.StatusPending},
						After: leasing.Cursor{Status: leasing.StatusFailed, ID: uuid.New()}, Limit: 1})
					return err
				},
				"count NUL type": func() error { _, err := s.CountMatching(ctx, leasing.ListFilter{Type: "\x00"}); return err },
				"groups zero":    func() error { _, err := s.DeadLetterGroups(ctx, 0); return err },
				"purge by no id": func() error { _, err := s.PurgeByID(ctx); return err },
				"key lines zero": func() error { _, err := s.KeyLines(ctx, 0); return err },
				"bulk no action": func() error { _, err := s.Bulk(ctx, leasing.BulkRequest{BatchSize: 1}); return err },
				"bulk zero batch": func() error {
					_, err := s.Bulk(ctx, leasing.BulkRequest{Action: leasing.BulkPurge})
					return err
				},
				"bulk requeue of pending": func() error {
					_, err := s.Bulk(ctx, leasing.BulkRequest{Action: leasing.BulkRequeue, Filter: leasing.ListFilter{Status: leasing.StatusPending}, BatchSize: 1})
					return err
				},
				"bulk purge in flight": func() error {
					_, err := s.Bulk(ctx, leasing.BulkRequest{Action: leasing.BulkPurge, Filter: leasing.ListFilter{Status: leasing.StatusProcessing}, BatchSize: 1})
					return err
				},
				"bulk dead-letter without reason": func() error {
					_, err := s.Bulk(ctx, leasing.BulkRequest{Action: leasing.BulkDeadLetter, BatchSize: 1})
					return err
				},
				"bulk purge with force": func() error {
					_, err := s.Bulk(ctx, leasing.BulkRequest{Action: leasing.BulkPurge, Force: true, BatchSize: 1})
					return err
				},
				"claim owner with NUL": func() error {
					_, err := s.Claim(ctx, leasing.ClaimRequest{Owner: "\x00", BatchSize: 1, LeaseFor: time.Second})
					return err
				},
				"claim sub-µs lease": func() error {
					_, err := s.Claim(ctx, leasing.ClaimRequest{Owner: "w", BatchSize: 1, LeaseFor: time.Nanosecond})
					return err
				},
			}
			before := tableDigest(t, f.admin)
			for name, call := range calls {
				err := call()
				require.True(t, isArgErr(err), "%s %s: want an *ArgumentError, got %v", q, name, err)
			}
			require.Equal(t, before, tableDigest(t, f.admin), q)
		}
	})

	// Ids that do not exist: reported per message, never an error, and
	// nothing changes.
	t.Run("UnknownIDs", func(t *testing.T) {
		t.Parallel()
		f := newBadInputFixture(t, "leasestore-badinput-unknown")
		ctx := context.Background()
		for _, q := range queuesBoth {
			s := f.stores[q]
			ghost := f.held[q]
			ghost.Message.ID = uuid.New()
			before := tableDigest(t, f.admin)
			renew, err := s.Renew(ctx, time.Minute, ghost)
			require.NoError(t, err)
			require.Equal(t, []uuid.UUID{ghost.Message.ID}, renew.Lost)
			require.ErrorIs(t, renew.Err(), leasing.ErrLeaseLost)
			for name, write := range map[string]func() (leasing.WriteResult, error){
				"release":     func() (leasing.WriteResult, error) { return s.Release(ctx, ghost) },
				"complete":    func() (leasing.WriteResult, error) { return s.Complete(ctx, ghost) },
				"fail":        func() (leasing.WriteResult, error) { return s.Fail(ctx, leasing.Failure{Lease: ghost}) },
				"dead-letter": func() (leasing.WriteResult, error) { return s.DeadLetter(ctx, leasing.Failure{Lease: ghost}) },
			} {
				res, err := write()
				require.NoError(t, err, name)
				require.Equal(t, leasing.OutcomeNotFound, res.Outcomes[0].Outcome, name)
				require.ErrorIs(t, res.Err(), leasing.ErrNotFound, name)
			}
			rq, err := s.Requeue(ctx, ghost.Message.ID)
			require.NoError(t, err)
			require.Equal(t, 1, rq.Requested)
			require.Empty(t, rq.Requeued)
			_, err = s.Get(ctx, ghost.Message.ID)
			require.ErrorIs(t, err, leasing.ErrNotFound)
			require.Equal(t, before, tableDigest(t, f.admin))
		}
	})

	// Constructors reject a nil pool and unknown queues.
	t.Run("Constructors", func(t *testing.T) {
		t.Parallel()
		_, err := leasing.NewPostgres(nil, leasing.Inbox, leasing.PostgresOptions{})
		require.True(t, isArgErr(err), "%v", err)
		f := newBadInputFixture(t, "leasestore-badinput-ctor")
		for _, q := range []leasing.Queue{"", "INBOX", "dead_letter", "inbox\x00"} {
			_, err = leasing.NewPostgres(f.stores[leasing.Inbox].Pool(), q, leasing.PostgresOptions{})
			require.True(t, isArgErr(err), "%q: %v", q, err)
			_, err = leasing.NewMemory(q, leasing.MemoryOptions{})
			require.True(t, isArgErr(err), "%q: %v", q, err)
		}
	})
}

// TestMemoryHonoursContext: Memory is the Store twin that unit tests and
// database-less callers run processors on, so a cancelled context must stop
// it as it stops Postgres: the context's error, and nothing changed.
func TestMemoryHonoursContext(t *testing.T) {
	t.Parallel()
	m, err := leasing.NewMemory(leasing.Inbox, leasing.MemoryOptions{})
	require.NoError(t, err)
	ctx := context.Background()
	_, err = m.Enqueue(ctx, leasing.NewMessage{})
	require.NoError(t, err)
	cancelled, cancel := context.WithCancel(ctx)
	cancel()

	_, err = m.Claim(cancelled, leasing.ClaimRequest{Owner: "w", BatchSize: 1, LeaseFor: time.Minute})
	claimErr := err
	st, err := m.Stats(ctx)
	require.NoError(t, err)
	require.ErrorIs(t, claimErr, context.Canceled, "Memory.Claim with a cancelled context")
	require.Equal(t, int64(1), st.Depth[leasing.StatusPending], "Memory.Claim with a cancelled context claimed a row")
}
