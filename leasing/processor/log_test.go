package processor_test

import (
	"context"
	"errors"
	"log/slog"
	"math"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/leasestore/leasestore/internal/logtest"
	"github.com/leasestore/leasestore/leasing"
	"github.com/leasestore/leasestore/leasing/processor"
)

// requireEvent waits for one record with message msg and returns it,
// checking its level and the attributes every processor record carries.
func requireEvent(t *testing.T, rec *logtest.Recorder, p *processor.Processor, q leasing.Queue, msg string, level slog.Level) logtest.Record {
	t.Helper()
	waitFor(t, func() bool { return len(rec.Find(msg)) > 0 }, msg)
	r := rec.Find(msg)[0]
	require.Equal(t, level, r.Level, msg)
	require.Equal(t, string(q), r.Str(processor.LogKeyQueue), msg)
	require.Equal(t, p.Owner(), r.Str(processor.LogKeyOwner), msg)
	return r
}

// requireLease checks the lease attributes of r.
func requireLease(t *testing.T, r logtest.Record, id uuid.UUID, attempt, generation int) {
	t.Helper()
	require.Equal(t, id.String(), r.Str(processor.LogKeyMessageID), r.Message)
	require.Equal(t, int64(attempt), r.Attrs[processor.LogKeyAttempt].Int64(), r.Message)
	require.Equal(t, int64(generation), r.Attrs[processor.LogKeyGeneration].Int64(), r.Message)
}

// vacuumStore is a Memory that is a Vacuumer whose VACUUM always runs, on
// the queue's table and on its ordering keys' table.
type vacuumStore struct {
	leasing.Store
	calls atomic.Int32
}

func (v *vacuumStore) VacuumIfDead(context.Context, int64) (leasing.Vacuum, error) {
	v.calls.Add(1)
	return leasing.Vacuum{
		DeadRows: 7000, Ran: true, Duration: time.Millisecond,
		Keys: leasing.KeysVacuum{DeadRows: 6000, Ran: true, Duration: 2 * time.Millisecond},
	}, nil
}

// TestLogging: the processor's structured events, their levels and
// attributes; a message that succeeds logs nothing at info or above.
func TestLogging(t *testing.T) {
	t.Parallel()

	t.Run("SuccessLogsNothingAtInfo", func(t *testing.T) {
		t.Parallel()
		b := setupProcessor(t, leasing.Inbox)
		ids := b.enqueue(t, 20)
		rec := logtest.New(slog.LevelDebug)
		r := b.start(t, nil, func(context.Context, leasing.Lease) error { return nil }, processor.Options{Logger: rec.Logger()})
		for _, id := range ids {
			waitFor(t, statusIs(b.mem, id, leasing.StatusCompleted), "completed")
		}
		require.NoError(t, r.stop(t))
		require.Empty(t, rec.AtLeast(slog.LevelInfo))
		require.Empty(t, rec.Records(), "not even at debug")
	})

	t.Run("NilLoggerLogsNothing", func(t *testing.T) {
		t.Parallel()
		b := setupProcessor(t, leasing.Inbox)
		id := b.enqueue(t, 1)[0]
		b.start(t, nil, func(context.Context, leasing.Lease) error { panic("boom") },
			processor.Options{RetryPolicy: processor.RetryPolicy{MaxAttempts: 1}})
		waitFor(t, statusIs(b.mem, id, leasing.StatusDeadLettered), "dead-lettered without a logger")
	})

	t.Run("PanicAndDeadLetter", func(t *testing.T) {
		t.Parallel()
		b := setupProcessor(t, leasing.Outbox)
		id := b.enqueue(t, 1)[0]
		rec := logtest.New(slog.LevelDebug)
		r := b.start(t, nil, func(context.Context, leasing.Lease) error { panic("boom") },
			processor.Options{Logger: rec.Logger(), RetryPolicy: processor.RetryPolicy{MaxAttempts: 1}})
		panicked := requireEvent(t, rec, r.p, leasing.Outbox, "handler panicked", slog.LevelError)
		requireLease(t, panicked, id, 1, 1)
		require.Equal(t, "boom", panicked.Str(processor.LogKeyError))
		require.Contains(t, panicked.Str("stack"), "runtime/debug.Stack")
		dead := requireEvent(t, rec, r.p, leasing.Outbox, "message dead-lettered", slog.LevelError)
		requireLease(t, dead, id, 1, 1)
		require.Contains(t, dead.Str(processor.LogKeyError), "handler panicked: boom")
	})

	t.Run("TimeoutAndRetry", func(t *testing.T) {
		t.Parallel()
		b := setupProcessor(t, leasing.Inbox)
		id := b.enqueue(t, 1)[0]
		rec := logtest.New(slog.LevelDebug)
		r := b.start(t, nil, func(ctx context.Context, _ leasing.Lease) error {
			<-ctx.Done()
			return ctx.Err()
		}, processor.Options{Logger: rec.Logger(), HandlerTimeout: 10 * time.Millisecond})
		timedOut := requireEvent(t, rec, r.p, leasing.Inbox, "handler timed out", slog.LevelWarn)
		requireLease(t, timedOut, id, 1, 1)
		require.Equal(t, 10*time.Millisecond, timedOut.Attrs["timeout"].Duration())
		retry := requireEvent(t, rec, r.p, leasing.Inbox, "attempt failed; retry scheduled", slog.LevelWarn)
		requireLease(t, retry, id, 1, 1)
		require.Equal(t, time.Second, retry.Attrs["retry_after"].Duration())
		require.Contains(t, retry.Str(processor.LogKeyError), processor.ErrHandlerTimeout.Error())
	})

	t.Run("LostLease", func(t *testing.T) {
		t.Parallel()
		b := setupProcessor(t, leasing.Inbox)
		id := b.enqueue(t, 1)[0]
		store := &storeHooks{Store: b.mem}
		store.renew = func(_ context.Context, _ time.Duration, leases ...leasing.Lease) (leasing.RenewResult, error) {
			res := leasing.RenewResult{Renewed: []leasing.Lease{}}
			for _, l := range leases {
				res.Lost = append(res.Lost, l.Message.ID)
			}
			return res, nil
		}
		rec := logtest.New(slog.LevelInfo)
		r := b.start(t, store, func(ctx context.Context, _ leasing.Lease) error {
			<-ctx.Done()
			return ctx.Err()
		}, processor.Options{Logger: rec.Logger()})
		lost := requireEvent(t, rec, r.p, leasing.Inbox, "lease lost", slog.LevelWarn)
		requireLease(t, lost, id, 1, 1)
	})

	t.Run("ClaimAndWriteFailures", func(t *testing.T) {
		t.Parallel()
		b := setupProcessor(t, leasing.Inbox)
		id := b.enqueue(t, 1)[0]
		store := &storeHooks{Store: b.mem}
		var claims, completes atomic.Int32
		store.claim = func(ctx context.Context, req leasing.ClaimRequest) ([]leasing.Lease, error) {
			if claims.Add(1) == 1 {
				return nil, errors.New("claim broke")
			}
			return b.mem.Claim(ctx, req)
		}
		store.complete = func(ctx context.Context, leases ...leasing.Lease) (leasing.WriteResult, error) {
			if completes.Add(1) == 1 {
				return leasing.WriteResult{}, errors.New("write broke")
			}
			return b.mem.Complete(ctx, leases...)
		}
		rec := logtest.New(slog.LevelInfo)
		r := b.start(t, store, func(context.Context, leasing.Lease) error { return nil }, processor.Options{Logger: rec.Logger()})
		claim := requireEvent(t, rec, r.p, leasing.Inbox, "claim failed", slog.LevelWarn)
		require.Equal(t, "claim broke", claim.Str(processor.LogKeyError))
		write := requireEvent(t, rec, r.p, leasing.Inbox, "outcome write failed; retrying", slog.LevelWarn)
		require.Equal(t, "write broke", write.Str(processor.LogKeyError))
		require.Equal(t, int64(1), write.Attrs["try"].Int64())
		waitFor(t, statusIs(b.mem, id, leasing.StatusCompleted), "completed on the second try")
	})

	t.Run("ParkedRow", func(t *testing.T) {
		t.Parallel()
		b := setupProcessor(t, leasing.Inbox)
		now := b.clock.Now()
		bad := leasing.Row{
			Message: leasing.Message{ID: uuid.New(), Headers: []byte(`{}`), CreatedAt: now, VisibleAfter: now},
			Status:  leasing.StatusPending, AttemptCount: math.MaxInt32,
		}
		require.NoError(t, b.mem.Load(bad))
		rec := logtest.New(slog.LevelInfo)
		r := b.start(t, nil, func(context.Context, leasing.Lease) error { return nil }, processor.Options{Logger: rec.Logger()})
		parked := requireEvent(t, rec, r.p, leasing.Inbox, "message parked by the claim", slog.LevelWarn)
		require.Equal(t, bad.ID.String(), parked.Str(processor.LogKeyMessageID))
		require.True(t, strings.HasPrefix(parked.Str(processor.LogKeyError), "parked by the claim: attempt_count"), parked.Str(processor.LogKeyError))
	})

	t.Run("VacuumRuns", func(t *testing.T) {
		t.Parallel()
		b := setupProcessor(t, leasing.Inbox)
		b.enqueue(t, 1) // the vacuum policy checks only after the processor wrote
		store := &vacuumStore{Store: b.mem}
		rec := logtest.New(slog.LevelDebug)
		r := b.start(t, store, func(context.Context, leasing.Lease) error { return nil },
			processor.Options{Logger: rec.Logger(), Vacuum: processor.VacuumPolicy{CheckInterval: time.Millisecond}})
		requireEvent(t, rec, r.p, leasing.Inbox, "vacuum ran", slog.LevelDebug)
		require.NoError(t, r.stop(t))
		// One record per table, the queue's first.
		ran := rec.Find("vacuum ran")
		require.GreaterOrEqual(t, len(ran), 2)
		require.Equal(t, "inbox_messages", ran[0].Str("table"))
		require.Equal(t, int64(7000), ran[0].Attrs["dead_rows"].Int64())
		require.Equal(t, time.Millisecond, ran[0].Attrs["duration"].Duration())
		require.Equal(t, "inbox_ordering_keys", ran[1].Str("table"))
		require.Equal(t, int64(6000), ran[1].Attrs["dead_rows"].Int64())
		require.Equal(t, 2*time.Millisecond, ran[1].Attrs["duration"].Duration())
		require.Empty(t, rec.AtLeast(slog.LevelInfo), "a vacuum run is not news at info")
	})
}
