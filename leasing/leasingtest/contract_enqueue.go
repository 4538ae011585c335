package leasingtest

import (
	"testing"

	"github.com/google/uuid"
	"github.com/leasestore/leasestore/leasing"
	"github.com/stretchr/testify/require"
)

// enqueueCases are the Enqueue cases.
var enqueueCases = []contractCase{
	{"Enqueue/InboxIdempotencyKey", func(t *testing.T, b *bundle) {
		if b.q != leasing.Inbox {
			t.Skip("idempotency keys are an inbox feature")
		}
		first, err := b.store.Enqueue(b.ctx, leasing.NewMessage{IdempotencyKey: "k1"}, leasing.NewMessage{IdempotencyKey: "k1", TenantID: "t"})
		require.NoError(t, err)
		require.Empty(t, first.Duplicates)
		again, err := b.store.Enqueue(b.ctx,
			leasing.NewMessage{IdempotencyKey: "k1"},
			leasing.NewMessage{IdempotencyKey: "k1", TenantID: "t"},
			leasing.NewMessage{IdempotencyKey: "k2"},
			leasing.NewMessage{ID: first.IDs[0]})
		require.NoError(t, err)
		require.Equal(t, []uuid.UUID{again.IDs[0], again.IDs[1], first.IDs[0]}, again.Duplicates)
		st, err := b.store.Stats(b.ctx)
		require.NoError(t, err)
		require.Equal(t, int64(3), st.Depth[leasing.StatusPending])
	}},
	{"Enqueue/OutboxDuplicateIDFails", func(t *testing.T, b *bundle) {
		if b.q != leasing.Outbox {
			t.Skip("the inbox reports duplicates instead")
		}
		ids := b.enqueue(leasing.NewMessage{Topic: "orders"})
		_, err := b.store.Enqueue(b.ctx, leasing.NewMessage{Topic: "orders"}, leasing.NewMessage{ID: ids[0]})
		require.ErrorIs(t, err, leasing.ErrDuplicate)
		st, err := b.store.Stats(b.ctx)
		require.NoError(t, err)
		require.Equal(t, int64(1), st.Depth[leasing.StatusPending], "a failed batch inserts nothing")
	}},
	{"Enqueue/KeepsMessageContent", func(t *testing.T, b *bundle) {
		msg := leasing.NewMessage{Type: "order.created", Payload: []byte{0, 1, 2, 255}, Headers: []byte(`{"trace":"abc"}`), TenantID: "t1"}
		if b.q == leasing.Outbox {
			msg.Topic = "orders"
		} else {
			msg.IdempotencyKey = "key-1"
		}
		id := b.enqueue(msg)[0]
		l := b.claim("a", 1)[0]
		require.Equal(t, id, l.Message.ID)
		require.Equal(t, msg.Type, l.Message.Type)
		require.Equal(t, msg.Payload, l.Message.Payload)
		require.JSONEq(t, string(msg.Headers), string(l.Message.Headers))
		require.Equal(t, msg.TenantID, l.Message.TenantID)
		require.Equal(t, msg.Topic, l.Message.Topic)
		require.Equal(t, msg.IdempotencyKey, l.Message.IdempotencyKey)
		require.True(t, Start.Equal(l.Message.CreatedAt))
	}},
}
