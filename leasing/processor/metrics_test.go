package processor_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/leasestore/leasestore/leasing"
	"github.com/leasestore/leasestore/leasing/processor"
)

func TestRegisterQueueGauges(t *testing.T) {
	t.Parallel()

	t.Run("ObservesStats", func(t *testing.T) {
		t.Parallel()
		b := setupProcessor(t, leasing.Inbox)
		out := setupProcessor(t, leasing.Outbox)
		b.enqueue(t, 3)
		b.clock.Advance(10 * time.Second)
		b.enqueue(t, 1)
		_, err := b.mem.Claim(context.Background(), leasing.ClaimRequest{Owner: "w", BatchSize: 1, LeaseFor: time.Second})
		require.NoError(t, err)
		b.clock.Advance(2 * time.Second) // the claimed lease expires
		reg, err := processor.RegisterQueueGauges(b.meter.Meter("test"), b.mem, out.mem)
		require.NoError(t, err)

		var rm metricdata.ResourceMetrics
		require.NoError(t, b.reader.Collect(context.Background(), &rm))
		got := map[string]metricdata.Aggregation{}
		for _, sm := range rm.ScopeMetrics {
			for _, m := range sm.Metrics {
				got[m.Name] = m.Data
			}
		}
		depth := map[string]int64{}
		for _, dp := range got["litebus.inbox.queue.depth"].(metricdata.Gauge[int64]).DataPoints {
			status, ok := dp.Attributes.Value(attribute.Key("status"))
			require.True(t, ok)
			depth[status.AsString()] = dp.Value
		}
		require.Equal(t, map[string]int64{"pending": 3, "processing": 1, "completed": 0, "failed": 0, "dead_lettered": 0}, depth)
		require.Len(t, got["litebus.outbox.queue.depth"].(metricdata.Gauge[int64]).DataPoints, 5)
		expired := got["litebus.inbox.queue.expired_leases"].(metricdata.Gauge[int64]).DataPoints
		require.Equal(t, int64(1), expired[0].Value)
		age := got["litebus.inbox.queue.oldest_due_age"].(metricdata.Gauge[float64]).DataPoints
		require.InDelta(t, 12.0, age[0].Value, 1e-9, "seconds since the oldest due row was created")

		require.NoError(t, reg.Unregister())
	})

	t.Run("Invalid", func(t *testing.T) {
		t.Parallel()
		mem, err := leasing.NewMemory(leasing.Inbox, leasing.MemoryOptions{})
		require.NoError(t, err)
		other, err := leasing.NewMemory(leasing.Inbox, leasing.MemoryOptions{})
		require.NoError(t, err)
		meter := noop.NewMeterProvider().Meter("test")
		for name, call := range map[string]func() error{
			"NilMeter":   func() error { _, err := processor.RegisterQueueGauges(nil, mem); return err },
			"NoStores":   func() error { _, err := processor.RegisterQueueGauges(meter); return err },
			"NilStore":   func() error { _, err := processor.RegisterQueueGauges(meter, nil); return err },
			"QueueTwice": func() error { _, err := processor.RegisterQueueGauges(meter, mem, other); return err },
		} {
			require.ErrorIs(t, call(), leasing.ErrInvalidArgument, name)
		}
	})
}

func TestMetricNames(t *testing.T) {
	t.Parallel()
	require.Equal(t, "litebus.inbox.processor.lease_lost", processor.MetricName(leasing.Inbox, "processor.lease_lost"))
	require.Equal(t, "processor.succeeded", processor.SucceededCounter(leasing.Inbox))
	require.Equal(t, "processor.published", processor.SucceededCounter(leasing.Outbox))
}
