package leasing_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/leasestore/leasestore/leasing"
	"github.com/leasestore/leasestore/leasing/leasingtest"
	"github.com/stretchr/testify/require"
)

func TestMemoryContract(t *testing.T) {
	leasingtest.Run(t, func(t *testing.T) leasingtest.Env {
		clock := leasingtest.NewClock(leasingtest.Start)
		stores := map[leasing.Queue]*leasing.Memory{}
		for _, q := range []leasing.Queue{leasing.Inbox, leasing.Outbox} {
			s, err := leasing.NewMemory(q, leasing.MemoryOptions{Now: clock.Now})
			require.NoError(t, err)
			stores[q] = s
		}
		return leasingtest.Env{
			Clock: clock,
			Open:  func(_ testing.TB, q leasing.Queue) leasing.Store { return stores[q] },
		}
	})
}

// A legacy row is in flight without a lease expiry (imported from a system
// that did not set one): it is reclaimable once its last attempt is older
// than the claim's lease duration.
func TestMemoryLegacyRowWithoutExpiry(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	clock := leasingtest.NewClock(leasingtest.Start)
	store, err := leasing.NewMemory(leasing.Inbox, leasing.MemoryOptions{Now: clock.Now})
	require.NoError(t, err)
	attempted := clock.Now()
	withAttempt := leasing.Row{
		Message: leasing.Message{ID: uuid.New(), CreatedAt: attempted.Add(-time.Hour), VisibleAfter: attempted.Add(-time.Hour)},
		Status:  leasing.StatusProcessing, LeaseOwner: "old", LeaseGeneration: 3, AttemptCount: 1,
		LastAttemptedAt: &attempted,
	}
	noAttempt := leasing.Row{
		Message: leasing.Message{ID: uuid.New(), CreatedAt: attempted, VisibleAfter: attempted},
		Status:  leasing.StatusProcessing, LeaseOwner: "old", LeaseGeneration: 1,
	}
	require.NoError(t, store.Load(withAttempt, noAttempt))

	req := leasing.ClaimRequest{Owner: "new", BatchSize: 10, LeaseFor: time.Minute}
	got, err := store.Claim(ctx, req)
	require.NoError(t, err)
	require.Empty(t, got, "younger than one lease duration: still owned")

	renew, err := store.Renew(ctx, time.Minute, leasing.Lease{Queue: leasing.Inbox, Owner: "old", Generation: 3, Message: withAttempt.Message})
	require.NoError(t, err)
	require.Len(t, renew.Lost, 1, "a lease without expiry cannot be renewed")

	clock.Advance(time.Minute)
	got, err = store.Claim(ctx, req)
	require.NoError(t, err)
	require.Len(t, got, 2)
	require.Equal(t, withAttempt.ID, got[0].Message.ID, "FIFO by created_at")
	require.Equal(t, int64(4), got[0].Generation)
	require.Equal(t, 2, got[0].Attempt)
	require.Equal(t, int64(2), got[1].Generation)
}

func TestMemoryLoadRejectsUnknownStatus(t *testing.T) {
	t.Parallel()
	store, err := leasing.NewMemory(leasing.Outbox, leasing.MemoryOptions{})
	require.NoError(t, err)
	err = store.Load(leasing.Row{Message: leasing.Message{ID: uuid.New()}, Status: leasing.StatusProcessing})
	require.ErrorIs(t, err, leasing.ErrInvalidArgument, "processing is an inbox status")
}

// TestEnqueueArgumentErrorNamesTheField: each text field of NewMessage
// that is not UTF-8, or holds NUL, is named by the *ArgumentError.
func TestEnqueueArgumentErrorNamesTheField(t *testing.T) {
	t.Parallel()
	for field, msg := range map[string]leasing.NewMessage{
		"type":            {Type: "\xff"},
		"tenant id":       {TenantID: "t\x00"},
		"idempotency key": {IdempotencyKey: "\xc3"},
		"ordering key":    {OrderingKey: "k\xff"},
	} {
		store, err := leasing.NewMemory(leasing.Inbox, leasing.MemoryOptions{})
		require.NoError(t, err)
		_, err = store.Enqueue(context.Background(), leasing.NewMessage{}, msg)
		var ae *leasing.ArgumentError
		require.ErrorAs(t, err, &ae, field)
		require.Equal(t, field, ae.Field)
		require.Contains(t, ae.Reason, "(message 1)", field)
	}
	store, err := leasing.NewMemory(leasing.Outbox, leasing.MemoryOptions{})
	require.NoError(t, err)
	_, err = store.Enqueue(context.Background(), leasing.NewMessage{Topic: "orders\x00"})
	var ae *leasing.ArgumentError
	require.ErrorAs(t, err, &ae)
	require.Equal(t, "topic", ae.Field)
}
