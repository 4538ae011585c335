package processor_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/leasestore/leasestore/leasing"
	"github.com/leasestore/leasestore/leasing/processor"
)

// testE2EMetrics runs the metrics case: the processor counters and the
// queue gauges through successes, failures, a dead letter and a lost lease.
func testE2EMetrics(t *testing.T, q leasing.Queue) {
	t.Run("MetricsCountersAndQueueGauges", func(t *testing.T) {
		t.Parallel()
		b := e2eSetup(t, q)
		types := []string{"ok", "ok", "flaky", "poison", "stuck"}
		msgs := make([]leasing.NewMessage, len(types))
		for i, typ := range types {
			msgs[i].Type = typ
		}
		ids := b.enqueue(t, msgs...)
		okIDs, flaky, poison, stuck := ids[:2], ids[2], ids[3], ids[4]

		var mu sync.Mutex
		calls := map[uuid.UUID]int{}
		stuckStarted := make(chan struct{})
		p := b.newProc(t, "a", func(ctx context.Context, m leasing.Message) error {
			mu.Lock()
			calls[m.ID]++
			n := calls[m.ID]
			mu.Unlock()
			switch {
			case m.Type == "flaky" && n == 1, m.Type == "poison":
				return fmt.Errorf("%s, call %d", m.Type, n)
			case m.Type == "stuck" && n == 1:
				close(stuckStarted)
				<-ctx.Done() // until its lease is lost
				return context.Cause(ctx)
			}
			return nil
		}, processor.Options{Concurrency: 8, RetryPolicy: processor.RetryPolicy{MaxAttempts: 2, InitialDelay: time.Second}})
		reg, err := processor.RegisterQueueGauges(p.provider.Meter("e2e-gauges"), b.store)
		require.NoError(t, err)
		defer func() { require.NoError(t, reg.Unregister()) }()

		// Nothing is counted before the first claim.
		p.requireCounters(t, map[string]int64{})
		p.run()

		// 1: two succeed, flaky and poison fail, stuck runs.
		<-stuckStarted
		for _, id := range okIDs {
			b.waitStatus(t, id, q.Succeeded())
		}
		b.waitStatus(t, flaky, leasing.StatusFailed)
		b.waitStatus(t, poison, leasing.StatusFailed)
		// A row's outcome commits before the processor counts it.
		p.waitCounters(t, map[string]int64{"leases_acquired": 5, "succeeded": 2, "failed": 2})
		depth, expired := e2eGauges(t, p.collect(t), q)
		require.Equal(t, e2eDepth(q, map[leasing.Status]int64{q.Succeeded(): 2, leasing.StatusFailed: 2, q.InFlight(): 1}), depth)
		require.Zero(t, expired)

		// 2: after the backoff flaky succeeds and poison, on its last
		// attempt, is dead-lettered.
		b.clock.Advance(time.Second)
		b.waitStatus(t, flaky, q.Succeeded())
		b.waitStatus(t, poison, leasing.StatusDeadLettered)
		p.waitCounters(t, map[string]int64{"leases_acquired": 7, "succeeded": 3, "failed": 2, "dead_lettered": 1})
		depth, _ = e2eGauges(t, p.collect(t), q)
		require.Equal(t, e2eDepth(q, map[leasing.Status]int64{q.Succeeded(): 3, leasing.StatusDeadLettered: 1, q.InFlight(): 1}), depth)

		// 3: the store clock jumps past stuck's lease: it is lost (its
		// handler cancelled, its outcome skipped), then reclaimed and
		// handled again.
		b.clock.Advance(31 * time.Second)
		b.waitStatus(t, stuck, q.Succeeded())
		b.waitFor(t, func() bool { return p.counter("persist_skipped") == 1 }, "stuck's first outcome skipped")
		require.NoError(t, p.stop(t))
		p.requireCounters(t, map[string]int64{
			"leases_acquired": 8, "succeeded": 4, "failed": 2, "dead_lettered": 1, "lease_lost": 1, "persist_skipped": 1,
		})
		depth, expired = e2eGauges(t, p.collect(t), q)
		require.Equal(t, e2eDepth(q, map[leasing.Status]int64{q.Succeeded(): 4, leasing.StatusDeadLettered: 1}), depth)
		require.Zero(t, expired)
		require.Equal(t, 2, b.row(t, stuck).AttemptCount)
	})
}

// testE2EHistograms: the processor histograms through the SDK's manual
// reader. The store's clock is pinned, so the queue lag is exact: due to
// claim on the database's statement clock.
func testE2EHistograms(t *testing.T, q leasing.Queue) {
	t.Run("MetricsHistograms", func(t *testing.T) {
		t.Parallel()
		b := e2eSetup(t, q)
		// A lease taken by a worker that crashed expires 30s after the
		// start; two rows are due from the start. The processor claims all
		// three 35s after the start: lags 5s, 35s and 35s.
		crashed := b.enqueue(t, leasing.NewMessage{Type: "ok"})[0]
		require.Len(t, b.rawClaim(t, "crashed", 1), 1)
		ids := b.enqueue(t, leasing.NewMessage{Type: "ok"}, leasing.NewMessage{Type: "fail"})
		b.clock.Advance(35 * time.Second)

		const sleep = 20 * time.Millisecond
		p := b.start(t, "a", func(_ context.Context, m leasing.Message) error {
			time.Sleep(sleep)
			if m.Type == "fail" {
				return fmt.Errorf("no")
			}
			return nil
		}, processor.Options{})
		b.waitStatus(t, crashed, q.Succeeded())
		b.waitStatus(t, ids[0], q.Succeeded())
		b.waitStatus(t, ids[1], leasing.StatusFailed)
		require.NoError(t, p.stop(t))

		hists := map[string]metricdata.Histogram[float64]{}
		for _, sm := range p.collect(t).ScopeMetrics {
			for _, m := range sm.Metrics {
				if h, ok := m.Data.(metricdata.Histogram[float64]); ok {
					require.Equal(t, "s", m.Unit, m.Name)
					hists[m.Name] = h
				}
			}
		}
		name := func(n string) string { return processor.MetricName(q, "processor."+n) }
		require.Len(t, hists, 4, "handler_duration, queue_lag, claim_duration, write_duration")

		handler := hists[name("handler_duration")]
		outcomes := map[string]uint64{}
		for _, dp := range handler.DataPoints {
			v, ok := dp.Attributes.Value("result")
			require.True(t, ok)
			outcomes[v.AsString()] += dp.Count
			mn, ok := dp.Min.Value()
			require.True(t, ok)
			require.GreaterOrEqual(t, mn, sleep.Seconds(), "a handler call lasts at least its sleep")
			require.Equal(t, []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300}, dp.Bounds)
		}
		require.Equal(t, map[string]uint64{"success": 2, "error": 1}, outcomes)

		lag := hists[name("queue_lag")]
		require.Len(t, lag.DataPoints, 1)
		dp := lag.DataPoints[0]
		require.Equal(t, uint64(3), dp.Count)
		require.InDelta(t, 75.0, dp.Sum, 1e-9, "5s + 35s + 35s")
		mn, _ := dp.Min.Value()
		mx, _ := dp.Max.Value()
		require.InDelta(t, 5.0, mn, 1e-9, "the reclaim is due from its lease's expiry")
		require.InDelta(t, 35.0, mx, 1e-9)

		claims := hists[name("claim_duration")]
		require.Len(t, claims.DataPoints, 1)
		require.GreaterOrEqual(t, claims.DataPoints[0].Count, uint64(1))
		mn, _ = claims.DataPoints[0].Min.Value()
		require.Greater(t, mn, 0.0, "a round trip to PostgreSQL takes time")

		ops := map[string]uint64{}
		for _, dp := range hists[name("write_duration")].DataPoints {
			v, ok := dp.Attributes.Value("operation")
			require.True(t, ok)
			ops[v.AsString()] += dp.Count
			mn, _ := dp.Min.Value()
			require.Greater(t, mn, 0.0)
		}
		require.GreaterOrEqual(t, ops["complete"], uint64(1), "the two successes, in one or two calls")
		require.Equal(t, uint64(1), ops["fail"])
	})
}

// e2eGauges returns the queue gauges of queue q that RegisterQueueGauges
// feeds: depth by status, expired leases.
func e2eGauges(t *testing.T, rm metricdata.ResourceMetrics, q leasing.Queue) (map[leasing.Status]int64, int64) {
	t.Helper()
	depth := map[leasing.Status]int64{}
	expired := int64(-1)
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch m.Name {
			case "litebus." + string(q) + ".queue.depth":
				for _, dp := range m.Data.(metricdata.Gauge[int64]).DataPoints {
					status, ok := dp.Attributes.Value("status")
					require.True(t, ok, "depth point without status")
					depth[leasing.Status(status.AsString())] = dp.Value
				}
			case "litebus." + string(q) + ".queue.expired_leases":
				points := m.Data.(metricdata.Gauge[int64]).DataPoints
				require.Len(t, points, 1)
				expired = points[0].Value
			}
		}
	}
	return depth, expired
}

// e2eDepth returns the expected depth map: every status of q, 0 unless set.
func e2eDepth(q leasing.Queue, set map[leasing.Status]int64) map[leasing.Status]int64 {
	out := map[leasing.Status]int64{}
	for _, s := range q.Statuses() {
		out[s] = set[s]
	}
	return out
}
