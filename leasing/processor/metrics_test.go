package processor_test

import (
	"context"
	"errors"
	"slices"
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
		require.Equal(t, map[string]float64{"pending": 3, "processing": 1, "completed": 0, "failed": 0, "dead_lettered": 0, "waiting": 0}, depth)
		require.Len(t, got["litebus.outbox.queue.depth"], 6)
		expired := got["litebus.inbox.queue.expired_leases"]
		require.Len(t, expired, 1)
		require.Equal(t, 1.0, expired[0].Value)
		age := got["litebus.inbox.queue.oldest_due_age"]
		require.Len(t, age, 1)
		require.InDelta(t, 12.0, age[0].Value, 1e-9, "seconds since the oldest due row was created")
		require.Equal(t, 0.0, got["litebus.inbox.queue.waiting"][0].Value)
		require.Equal(t, 0.0, got["litebus.inbox.queue.oldest_head_age"][0].Value)
		require.Equal(t, 0.0, got["litebus.inbox.queue.paused"][0].Value)
		require.NoError(t, b.mem.Pause(context.Background(), leasing.PauseRequest{Topics: []string{"a", "b"}, By: "ops"}))
		require.NoError(t, b.mem.Pause(context.Background(), leasing.PauseRequest{WholeQueue: true, By: "ops"}))
		got, err = b.meter.Observe(context.Background())
		require.NoError(t, err)
		require.Equal(t, 3.0, got["litebus.inbox.queue.paused"][0].Value)
		require.Equal(t, 0.0, got["litebus.outbox.queue.paused"][0].Value)

		// Two keyed messages: the second waits behind the first, its head.
		_, err = out.mem.Enqueue(context.Background(), leasing.NewMessage{OrderingKey: "k"}, leasing.NewMessage{OrderingKey: "k"})
		require.NoError(t, err)
		out.clock.Advance(3 * time.Second)
		got, err = b.meter.Observe(context.Background())
		require.NoError(t, err)
		require.Equal(t, 1.0, got["litebus.outbox.queue.waiting"][0].Value)
		require.InDelta(t, 3.0, got["litebus.outbox.queue.oldest_head_age"][0].Value, 1e-9)

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

// TestHistograms: handler_duration, queue_lag, claim_duration and
// write_duration, in seconds, with their buckets. The store's clock is
// Memory's manual one, so the queue lag is exact.
func TestHistograms(t *testing.T) {
	t.Parallel()
	b := setupProcessor(t, leasing.Inbox)
	name := func(n string) string { return processor.MetricName(leasing.Inbox, n) }

	// A row whose lease, taken by a worker that then crashed, expires 1s
	// after the start; and two rows due from the start. The processor
	// claims all three 3s after the start: lags 2s, 3s and 3s.
	reclaimed := b.enqueue(t, 1)[0]
	crashed, err := b.mem.Claim(context.Background(), leasing.ClaimRequest{Owner: "crashed", BatchSize: 1, LeaseFor: time.Second})
	require.NoError(t, err)
	require.Len(t, crashed, 1)
	ids := b.enqueue(t, 2) // ids[0] succeeds, ids[1] fails
	b.clock.Advance(3 * time.Second)

	const sleep = 5 * time.Millisecond
	r := b.start(t, nil, func(_ context.Context, l leasing.Lease) error {
		time.Sleep(sleep)
		if l.Message.ID == ids[1] {
			return errors.New("no")
		}
		return nil
	}, processor.Options{})
	waitFor(t, statusIs(b.mem, reclaimed, leasing.StatusCompleted), "reclaimed and completed")
	waitFor(t, statusIs(b.mem, ids[0], leasing.StatusCompleted), "completed")
	waitFor(t, statusIs(b.mem, ids[1], leasing.StatusFailed), "failed")
	require.NoError(t, r.stop(t))

	for n, first := range map[string]float64{
		"processor.handler_duration": 0.001, "processor.queue_lag": 0.001,
		"processor.claim_duration": 0.0005, "processor.write_duration": 0.0005,
	} {
		unit, buckets, ok := b.meter.Histogram(name(n))
		require.True(t, ok, n)
		require.Equal(t, "s", unit, n)
		require.Equal(t, first, buckets[0], n)
		require.True(t, slices.IsSorted(buckets), n)
	}

	handler := b.meter.Records(name("processor.handler_duration"))
	require.Len(t, handler, 3, "one per handler call")
	outcomes := map[string]int{}
	for _, p := range handler {
		require.GreaterOrEqual(t, p.Value, sleep.Seconds(), "a handler call lasts at least its sleep")
		v, ok := p.Attributes.Value("result")
		require.True(t, ok)
		outcomes[v.AsString()]++
	}
	require.Equal(t, map[string]int{"success": 2, "error": 1}, outcomes)

	var lags []float64
	for _, p := range b.meter.Records(name("processor.queue_lag")) {
		lags = append(lags, p.Value)
	}
	slices.Sort(lags)
	require.Equal(t, []float64{2, 3, 3}, lags, "due to claim on the store's clock: the reclaim from its lease's expiry")

	claims := b.meter.Records(name("processor.claim_duration"))
	require.NotEmpty(t, claims)
	for _, p := range claims {
		require.GreaterOrEqual(t, p.Value, 0.0)
	}
	ops := map[string]int{}
	for _, p := range b.meter.Records(name("processor.write_duration")) {
		require.GreaterOrEqual(t, p.Value, 0.0)
		v, ok := p.Attributes.Value("operation")
		require.True(t, ok)
		ops[v.AsString()]++
	}
	require.GreaterOrEqual(t, ops["complete"], 1)
	require.Equal(t, 1, ops["fail"])
	require.Zero(t, ops["dead_letter"])
}
