package processor_test

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/leasestore/leasestore/internal/logtest"
	"github.com/leasestore/leasestore/internal/metrictest"
	"github.com/leasestore/leasestore/leasing"
	"github.com/leasestore/leasestore/leasing/processor"
)

// TestProcessorVerdicts: what each handler verdict writes, for a Handler
// and for a BatchHandler. The store's clock stands still, so that a
// released message stays invisible until the test moves it.
func TestProcessorVerdicts(t *testing.T) {
	t.Parallel()
	policy := processor.RetryPolicy{MaxAttempts: 5, InitialDelay: 7 * time.Second, MaxDelay: time.Minute}
	cases := []struct {
		name    string
		err     error
		status  leasing.Status
		attempt int           // attempt_count after the write
		delay   time.Duration // visible_after - now
		counter string
	}{
		{"Permanent", processor.Permanent(errors.New("bad payload")), leasing.StatusDeadLettered, 1, 0, "processor.dead_lettered"},
		{"RetryAfter", processor.RetryAfter(30*time.Second, errors.New("slow down")), leasing.StatusPending, 0, 30 * time.Second, "processor.released"},
		{"RetryAfterCapped", processor.RetryAfter(time.Hour, errors.New("slow down")), leasing.StatusPending, 0, time.Minute, "processor.released"},
		{"Unavailable", processor.Unavailable(errors.New("connection refused")), leasing.StatusPending, 0, 7 * time.Second, "processor.released"},
		{"Plain", errors.New("boom"), leasing.StatusFailed, 1, 7 * time.Second, "processor.failed"},
	}
	for _, batch := range []bool{false, true} {
		for _, c := range cases {
			name := c.name
			if batch {
				name = "Batch/" + name
			}
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				b := setupProcessor(t, leasing.Outbox)
				id := b.enqueue(t, 1)[0]
				rec := logtest.New(slog.LevelInfo)
				opts := processor.Options{RetryPolicy: policy, Logger: rec.Logger()}
				var r *running
				if batch {
					r = b.startBatch(t, nil, func(_ context.Context, ls []leasing.Lease) []error { return []error{c.err} }, opts)
				} else {
					r = b.start(t, nil, func(context.Context, leasing.Lease) error { return c.err }, opts)
				}
				waitFor(t, func() bool { return b.counter(c.counter) == 1 }, c.counter)
				require.NoError(t, r.stop(t))
				row := b.row(t, id)
				require.Equal(t, c.status, row.Status)
				require.Equal(t, c.attempt, row.AttemptCount)
				require.Equal(t, c.err.Error(), row.LastError)
				if c.status != leasing.StatusDeadLettered {
					require.Equal(t, b.clock.Now().Add(c.delay), row.VisibleAfter)
				}
				verdict, _ := processor.VerdictOf(c.err)
				msg := map[leasing.Status]string{
					leasing.StatusDeadLettered: "message dead-lettered",
					leasing.StatusPending:      "attempt failed; released without spending it",
					leasing.StatusFailed:       "attempt failed; retry scheduled",
				}[c.status]
				logged := rec.Find(msg)
				require.Len(t, logged, 1, "one record per message and attempt")
				if c.status == leasing.StatusDeadLettered {
					require.Equal(t, slog.LevelError, logged[0].Level)
				} else {
					require.Equal(t, slog.LevelWarn, logged[0].Level)
				}
				if c.status != leasing.StatusFailed {
					require.Equal(t, verdict.String(), logged[0].Str(processor.LogKeyVerdict))
				}
			})
		}
	}
}

// TestProcessorBreaker: consecutive Unavailable verdicts open the breaker,
// which releases the leases it holds but has not started (attempts
// returned), then claims one message per probe until one succeeds, and
// closes. Nothing is dead-lettered and no attempt is spent.
func TestProcessorBreaker(t *testing.T) {
	t.Parallel()
	b := setupProcessor(t, leasing.Outbox)
	ids := b.enqueue(t, 6)
	var down atomic.Bool
	down.Store(true)
	var mu sync.Mutex
	var open []leasing.ClaimRequest // the claims while the breaker is open
	store := &storeHooks{Store: b.mem}
	store.claim = func(ctx context.Context, r leasing.ClaimRequest) ([]leasing.Lease, error) {
		if b.counter("processor.breaker_transitions") == 1 {
			mu.Lock()
			open = append(open, r)
			mu.Unlock()
		}
		return b.mem.Claim(ctx, r)
	}
	rec := logtest.New(slog.LevelWarn)
	var calls atomic.Int32
	r := b.start(t, store, func(context.Context, leasing.Lease) error {
		calls.Add(1)
		if down.Load() {
			return processor.Unavailable(errors.New("no responders"))
		}
		return nil
	}, processor.Options{
		BatchSize: 6, Concurrency: 1, Logger: rec.Logger(),
		RetryPolicy: processor.RetryPolicy{MaxAttempts: 2},
		Breaker:     processor.BreakerPolicy{Threshold: 2, ProbeInterval: 5 * time.Millisecond, MaxProbeInterval: 20 * time.Millisecond},
	})
	waitFor(t, func() bool { return b.counter("processor.breaker_transitions") == 1 }, "opened")
	// Two handler calls opened it; the four leases behind them were
	// released unstarted. The probes come one message each; on a store
	// clock that stands still each probe's release keeps its message
	// invisible, so the probes end once all six are released.
	waitFor(t, func() bool { return b.counter("processor.released") == 6 }, "every message released")
	require.Equal(t, int32(2+4), calls.Load(), "two calls opened it, then one per probe message")
	for i, id := range ids {
		row := b.row(t, id)
		require.Equal(t, leasing.StatusPending, row.Status)
		require.Zero(t, row.AttemptCount, "no attempt spent")
		if i >= 2 {
			require.Equal(t, leasing.AttemptReleased, row.Attempts[0].End)
			require.Empty(t, row.Attempts[0].Error, "released unstarted when the breaker opened")
		}
	}
	mu.Lock()
	probes := 0
	for _, r := range open {
		if slices.Equal(r.Topics, []string{"orders"}) {
			require.Equal(t, 1, r.BatchSize, "an open breaker probes with one message")
			probes++
		} else {
			require.Equal(t, []string{"orders"}, r.ExceptTopics, "other claims leave the open topic out")
		}
	}
	require.GreaterOrEqual(t, probes, 4)
	mu.Unlock()
	opened := rec.Find("breaker opened: claims of the topic stop, one message probes the destination")
	require.Len(t, opened, 1)
	require.Equal(t, slog.LevelWarn, opened[0].Level)
	require.Equal(t, []float64{1}, values(b.meter.Records(processor.MetricName(leasing.Outbox, "processor.breaker_state"))))
	h := r.p.Health()
	require.Equal(t, []string{"orders"}, h.OpenBreakers, "health names the open topic")
	require.True(t, h.Ready, "an open breaker leaves the processor ready")

	down.Store(false)
	b.clock.Advance(time.Hour)
	for _, id := range ids {
		waitAdvancing(t, b.clock, 50*time.Millisecond, statusIs(b.mem, id, leasing.StatusPublished), "published once the destination is back")
	}
	require.Zero(t, b.counter("processor.dead_lettered"))
	require.EqualValues(t, 2, b.counter("processor.breaker_transitions"), "opened, then closed")
	require.Len(t, rec.Find("breaker closed: the destination answered, claims resume"), 1)
	require.Equal(t, []float64{1, 0}, values(b.meter.Records(processor.MetricName(leasing.Outbox, "processor.breaker_state"))))
	require.Empty(t, r.p.Health().OpenBreakers, "closed")
}

// values returns the values of points, in order.
func values(points []metrictest.Point) []float64 {
	var v []float64
	for _, p := range points {
		v = append(v, p.Value)
	}
	return v
}

// TestProcessorBreakerPerTopic: a processor serving two topics opens the
// breaker of the one whose destination is down and keeps claiming and
// publishing the other meanwhile; the down topic's messages wait, none
// dead-lettered, and are published once it is back.
func TestProcessorBreakerPerTopic(t *testing.T) {
	t.Parallel()
	b := setupProcessor(t, leasing.Outbox)
	var msgs []leasing.NewMessage
	for range 10 {
		msgs = append(msgs, leasing.NewMessage{Topic: "orders"}, leasing.NewMessage{Topic: "audit"})
	}
	_, err := b.mem.Enqueue(context.Background(), msgs...)
	require.NoError(t, err)
	var down atomic.Bool
	down.Store(true)
	var audit, orders atomic.Int32
	b.start(t, nil, func(_ context.Context, l leasing.Lease) error {
		if l.Message.Topic == "audit" {
			audit.Add(1)
			return nil
		}
		if down.Load() {
			return processor.Unavailable(errors.New("orders broker down"))
		}
		orders.Add(1)
		return nil
	}, processor.Options{
		BatchSize: 4, Concurrency: 1,
		Breaker: processor.BreakerPolicy{Threshold: 2, ProbeInterval: 5 * time.Millisecond, MaxProbeInterval: 20 * time.Millisecond},
	})
	waitFor(t, func() bool { return audit.Load() == 10 }, "the other topic drains while orders is down")
	require.Zero(t, orders.Load())
	require.EqualValues(t, 1, b.counter("processor.breaker_transitions"), "orders' breaker opened, audit's never did")
	down.Store(false)
	b.clock.Advance(time.Hour)
	waitAdvancing(t, b.clock, 50*time.Millisecond, func() bool { return orders.Load() == 10 }, "orders published once its broker is back")
	require.Zero(t, b.counter("processor.dead_lettered"))
	require.EqualValues(t, 2, b.counter("processor.breaker_transitions"))
}
