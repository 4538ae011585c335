package reliability_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/leasestore/leasestore/leasing"
	"github.com/leasestore/leasestore/leasing/processor"
)

// outageBroker is a fake broker that records what it accepted, per
// ordering key, and refuses everything while down.
type outageBroker struct {
	down     atomic.Bool
	refused  atomic.Int64
	payments atomic.Int64 // published on the topic whose destination stays up
	mu       sync.Mutex
	accepted map[string][]int // ordering key -> sequence numbers, in publish order
}

func (b *outageBroker) publish(_ context.Context, m leasing.Message) error {
	if m.Topic == "payments" { // another destination, up throughout
		b.payments.Add(1)
		return nil
	}
	if b.down.Load() {
		b.refused.Add(1)
		return processor.Unavailable(errors.New("nats: no responders available for request"))
	}
	var seq int
	if _, err := fmt.Sscanf(string(m.Payload), "%d", &seq); err != nil {
		return processor.Permanent(err)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.accepted[m.OrderingKey] = append(b.accepted[m.OrderingKey], seq)
	return nil
}

// TestFaultBrokerOutage is the outage drill on PostgreSQL: an outbox relay
// whose broker is down for LEASESTORE_OUTAGE (default 10s) while its
// messages (keyed, three keys) keep coming, with short backoffs and three
// attempts at most. Its handler says Unavailable while the broker is
// down: nothing is dead-lettered, no attempt is spent (each message is
// published on its first counted attempt), the broker receives each key's
// messages in enqueue order, and a second processor (another tenant's
// relay, whose broker is up) drains its own messages meanwhile.
func TestFaultBrokerOutage(t *testing.T) {
	t.Parallel()
	outage := 10 * time.Second
	if v := os.Getenv("LEASESTORE_OUTAGE"); v != "" {
		var err error
		outage, err = time.ParseDuration(v)
		require.NoError(t, err)
	}
	url := freshURL(t)
	store := openStore(t, url, leasing.Outbox, leasing.PostgresOptions{}) // the database's clock
	ctx := context.Background()

	broker := &outageBroker{accepted: map[string][]int{}}
	broker.down.Store(true)
	var other atomic.Int64 // published by the other tenant's relay
	opts := func(tenant string) processor.Options {
		return processor.Options{
			TenantID: tenant, PollInterval: 50 * time.Millisecond, Concurrency: 4, BatchSize: 10,
			RetryPolicy: processor.RetryPolicy{MaxAttempts: 3, InitialDelay: 20 * time.Millisecond, MaxDelay: 200 * time.Millisecond},
			Breaker:     processor.BreakerPolicy{Threshold: 3, ProbeInterval: 20 * time.Millisecond, MaxProbeInterval: 500 * time.Millisecond},
		}
	}
	relay, err := processor.New(store, processor.Publisher(broker.publish).Handler(), opts("orders"))
	require.NoError(t, err)
	audit, err := processor.New(store, func(context.Context, leasing.Lease) error {
		other.Add(1)
		return nil
	}, opts("audit"))
	require.NoError(t, err)
	runCtx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for _, p := range []*processor.Processor{relay, audit} {
		wg.Go(func() { _ = p.Run(runCtx) })
	}
	defer func() {
		stop()
		wg.Wait()
	}()

	// Producers: keyed orders and unkeyed audit records, through the outage.
	const keys = 3
	seq := 0
	enqueue := func() {
		var msgs []leasing.NewMessage
		for k := range keys {
			msgs = append(msgs, leasing.NewMessage{
				TenantID: "orders", Topic: "orders", OrderingKey: fmt.Sprintf("order-%d", k), Payload: fmt.Appendf(nil, "%d", seq),
			})
		}
		msgs = append(msgs, leasing.NewMessage{TenantID: "audit", Topic: "audit", Payload: []byte("a")},
			leasing.NewMessage{TenantID: "orders", Topic: "payments", Payload: []byte("p")})
		_, err := store.Enqueue(ctx, msgs...)
		require.NoError(t, err)
		seq++
	}
	start := time.Now()
	for time.Since(start) < outage {
		enqueue()
		time.Sleep(100 * time.Millisecond)
	}
	require.Eventually(t, func() bool { return other.Load() == int64(seq) }, 10*time.Second, 10*time.Millisecond,
		"the other tenant's relay drains during the outage")
	require.Eventually(t, func() bool { return broker.payments.Load() == int64(seq) }, 10*time.Second, 10*time.Millisecond,
		"the relay's other topic drains during the outage")
	broker.mu.Lock()
	require.Empty(t, broker.accepted, "nothing of orders went out while its broker was down")
	broker.mu.Unlock()
	refused := broker.refused.Load()
	broker.down.Store(false)
	enqueue()

	require.Eventually(t, func() bool {
		st, err := store.Stats(ctx)
		require.NoError(t, err)
		return st.Depth[leasing.StatusPublished] == int64(5*seq)
	}, 30*time.Second, 20*time.Millisecond, "everything published once the broker is back")
	st, err := store.Stats(ctx)
	require.NoError(t, err)
	require.Zero(t, st.Depth[leasing.StatusDeadLettered], "nothing dead-lettered")

	broker.mu.Lock()
	defer broker.mu.Unlock()
	for k := range keys {
		got := broker.accepted[fmt.Sprintf("order-%d", k)]
		want := make([]int, seq)
		for i := range want {
			want[i] = i
		}
		require.Equal(t, want, got, "key %d: the broker receives the key's messages once each, in enqueue order", k)
	}
	rows, err := store.Pool().Query(ctx, "SELECT attempt_count, count(*) FROM outbox_messages WHERE tenant_id = 'orders' GROUP BY 1")
	require.NoError(t, err)
	defer rows.Close()
	for rows.Next() {
		var attempt, n int
		require.NoError(t, rows.Scan(&attempt, &n))
		require.Equal(t, 1, attempt, "%d messages spent %d attempts: only the publish counts", n, attempt)
	}
	require.NoError(t, rows.Err())
	t.Logf("outage %s: %d messages per key, %d refused publishes (probes and released attempts), published in order after %s",
		outage, seq, refused, time.Since(start).Round(time.Millisecond))
}
