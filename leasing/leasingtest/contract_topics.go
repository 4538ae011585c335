package leasingtest

import (
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/leasestore/leasestore/leasing"
	"github.com/stretchr/testify/require"
)

// topicCases are the cases of claims scoped by topic (ClaimRequest.Topics
// and ExceptTopics): the outbox's topic, the inbox's message type.
var topicCases = []contractCase{
	{"Claim/TopicsFIFOWithinScope", func(t *testing.T, b *bundle) {
		ids := b.enqueueTopics("a", "b", "c", "a", "", "b", "c", "a")
		require.Equal(t, []uuid.UUID{ids[0], ids[3], ids[7]}, idsOf(b.claimScoped(leasing.ClaimRequest{Topics: []string{"a"}}, 10)))
		// Two topics: merged in FIFO order, batch size across both.
		require.Equal(t, []uuid.UUID{ids[1], ids[2], ids[5]}, idsOf(b.claimScoped(leasing.ClaimRequest{Topics: []string{"c", "b"}}, 3)))
		require.Equal(t, []uuid.UUID{ids[6]}, idsOf(b.claimScoped(leasing.ClaimRequest{Topics: []string{"c", "b"}}, 3)))
		require.Empty(t, b.claimScoped(leasing.ClaimRequest{Topics: []string{"a", "missing"}}, 10))
		// The empty topic is claimed only without Topics.
		require.Equal(t, []uuid.UUID{ids[4]}, idsOf(b.claim("w", 10)))
	}},
	{"Claim/ExceptTopics", func(t *testing.T, b *bundle) {
		ids := b.enqueueTopics("a", "b", "", "c", "a", "b")
		require.Equal(t, []uuid.UUID{ids[1], ids[2], ids[3]}, idsOf(b.claimScoped(leasing.ClaimRequest{ExceptTopics: []string{"a"}}, 3)))
		require.Equal(t, []uuid.UUID{ids[5]}, idsOf(b.claimScoped(leasing.ClaimRequest{ExceptTopics: []string{"a"}}, 10)))
		require.Equal(t, []uuid.UUID{ids[0], ids[4]}, idsOf(b.claimScoped(leasing.ClaimRequest{ExceptTopics: []string{"b", "c"}}, 10)))
	}},
	{"Claim/TopicsSkipDeferredRows", func(t *testing.T, b *bundle) {
		deferred := b.enqueue(b.topicMessage("a", lease/2))[0]
		due := b.enqueueTopics("a", "b")
		require.Equal(t, due[:1], idsOf(b.claimScoped(leasing.ClaimRequest{Topics: []string{"a"}}, 10)))
		b.env.Clock.Advance(lease / 2)
		require.Equal(t, []uuid.UUID{deferred}, idsOf(b.claimScoped(leasing.ClaimRequest{ExceptTopics: []string{"b"}}, 10)))
	}},
	{"Claim/TopicsReclaimOnlyInScope", func(t *testing.T, b *bundle) {
		ids := b.enqueueTopics("a", "b")
		require.Len(t, b.claim("w", 2), 2)
		b.env.Clock.Advance(lease)
		require.Equal(t, ids[1:], idsOf(b.claimScoped(leasing.ClaimRequest{Topics: []string{"b"}}, 10)))
		require.Empty(t, b.claimScoped(leasing.ClaimRequest{ExceptTopics: []string{"a"}}, 10))
		got := b.claimScoped(leasing.ClaimRequest{ExceptTopics: []string{"b"}}, 10)
		require.Equal(t, ids[:1], idsOf(got))
		require.Equal(t, 2, got[0].Attempt)
	}},
	{"Claim/TopicsWithTenant", func(t *testing.T, b *bundle) {
		m := func(tenant, topic string) leasing.NewMessage {
			msg := b.topicMessage(topic, 0)
			msg.TenantID = tenant
			return msg
		}
		ids := b.enqueue(m("t1", "a"), m("t2", "a"), m("t1", "b"), m("t1", "a"))
		got := b.claimScoped(leasing.ClaimRequest{TenantID: "t1", Topics: []string{"a"}}, 10)
		require.ElementsMatch(t, []uuid.UUID{ids[0], ids[3]}, idsOf(got))
		got = b.claimScoped(leasing.ClaimRequest{TenantID: "t1", ExceptTopics: []string{"a"}}, 10)
		require.Equal(t, []uuid.UUID{ids[2]}, idsOf(got))
	}},
}

// topicMessage returns a message of topic (its message type on the inbox)
// due after delay.
func (b *bundle) topicMessage(topic string, delay time.Duration) leasing.NewMessage {
	m := leasing.NewMessage{Payload: []byte("p"), Delay: delay}
	if b.q == leasing.Inbox {
		m.Type = topic
	} else {
		m.Topic = topic
	}
	return m
}

// enqueueTopics enqueues one message per topic, one clock tick apart, and
// returns their ids in FIFO order.
func (b *bundle) enqueueTopics(topics ...string) []uuid.UUID {
	b.t.Helper()
	ids := make([]uuid.UUID, 0, len(topics))
	for _, topic := range topics {
		ids = append(ids, b.enqueue(b.topicMessage(topic, 0))...)
		b.env.Clock.Advance(time.Millisecond)
	}
	return ids
}

// claimScoped claims up to n rows for owner "w" with r's topics and tenant.
func (b *bundle) claimScoped(r leasing.ClaimRequest, n int) []leasing.Lease {
	b.t.Helper()
	r.Owner, r.BatchSize, r.LeaseFor = "w", n, lease
	leases, err := b.store.Claim(b.ctx, r)
	require.NoError(b.t, err)
	require.NotNil(b.t, leases)
	return leases
}
