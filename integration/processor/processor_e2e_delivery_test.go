package processor_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/leasestore/leasestore/leasing"
	"github.com/leasestore/leasestore/leasing/leasingtest"
	"github.com/leasestore/leasestore/leasing/processor"
)

// testE2ESuccess runs the happy path: one processor delivers every message
// once, in FIFO order.
func testE2ESuccess(t *testing.T, q leasing.Queue) {
	t.Run("Success", func(t *testing.T) {
		t.Parallel()
		b := e2eSetup(t, q)
		ids := b.enqueueN(t, 5)
		// One slot: deliveries follow claim order, which is FIFO.
		p := b.start(t, "a", e2eOK, processor.Options{Concurrency: 1})
		for _, id := range ids {
			b.waitStatus(t, id, q.Succeeded())
		}
		require.NoError(t, p.stop(t)) // Run returns once every outcome is written and counted

		var delivered []uuid.UUID
		for _, d := range b.broker.all() {
			delivered = append(delivered, d.MessageID)
			require.Equal(t, p.p.Owner(), d.Owner)
			if q == leasing.Outbox {
				require.Equal(t, e2eTopic, d.Topic, "published to the message's topic")
			}
		}
		require.Equal(t, ids, delivered, "each message delivered once, in FIFO order")
		for _, id := range ids {
			r := b.row(t, id)
			require.Equal(t, 1, r.AttemptCount)
			require.Equal(t, int64(1), leasingtest.Generations(r))
			require.Equal(t, p.p.Owner(), r.LeaseOwner)
			require.Nil(t, r.LeaseExpiresAt)
			require.NotNil(t, r.FinishedAt)
			require.Equal(t, b.clock.Now(), *r.FinishedAt, "finished at the store's (pinned) now")
			require.Empty(t, r.LastError)
		}
		p.requireCounters(t, map[string]int64{"leases_acquired": 5, "succeeded": 5})
	})
}

// testE2EDisjointClaims runs two processors on one queue: each message is
// claimed and delivered by exactly one of them.
func testE2EDisjointClaims(t *testing.T, q leasing.Queue) {
	ctx := context.Background()

	t.Run("TwoProcessorsClaimDisjointSubsets", func(t *testing.T) {
		t.Parallel()
		b := e2eSetup(t, q)
		ids := b.enqueueN(t, 100)
		slow := func(ctx context.Context, _ leasing.Message) error {
			time.Sleep(time.Millisecond)
			return nil
		}
		// Four slots each (with 64, the default, one processor may claim
		// all 100 before the other's first claim commits).
		procs := []*e2eProc{
			b.newProc(t, "a", slow, processor.Options{BatchSize: 10, Concurrency: 4}),
			b.newProc(t, "b", slow, processor.Options{BatchSize: 10, Concurrency: 4}),
		}
		// Warm both pools so that neither starts late on a new connection,
		// then start both at the same moment.
		for _, pr := range procs {
			_, err := pr.store.Stats(ctx)
			require.NoError(t, err)
		}
		var parked sync.WaitGroup
		gate := make(chan struct{})
		for _, pr := range procs {
			pr.runAfter(gate, &parked)
		}
		parked.Wait()
		close(gate)
		for _, id := range ids {
			b.waitStatus(t, id, q.Succeeded())
		}
		for _, pr := range procs {
			require.NoError(t, pr.stop(t))
		}

		// The clock is pinned, so no lease can expire: any message claimed
		// twice would be a double claim.
		claimedBy := map[uuid.UUID]string{}
		for _, pr := range procs {
			batches := pr.store.claimed()
			require.NotEmpty(t, batches, "processor %s claimed nothing", pr.label)
			require.Len(t, batches[0], 10, "processor %s: the first claim takes a full batch", pr.label)
			n := 0
			for _, batch := range batches {
				require.LessOrEqual(t, len(batch), 10)
				for _, id := range batch {
					other, twice := claimedBy[id]
					require.False(t, twice, "message %s claimed by %s and %s", id, other, pr.label)
					claimedBy[id] = pr.label
					n++
				}
			}
			t.Logf("%s: processor %s claimed %d messages in %d batches", q, pr.label, n, len(batches))
			pr.requireCounters(t, map[string]int64{"leases_acquired": int64(n), "succeeded": int64(n)})
		}
		require.Len(t, claimedBy, len(ids), "every message claimed exactly once")

		deliveries := b.broker.all()
		require.Len(t, deliveries, len(ids), "every message delivered exactly once")
		for _, d := range deliveries {
			require.Equal(t, claimedBy[d.MessageID], d.Proc, "delivered by the processor that claimed it")
		}
		for i, pr := range procs {
			for _, id := range ids {
				if claimedBy[id] == pr.label {
					r := b.row(t, id)
					require.Equal(t, procs[i].p.Owner(), r.LeaseOwner)
					require.Equal(t, 1, r.AttemptCount)
					require.Equal(t, int64(1), leasingtest.Generations(r))
				}
			}
		}
	})
}

// testE2ETenantScoping runs one processor per tenant: each takes its own
// tenant's messages only.
func testE2ETenantScoping(t *testing.T, q leasing.Queue) {
	t.Run("TenantScoping", func(t *testing.T) {
		t.Parallel()
		b := e2eSetup(t, q)
		var msgs []leasing.NewMessage
		for _, tenant := range []string{"a", "b", "", "a", "b", "", "a", "b"} {
			msgs = append(msgs, leasing.NewMessage{TenantID: tenant})
		}
		ids := b.enqueue(t, msgs...)
		byTenant := map[string][]uuid.UUID{}
		for i, m := range msgs {
			byTenant[m.TenantID] = append(byTenant[m.TenantID], ids[i])
		}

		// Each tenant's processor takes that tenant's messages only; the
		// untenanted ones are left to a processor without a tenant, which
		// runs last.
		order := []string{"a", "b", ""}
		for i, tenant := range order {
			p := b.start(t, "tenant-"+tenant, e2eOK, processor.Options{TenantID: tenant})
			for _, id := range byTenant[tenant] {
				b.waitStatus(t, id, q.Succeeded())
			}
			b.waitFor(t, p.claimsMark()(3), "three more claims")
			require.NoError(t, p.stop(t))
			p.requireCounters(t, map[string]int64{
				"leases_acquired": int64(len(byTenant[tenant])), "succeeded": int64(len(byTenant[tenant])),
			})
			for _, d := range b.broker.all() {
				if d.Proc == p.label {
					require.Equal(t, tenant, d.TenantID, "processor %s handled another tenant's message", p.label)
				}
			}
			for _, later := range order[i+1:] {
				for _, id := range byTenant[later] {
					r := b.row(t, id)
					require.Equal(t, leasing.StatusPending, r.Status)
					require.Zero(t, leasingtest.Generations(r), "tenant %q's message claimed by processor %s", later, p.label)
				}
			}
		}
		require.Len(t, b.broker.all(), len(ids), "each message delivered once")
	})
}
