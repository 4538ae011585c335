package leasingtest

import (
	"testing"

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
		require.Equal(t, []leasing.Duplicate{{Index: 0, ID: first.IDs[0]}, {Index: 1, ID: first.IDs[1]}, {Index: 3, ID: first.IDs[0]}},
			again.Duplicates, "each duplicate names its input and the stored message")
		st, err := b.store.Stats(b.ctx)
		require.NoError(t, err)
		require.Equal(t, int64(3), st.Depth[leasing.StatusPending])
	}},
	{"Enqueue/DuplicatesNameTheStoredMessage", func(t *testing.T, b *bundle) {
		if b.q != leasing.Inbox {
			t.Skip("the outbox refuses duplicates")
		}
		stored := b.enqueue(leasing.NewMessage{IdempotencyKey: "a", TenantID: "t"}, leasing.NewMessage{IdempotencyKey: "b"})
		res, err := b.store.Enqueue(b.ctx,
			leasing.NewMessage{IdempotencyKey: "c"},                               // new
			leasing.NewMessage{IdempotencyKey: "b", TenantID: "t"},                // new: another tenant's key
			leasing.NewMessage{IdempotencyKey: "a", TenantID: "t"},                // stored[0], by key
			leasing.NewMessage{IdempotencyKey: "c"},                               // index 0 of this call, by key
			leasing.NewMessage{ID: stored[1], IdempotencyKey: "a", TenantID: "t"}) // stored[1]: the id decides first
		require.NoError(t, err)
		require.Equal(t, []leasing.Duplicate{{Index: 2, ID: stored[0]}, {Index: 3, ID: res.IDs[0]}, {Index: 4, ID: stored[1]}}, res.Duplicates)
		for _, d := range res.Duplicates {
			row, err := b.store.Get(b.ctx, d.ID)
			require.NoError(t, err, "Get finds the reported id")
			require.Equal(t, d.ID, row.ID)
		}
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
