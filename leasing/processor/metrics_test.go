package processor_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric/noop"

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

		got, err := b.meter.Observe(context.Background())
		require.NoError(t, err)
		depth := map[string]float64{}
		for _, p := range got["litebus.inbox.queue.depth"] {
			status, ok := p.Attributes.Value(attribute.Key("status"))
			require.True(t, ok)
			depth[status.AsString()] = p.Value
		}
		require.Equal(t, map[string]float64{"pending": 3, "processing": 1, "completed": 0, "failed": 0, "dead_lettered": 0}, depth)
		require.Len(t, got["litebus.outbox.queue.depth"], 5)
		expired := got["litebus.inbox.queue.expired_leases"]
		require.Len(t, expired, 1)
		require.Equal(t, 1.0, expired[0].Value)
		age := got["litebus.inbox.queue.oldest_due_age"]
		require.Len(t, age, 1)
		require.InDelta(t, 12.0, age[0].Value, 1e-9, "seconds since the oldest due row was created")

		require.NoError(t, reg.Unregister())
		got, err = b.meter.Observe(context.Background())
		require.NoError(t, err)
		require.Empty(t, got, "an unregistered callback observes nothing")
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
