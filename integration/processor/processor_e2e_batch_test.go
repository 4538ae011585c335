package processor_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/leasestore/leasestore/leasing"
	"github.com/leasestore/leasestore/leasing/leasingtest"
	"github.com/leasestore/leasestore/leasing/processor"
)

// e2eBrokerLimit is the most messages the fake batch broker accepts in one
// call, as Kafka's or SNS's batch calls have a limit.
const e2eBrokerLimit = 100

// e2eBatchBehaviour is what the fake batch broker answers for one message
// of a call: nil accepts it.
type e2eBatchBehaviour func(ctx context.Context, msg leasing.Message) error

// e2eBatchBroker is a fake broker with a batch call: it records each call's
// size and every message in the case's e2eBroker, and refuses a call of
// more than e2eBrokerLimit messages as a whole.
type e2eBatchBroker struct {
	log      *e2eBroker
	calls    atomic.Int64
	oversize atomic.Int64 // calls over the limit
}

// publish is one broker call by processor label (owner) with msgs.
func (k *e2eBatchBroker) publish(ctx context.Context, label, owner string, msgs []leasing.Message, behave e2eBatchBehaviour) []error {
	k.calls.Add(1)
	errs := make([]error, len(msgs))
	if len(msgs) > e2eBrokerLimit {
		k.oversize.Add(1)
		for i := range errs {
			errs[i] = fmt.Errorf("broker: %d messages in one call, at most %d", len(msgs), e2eBrokerLimit)
		}
		return errs
	}
	for i, m := range msgs {
		k.log.record(e2eDelivery{Proc: label, Owner: owner, MessageID: m.ID, TenantID: m.TenantID, Topic: m.Topic})
		errs[i] = behave(ctx, m)
	}
	return errs
}

// newBatchProc builds a batch processor labelled label whose handler (inbox)
// or publisher (outbox) makes one call to broker per batch; the defaults
// are those of newProc.
func (b *e2eBundle) newBatchProc(t *testing.T, label string, broker *e2eBatchBroker, behave e2eBatchBehaviour, opts processor.Options) *e2eProc {
	t.Helper()
	if opts.Owner == "" {
		opts.Owner = label
	}
	if opts.LeaseDuration == 0 {
		opts.LeaseDuration = 30 * time.Second
	}
	if opts.PollInterval == 0 {
		opts.PollInterval = 10 * time.Millisecond
	}
	if opts.HeartbeatInterval == 0 {
		opts.HeartbeatInterval = 10 * time.Millisecond
	}
	if opts.ShutdownGrace == 0 {
		opts.ShutdownGrace = 2 * time.Second
	}
	reader := sdkmetric.NewManualReader()
	provider := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	opts.Meter = provider.Meter("e2e")
	pr := &e2eProc{
		label: label, queue: b.queue, store: &e2eStore{Store: b.openStore(t)},
		reader: reader, provider: provider, errc: make(chan error, 1),
	}
	var handler processor.BatchHandler
	if b.queue == leasing.Outbox {
		publish := processor.BatchPublisher(func(ctx context.Context, msgs []leasing.Message) []error {
			return broker.publish(ctx, label, pr.p.Owner(), msgs, behave)
		})
		handler = publish.Handler()
	} else {
		handler = func(ctx context.Context, leases []leasing.Lease) []error {
			msgs := make([]leasing.Message, len(leases))
			for i, l := range leases {
				msgs[i] = l.Message
			}
			return broker.publish(ctx, label, pr.p.Owner(), msgs, behave)
		}
	}
	p, err := processor.NewBatch(pr.store, handler, opts)
	require.NoError(t, err)
	pr.p = p
	t.Cleanup(func() {
		require.NoError(t, pr.stop(t))
		require.NoError(t, provider.Shutdown(context.Background()))
	})
	return pr
}

// TestBatchProcessorEndToEnd relays through a fake broker that takes at
// most 100 messages a call, with batch processors (processor.NewBatch) on
// real PostgreSQL, on both queues, and checks the guarantees of the
// single-message form (TestProcessorEndToEnd): every message delivered at
// least once and finished, none lost, failures retried after their
// backoff, dead letters at the attempt limit, and no outcome written for a
// lease lost while its batch ran. The clock is pinned as there.
func TestBatchProcessorEndToEnd(t *testing.T) {
	t.Parallel()
	for _, q := range e2eQueues {
		t.Run(string(q), func(t *testing.T) {
			t.Parallel()
			testE2EBatchRelay(t, q)
			testE2EBatchLeaseLoss(t, q)
			testE2EBatchLifecycle(t, q)
		})
	}
}

// testE2EBatchRelay: two batch processors relay 450 messages, some failing
// once, some always, until every one is finished.
func testE2EBatchRelay(t *testing.T, q leasing.Queue) {
	t.Run("RelayRetriesAndDeadLetters", func(t *testing.T) {
		t.Parallel()
		b := e2eSetup(t, q)
		const n = 450
		ids := b.enqueueN(t, n)
		transient, poison := map[uuid.UUID]bool{}, map[uuid.UUID]bool{}
		for i, id := range ids {
			switch {
			case i%50 == 7:
				poison[id] = true
			case i%10 == 3:
				transient[id] = true
			}
		}
		var mu sync.Mutex
		seen := map[uuid.UUID]int{}
		behave := func(_ context.Context, m leasing.Message) error {
			mu.Lock()
			seen[m.ID]++
			call := seen[m.ID]
			mu.Unlock()
			switch {
			case poison[m.ID]:
				return fmt.Errorf("broker: rejected, attempt %d", call)
			case transient[m.ID] && call == 1:
				return errors.New("broker: unavailable")
			}
			return nil
		}
		broker := &e2eBatchBroker{log: b.broker}
		opts := processor.Options{
			BatchSize: e2eBrokerLimit, Concurrency: 2,
			RetryPolicy: processor.RetryPolicy{MaxAttempts: 3, InitialDelay: time.Second, Multiplier: 2},
		}
		procs := []*e2eProc{b.newBatchProc(t, "a", broker, behave, opts), b.newBatchProc(t, "b", broker, behave, opts)}
		for _, pr := range procs {
			pr.run()
		}

		// Attempt 1 for all; the transient and poison ones fail and are
		// due again after 1s of the pinned clock, then 2s.
		for _, id := range ids {
			want := q.Succeeded()
			if transient[id] || poison[id] {
				want = leasing.StatusFailed
			}
			b.waitStatus(t, id, want)
		}
		for id := range transient {
			r := b.row(t, id)
			require.Equal(t, "broker: unavailable", r.LastError)
			require.Equal(t, b.clock.Now().Add(time.Second), r.VisibleAfter, "retried after the backoff")
		}
		b.clock.Advance(time.Second)
		for id := range transient {
			b.waitStatus(t, id, q.Succeeded())
		}
		for id := range poison {
			b.waitFor(t, func() bool { r := b.peek(id); return r.Status == leasing.StatusFailed && r.AttemptCount == 2 }, "poison retried")
		}
		b.clock.Advance(2 * time.Second)
		for id := range poison {
			b.waitStatus(t, id, leasing.StatusDeadLettered)
		}
		for _, pr := range procs {
			require.NoError(t, pr.stop(t))
		}

		require.Zero(t, broker.oversize.Load(), "no call over the broker's limit")
		for _, id := range ids {
			r := b.row(t, id)
			want, attempts := q.Succeeded(), 1
			switch {
			case poison[id]:
				want, attempts = leasing.StatusDeadLettered, 3
				require.Equal(t, "broker: rejected, attempt 3", r.LastError)
			case transient[id]:
				attempts = 2
			}
			require.Equal(t, want, r.Status, "message %s", id)
			require.Equal(t, attempts, r.AttemptCount, "message %s", id)
			require.Nil(t, r.LeaseExpiresAt)
			require.Len(t, b.broker.of(id), attempts, "message %s: delivered once per attempt", id)
		}
		// The clock is pinned, so no lease expired: claims were disjoint.
		claimed := map[uuid.UUID]int{}
		var acquired, succeeded, failed, dead int64
		for _, pr := range procs {
			for _, batch := range pr.store.claimed() {
				require.LessOrEqual(t, len(batch), e2eBrokerLimit)
				for _, id := range batch {
					claimed[id]++
				}
			}
			c := pr.counters(t)
			acquired += c[e2eCounterName(q, "leases_acquired")]
			succeeded += c[e2eCounterName(q, "succeeded")]
			failed += c[e2eCounterName(q, "failed")]
			dead += c[e2eCounterName(q, "dead_lettered")]
			for _, name := range []string{"lease_lost", "persist_skipped", "persist_rejected", "parked"} {
				require.Zero(t, c[e2eCounterName(q, name)], "processor %s: %s", pr.label, name)
			}
		}
		for _, id := range ids {
			require.Equal(t, len(b.broker.of(id)), claimed[id], "message %s: one delivery per claim", id)
		}
		np, nt := int64(len(poison)), int64(len(transient))
		require.Equal(t, n+nt+2*np, acquired)
		require.Equal(t, n-np, succeeded)
		require.Equal(t, nt+2*np, failed)
		require.Equal(t, np, dead)
		t.Logf("%s: %d broker calls for %d deliveries", q, broker.calls.Load(), len(b.broker.all()))
		require.Less(t, broker.calls.Load(), int64(len(b.broker.all())), "deliveries share calls")
	})
}

// testE2EBatchLeaseLoss: a lease lost while its batch runs is not written,
// whether the batch's other leases are still held or all are lost.
func testE2EBatchLeaseLoss(t *testing.T, q leasing.Queue) {
	ctx := context.Background()

	t.Run("OneLeaseFencedOthersWritten", func(t *testing.T) {
		t.Parallel()
		b := e2eSetup(t, q)
		ids := b.enqueueN(t, 3)
		started, release := make(chan struct{}), make(chan struct{})
		var once sync.Once
		ctxErr := make(chan error, 1)
		broker := &e2eBatchBroker{log: b.broker}
		a := b.newBatchProc(t, "a", broker, func(ctx context.Context, _ leasing.Message) error {
			once.Do(func() {
				close(started)
				<-release
				ctxErr <- ctx.Err()
			})
			return nil // claims success for every message, the fenced one too
		}, processor.Options{BatchSize: e2eBrokerLimit})
		a.run()
		<-started
		// An operator dead-letters one message under a's live lease: a's
		// lease on it is fenced, and its next renew finds it lost.
		_, err := b.store.DeadLetterByID(ctx, leasing.DeadLetterByIDRequest{ID: ids[1], Reason: "operator", Force: true})
		require.NoError(t, err)
		b.waitFor(t, func() bool { return a.counter("lease_lost") == 1 }, "a finds its lease lost")
		close(release)
		require.NoError(t, <-ctxErr, "one lease lost does not cancel the batch")
		b.waitStatus(t, ids[0], q.Succeeded())
		b.waitStatus(t, ids[2], q.Succeeded())
		require.NoError(t, a.stop(t))
		r := b.row(t, ids[1])
		require.Equal(t, leasing.StatusDeadLettered, r.Status, "a's success for the fenced lease is not written")
		require.Equal(t, "operator", r.LastError)
		a.requireCounters(t, map[string]int64{"leases_acquired": 3, "succeeded": 2, "lease_lost": 1, "persist_skipped": 1})
	})

	t.Run("AllLeasesReclaimedCancelsBatchNothingWritten", func(t *testing.T) {
		t.Parallel()
		b := e2eSetup(t, q)
		ids := b.enqueueN(t, 3)
		started, release := make(chan struct{}), make(chan struct{})
		cause := make(chan error, 1)
		var once sync.Once
		broker := &e2eBatchBroker{log: b.broker}
		// One slot: a cannot claim the messages back itself.
		a := b.newBatchProc(t, "a", broker, func(ctx context.Context, _ leasing.Message) error {
			once.Do(func() {
				close(started)
				<-ctx.Done()
				cause <- context.Cause(ctx)
				<-release
			})
			return nil
		}, processor.Options{BatchSize: e2eBrokerLimit, Concurrency: 1})
		a.run()
		<-started
		b.clock.Advance(31 * time.Second) // past a's leases, before its heartbeat renews them
		// A renew of a's in flight locks the rows, and the claim skips
		// locked rows: claim until all three are taken.
		var other []leasing.Lease
		b.waitFor(t, func() bool {
			leases, _ := b.store.Claim(ctx, leasing.ClaimRequest{Owner: "other", BatchSize: 10, LeaseFor: 30 * time.Second})
			other = append(other, leases...)
			return len(other) >= 3
		}, "other reclaims the three messages")
		require.Len(t, other, 3)
		select {
		case err := <-cause:
			require.ErrorIs(t, err, leasing.ErrLeaseLost)
		case <-time.After(e2eWait):
			t.Fatal("batch context not cancelled after every lease was lost")
		}
		close(release)
		b.waitFor(t, func() bool { return a.counter("persist_skipped") == 3 }, "a skips every outcome")
		require.NoError(t, a.stop(t))
		for _, id := range ids {
			r := b.row(t, id)
			require.Equal(t, q.InFlight(), r.Status, "a's late success is not written")
			require.Equal(t, "other", r.LeaseOwner)
			require.Equal(t, int64(2), leasingtest.Generations(r))
		}
		wr, err := b.store.Complete(ctx, other...)
		require.NoError(t, err)
		require.NoError(t, wr.Err(), "the new owner finishes them")
		a.requireCounters(t, map[string]int64{"leases_acquired": 3, "lease_lost": 3, "persist_skipped": 3})
	})
}
