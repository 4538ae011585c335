package processor

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/leasestore/leasestore/leasing"
)

// TestBreakerPlan: which claims an open breaker leaves the loop: open
// topics are left out of the claim (or removed from its Topics) but for
// one probe message each per interval; an open topic a claim cannot name
// (the empty one) blocks every claim but one probe of any topic.
func TestBreakerPlan(t *testing.T) {
	t.Parallel()
	policy, err := BreakerPolicy{Threshold: 1, ProbeInterval: time.Second, MaxProbeInterval: 4 * time.Second}.resolve()
	require.NoError(t, err)
	ev, err := newEvents(Options{}, leasing.Outbox, leasing.ClaimRequest{}, false)
	require.NoError(t, err)
	b := newBreaker(policy, RetryPolicy{}.withDefaults(), leasing.Outbox, ev)
	base := leasing.ClaimRequest{Owner: "o", BatchSize: 10, LeaseFor: time.Second}
	now := time.Now()

	claim, probes := b.plan(now).requests(base)
	require.Equal(t, &base, claim, "all closed: the processor's claim as it is")
	require.Empty(t, probes)

	require.Equal(t, time.Second, b.unavailable(leasing.Message{Topic: "orders"}, now), "opened: the probe interval")
	plan := b.plan(now)
	require.Equal(t, now.Add(time.Second), plan.nextProbe)
	claim, probes = plan.requests(base)
	require.Equal(t, []string{"orders"}, claim.ExceptTopics)
	require.Empty(t, probes, "no probe before the interval")

	later := now.Add(time.Second)
	claim, probes = b.plan(later).requests(base)
	require.Equal(t, []string{"orders"}, claim.ExceptTopics)
	require.Equal(t, []leasing.ClaimRequest{{Owner: "o", BatchSize: 1, LeaseFor: time.Second, Topics: []string{"orders"}}}, probes)
	_, probes = b.plan(later).requests(base)
	require.Empty(t, probes, "one probe per interval")
	require.Equal(t, 2*time.Second, b.unavailable(leasing.Message{Topic: "orders"}, later), "the probe failed: the interval doubles")

	scoped := base
	scoped.Topics = []string{"audit", "orders"}
	claim, _ = b.plan(later).requests(scoped)
	require.Equal(t, []string{"audit"}, claim.Topics, "a scoped claim drops the open topic")
	require.Empty(t, claim.ExceptTopics)
	scoped.Topics = []string{"orders"}
	claim, _ = b.plan(later).requests(scoped)
	require.Nil(t, claim, "every topic of the claim is open")

	b.unavailable(leasing.Message{}, later) // the empty topic: no claim can leave it out
	plan = b.plan(later.Add(time.Second))
	require.True(t, plan.blocked)
	claim, probes = plan.requests(base)
	require.Nil(t, claim)
	require.Equal(t, []leasing.ClaimRequest{{Owner: "o", BatchSize: 1, LeaseFor: time.Second}}, probes, "one probe of any topic")

	b.succeeded(leasing.Message{})
	b.succeeded(leasing.Message{Topic: "orders"})
	claim, probes = b.plan(later).requests(base)
	require.Equal(t, &base, claim, "closed again")
	require.Empty(t, probes)
}
