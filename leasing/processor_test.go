package leasing_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/leasestore/leasestore/leasing"
	"github.com/leasestore/leasestore/leasing/leasingtest"
)

type processorBundle struct {
	clock  *leasingtest.Clock
	mem    *leasing.Memory
	reader *sdkmetric.ManualReader
	meter  *sdkmetric.MeterProvider
}

func setupProcessor(t *testing.T, q leasing.Queue) *processorBundle {
	t.Helper()
	clock := leasingtest.NewClock(leasingtest.Start)
	mem, err := leasing.NewMemory(q, leasing.MemoryOptions{Now: clock.Now})
	require.NoError(t, err)
	reader := sdkmetric.NewManualReader()
	return &processorBundle{clock: clock, mem: mem, reader: reader, meter: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))}
}

// enqueue adds n messages and returns their ids in claim order.
func (b *processorBundle) enqueue(t *testing.T, n int) []uuid.UUID {
	t.Helper()
	msgs := make([]leasing.NewMessage, n)
	for i := range msgs {
		msgs[i] = leasing.NewMessage{Type: "test", Payload: fmt.Appendf(nil, "m%d", i)}
		if b.mem.Queue() == leasing.Outbox {
			msgs[i].Topic = "orders"
		}
	}
	res, err := b.mem.Enqueue(context.Background(), msgs...)
	require.NoError(t, err)
	return res.IDs
}

// peek returns the row of id, the zero Row when it cannot be read. It never
// fails the test, so that conditions of waitFor may call it.
func (b *processorBundle) peek(id uuid.UUID) leasing.Row {
	r, _ := b.mem.Get(context.Background(), id)
	return r
}

func (b *processorBundle) row(t *testing.T, id uuid.UUID) leasing.Row {
	t.Helper()
	r, err := b.mem.Get(context.Background(), id)
	require.NoError(t, err)
	return r
}

// claimAsOther claims like a second processor would.
func (b *processorBundle) claimAsOther(t *testing.T) []leasing.Lease {
	t.Helper()
	leases, err := b.mem.Claim(context.Background(), leasing.ClaimRequest{Owner: "other", BatchSize: 100, LeaseFor: 30 * time.Second})
	require.NoError(t, err)
	return leases
}

// counter returns the value of the int64 counter of the queue named
// litebus.<queue>.<name>, 0 when never recorded, -1 when it cannot be read.
// It never fails the test, so conditions of waitFor may call it.
func (b *processorBundle) counter(name string) int64 {
	var rm metricdata.ResourceMetrics
	if err := b.reader.Collect(context.Background(), &rm); err != nil {
		return -1
	}
	full := leasing.MetricName(b.mem.Queue(), name)
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != full {
				continue
			}
			sum, ok := m.Data.(metricdata.Sum[int64])
			if !ok {
				return -1
			}
			var total int64
			for _, dp := range sum.DataPoints {
				total += dp.Value
			}
			return total
		}
	}
	return 0
}

func (b *processorBundle) requireCounters(t *testing.T, want map[string]int64) {
	t.Helper()
	got := map[string]int64{}
	for name := range want {
		got[name] = b.counter(name)
	}
	require.Equal(t, want, got)
}

// running is a processor whose Run runs in a goroutine.
type running struct {
	p      *leasing.Processor
	cancel context.CancelFunc
	errc   chan error
	once   sync.Once
	err    error
}

// stop stops the processor and returns what Run returned.
func (r *running) stop(t *testing.T) error {
	t.Helper()
	r.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		require.NoError(t, r.p.Stop(ctx))
		r.err = <-r.errc
	})
	return r.err
}

// start runs a processor on store (the bundle's Memory when nil) with fast
// poll and heartbeat intervals unless opts sets them.
func (b *processorBundle) start(t *testing.T, store leasing.Store, h leasing.Handler, opts leasing.ProcessorOptions) *running {
	t.Helper()
	if store == nil {
		store = b.mem
	}
	if opts.PollInterval == 0 {
		opts.PollInterval = 5 * time.Millisecond
	}
	if opts.HeartbeatInterval == 0 {
		opts.HeartbeatInterval = 5 * time.Millisecond
	}
	opts.Meter = b.meter.Meter("test")
	p, err := leasing.NewProcessor(store, h, opts)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{p: p, cancel: cancel, errc: make(chan error, 1)}
	go func() { r.errc <- p.Run(ctx) }()
	t.Cleanup(func() {
		require.NoError(t, r.stop(t))
		cancel()
	})
	return r
}

func waitFor(t *testing.T, cond func() bool, msg string) {
	t.Helper()
	require.Eventually(t, cond, 5*time.Second, time.Millisecond, msg)
}

// statusIs reports whether the row of id has status s; it never fails the
// test, so that waitFor may call it.
func statusIs(store leasing.Store, id uuid.UUID, s leasing.Status) func() bool {
	return func() bool {
		r, err := store.Get(context.Background(), id)
		return err == nil && r.Status == s
	}
}

// storeHooks wraps a Store and lets a test intercept some calls.
type storeHooks struct {
	leasing.Store
	claim    func(context.Context, leasing.ClaimRequest) ([]leasing.Lease, error)
	renew    func(context.Context, time.Duration, ...leasing.Lease) (leasing.RenewResult, error)
	complete func(context.Context, ...leasing.Lease) (leasing.WriteResult, error)
}

func (s *storeHooks) Claim(ctx context.Context, r leasing.ClaimRequest) ([]leasing.Lease, error) {
	if s.claim != nil {
		return s.claim(ctx, r)
	}
	return s.Store.Claim(ctx, r)
}

func (s *storeHooks) Renew(ctx context.Context, d time.Duration, leases ...leasing.Lease) (leasing.RenewResult, error) {
	if s.renew != nil {
		return s.renew(ctx, d, leases...)
	}
	return s.Store.Renew(ctx, d, leases...)
}

func (s *storeHooks) Complete(ctx context.Context, leases ...leasing.Lease) (leasing.WriteResult, error) {
	if s.complete != nil {
		return s.complete(ctx, leases...)
	}
	return s.Store.Complete(ctx, leases...)
}

func TestProcessor(t *testing.T) {
	t.Parallel()

	t.Run("Inbox/Success", func(t *testing.T) {
		t.Parallel()
		b := setupProcessor(t, leasing.Inbox)
		ids := b.enqueue(t, 3)
		var handled sync.Map
		proc := b.start(t, nil, func(_ context.Context, l leasing.Lease) error {
			handled.Store(l.Message.ID, l.Attempt)
			return nil
		}, leasing.ProcessorOptions{})
		for _, id := range ids {
			waitFor(t, statusIs(b.mem, id, leasing.StatusCompleted), "completed")
			attempt, _ := handled.Load(id)
			require.Equal(t, 1, attempt)
			r := b.row(t, id)
			require.NotNil(t, r.FinishedAt)
			require.Nil(t, r.LeaseExpiresAt)
		}
		require.NoError(t, proc.stop(t)) // Run returns once every outcome is written and counted
		b.requireCounters(t, map[string]int64{
			"processor.leases_acquired": 3, "processor.succeeded": 3, "processor.failed": 0,
			"processor.lease_lost": 0, "processor.persist_skipped": 0, "processor.persist_rejected": 0,
		})
	})

	t.Run("Outbox/PublisherSuccess", func(t *testing.T) {
		t.Parallel()
		b := setupProcessor(t, leasing.Outbox)
		ids := b.enqueue(t, 4)
		var mu sync.Mutex
		var delivered []uuid.UUID // the fake broker
		publish := leasing.Publisher(func(_ context.Context, m leasing.Message) error {
			mu.Lock()
			defer mu.Unlock()
			if m.Topic == "orders" {
				delivered = append(delivered, m.ID)
			}
			return nil
		})
		proc := b.start(t, nil, publish.Handler(), leasing.ProcessorOptions{Concurrency: 1})
		for _, id := range ids {
			waitFor(t, statusIs(b.mem, id, leasing.StatusPublished), "published")
		}
		mu.Lock()
		require.Equal(t, ids, delivered, "one slot delivers in claim (FIFO) order")
		mu.Unlock()
		require.NoError(t, proc.stop(t)) // Run returns once every outcome is written and counted
		b.requireCounters(t, map[string]int64{"processor.leases_acquired": 4, "processor.published": 4})
	})

	t.Run("FailureThenRetryAfterBackoffThenSuccess", func(t *testing.T) {
		t.Parallel()
		b := setupProcessor(t, leasing.Inbox)
		id := b.enqueue(t, 1)[0]
		t0 := b.clock.Now()
		var calls atomic.Int32
		var lastError atomic.Value
		proc := b.start(t, nil, func(_ context.Context, l leasing.Lease) error {
			if calls.Add(1) == 1 {
				return errors.New("boom")
			}
			lastError.Store(l.LastError)
			return nil
		}, leasing.ProcessorOptions{Retry: leasing.RetryPolicy{InitialDelay: time.Minute}})

		waitFor(t, statusIs(b.mem, id, leasing.StatusFailed), "failed")
		r := b.row(t, id)
		require.Equal(t, "boom", r.LastError)
		require.Equal(t, 1, r.AttemptCount)
		require.Equal(t, t0.Add(time.Minute), r.VisibleAfter, "due again after the backoff on the store clock")
		require.Empty(t, b.claimAsOther(t), "not visible before the backoff ends")

		b.clock.Advance(time.Minute)
		waitFor(t, statusIs(b.mem, id, leasing.StatusCompleted), "completed on the retry")
		require.Equal(t, 2, b.row(t, id).AttemptCount)
		require.Equal(t, "boom", lastError.Load(), "the retry sees the previous attempt's error")
		require.NoError(t, proc.stop(t)) // Run returns once every outcome is written and counted
		b.requireCounters(t, map[string]int64{
			"processor.leases_acquired": 2, "processor.failed": 1, "processor.succeeded": 1, "processor.dead_lettered": 0,
		})
	})

	t.Run("FailureWithShortBackoffIsRetriedBeforeNextPoll", func(t *testing.T) {
		t.Parallel()
		// A store on the real clock: the 10ms retry delay passes by itself,
		// and the processor claims then although its next poll is an hour away.
		mem, err := leasing.NewMemory(leasing.Inbox, leasing.MemoryOptions{})
		require.NoError(t, err)
		res, err := mem.Enqueue(context.Background(), leasing.NewMessage{})
		require.NoError(t, err)
		b := setupProcessor(t, leasing.Inbox)
		var calls atomic.Int32
		b.start(t, mem, func(context.Context, leasing.Lease) error {
			if calls.Add(1) == 1 {
				return errors.New("once")
			}
			return nil
		}, leasing.ProcessorOptions{PollInterval: time.Hour, Retry: leasing.RetryPolicy{InitialDelay: 10 * time.Millisecond}})
		waitFor(t, statusIs(mem, res.IDs[0], leasing.StatusCompleted), "completed on the retry")
		require.EqualValues(t, 2, calls.Load())
	})

	t.Run("FailuresUntilDeadLetter", func(t *testing.T) {
		t.Parallel()
		b := setupProcessor(t, leasing.Inbox)
		id := b.enqueue(t, 1)[0]
		var calls atomic.Int32
		policy := leasing.RetryPolicy{MaxAttempts: 3, InitialDelay: time.Second, Multiplier: 3}
		proc := b.start(t, nil, func(_ context.Context, l leasing.Lease) error {
			calls.Add(1)
			return fmt.Errorf("attempt %d failed", l.Attempt)
		}, leasing.ProcessorOptions{Retry: policy})

		for _, step := range []struct {
			attempt int
			delay   time.Duration
		}{{1, time.Second}, {2, 3 * time.Second}} {
			waitFor(t, func() bool {
				r := b.peek(id)
				return r.Status == leasing.StatusFailed && r.AttemptCount == step.attempt
			}, "failed")
			r := b.row(t, id)
			require.Equal(t, fmt.Sprintf("attempt %d failed", step.attempt), r.LastError)
			require.Equal(t, b.clock.Now().Add(step.delay), r.VisibleAfter)
			b.clock.Advance(step.delay)
		}
		waitFor(t, statusIs(b.mem, id, leasing.StatusDeadLettered), "dead-lettered")
		r := b.row(t, id)
		require.Equal(t, "attempt 3 failed", r.LastError)
		require.NotNil(t, r.DeadLetteredAt)
		require.EqualValues(t, 3, calls.Load())
		require.NoError(t, proc.stop(t)) // Run returns once every outcome is written and counted
		b.requireCounters(t, map[string]int64{
			"processor.leases_acquired": 3, "processor.failed": 2, "processor.dead_lettered": 1, "processor.succeeded": 0,
		})
	})

	t.Run("PanicIsHandlerError", func(t *testing.T) {
		t.Parallel()
		b := setupProcessor(t, leasing.Inbox)
		id := b.enqueue(t, 1)[0]
		proc := b.start(t, nil, func(context.Context, leasing.Lease) error { panic("kaboom") }, leasing.ProcessorOptions{})
		waitFor(t, statusIs(b.mem, id, leasing.StatusFailed), "failed")
		require.Contains(t, b.row(t, id).LastError, "handler panicked: kaboom")
		require.NoError(t, proc.stop(t)) // Run returns once every outcome is written and counted
		require.EqualValues(t, 1, b.counter("processor.failed"))
	})

	t.Run("Heartbeat/KeepsSlowHandlerAlive", func(t *testing.T) {
		t.Parallel()
		b := setupProcessor(t, leasing.Inbox)
		id := b.enqueue(t, 1)[0]
		t0 := b.clock.Now()
		started, release := make(chan struct{}), make(chan struct{})
		proc := b.start(t, nil, func(ctx context.Context, _ leasing.Lease) error {
			close(started)
			select {
			case <-release:
				return nil
			case <-ctx.Done():
				return context.Cause(ctx)
			}
		}, leasing.ProcessorOptions{LeaseDuration: 30 * time.Second})
		<-started
		require.Equal(t, t0.Add(30*time.Second), *b.row(t, id).LeaseExpiresAt)

		// Two steps of 20s take the store clock past the first expiry; the
		// heartbeat renews to store-now + 30s after each step.
		for _, now := range []time.Time{t0.Add(20 * time.Second), t0.Add(40 * time.Second)} {
			b.clock.Advance(20 * time.Second)
			waitFor(t, func() bool {
				exp := b.peek(id).LeaseExpiresAt
				return exp != nil && exp.Equal(now.Add(30*time.Second))
			}, "renewed")
			require.Empty(t, b.claimAsOther(t), "a renewed lease is not reclaimed")
		}
		st, err := b.mem.Stats(context.Background())
		require.NoError(t, err)
		require.Zero(t, st.ExpiredLeases)

		close(release)
		waitFor(t, statusIs(b.mem, id, leasing.StatusCompleted), "completed")
		r := b.row(t, id)
		require.Equal(t, int64(1), r.LeaseGeneration, "never reclaimed")
		require.NoError(t, proc.stop(t)) // Run returns once every outcome is written and counted
		b.requireCounters(t, map[string]int64{"processor.lease_lost": 0, "processor.succeeded": 1})
	})

	t.Run("Heartbeat/RenewsAllLeasesInOneCall", func(t *testing.T) {
		t.Parallel()
		b := setupProcessor(t, leasing.Inbox)
		b.enqueue(t, 4)
		var sawAll atomic.Bool
		store := &storeHooks{Store: b.mem}
		store.renew = func(ctx context.Context, d time.Duration, leases ...leasing.Lease) (leasing.RenewResult, error) {
			if len(leases) == 4 {
				sawAll.Store(true)
			}
			return b.mem.Renew(ctx, d, leases...)
		}
		release := make(chan struct{})
		var started atomic.Int32
		// Two slots, a batch of four: two leases run, two wait, and one
		// renew call carries all four.
		b.start(t, store, func(context.Context, leasing.Lease) error {
			started.Add(1)
			<-release
			return nil
		}, leasing.ProcessorOptions{Concurrency: 2, BatchSize: 4})
		waitFor(t, sawAll.Load, "one renew carries running and waiting leases")
		require.EqualValues(t, 2, started.Load())
		close(release)
		waitFor(t, func() bool { return b.counter("processor.succeeded") == 4 }, "all succeeded")
	})

	t.Run("Heartbeat/LostLeaseCancelsHandlerAndSkipsOutcome", func(t *testing.T) {
		t.Parallel()
		b := setupProcessor(t, leasing.Inbox)
		id := b.enqueue(t, 1)[0]
		started, release := make(chan struct{}), make(chan struct{})
		cause := make(chan error, 1)
		// One slot: the processor cannot claim (and so reclaim the row
		// itself) while its handler runs.
		b.start(t, nil, func(ctx context.Context, _ leasing.Lease) error {
			close(started)
			<-ctx.Done()
			cause <- context.Cause(ctx)
			<-release
			return nil // claims success; the processor must not write it
		}, leasing.ProcessorOptions{Concurrency: 1, LeaseDuration: 30 * time.Second})
		<-started

		b.clock.Advance(31 * time.Second)
		reclaimed := b.claimAsOther(t)
		require.Len(t, reclaimed, 1)
		require.Equal(t, int64(2), reclaimed[0].Generation)

		select {
		case err := <-cause:
			require.ErrorIs(t, err, leasing.ErrLeaseLost)
		case <-time.After(5 * time.Second):
			t.Fatal("handler context not cancelled after its lease was lost")
		}
		close(release)
		waitFor(t, func() bool { return b.counter("processor.persist_skipped") == 1 }, "skipped")

		r := b.row(t, id)
		require.Equal(t, leasing.StatusProcessing, r.Status, "not completed by the worker that lost the lease")
		require.Equal(t, "other", r.LeaseOwner)
		b.requireCounters(t, map[string]int64{
			"processor.lease_lost": 1, "processor.persist_skipped": 1, "processor.succeeded": 0, "processor.persist_rejected": 0,
		})
		wr, err := b.mem.Complete(context.Background(), reclaimed...)
		require.NoError(t, err)
		require.NoError(t, wr.Err(), "the new owner finishes the message")
	})

	t.Run("Heartbeat/LeaseLostWhileWaitingNeverStarts", func(t *testing.T) {
		t.Parallel()
		b := setupProcessor(t, leasing.Inbox)
		ids := b.enqueue(t, 2)
		release := make(chan struct{})
		var calls atomic.Int32
		b.start(t, nil, func(ctx context.Context, _ leasing.Lease) error {
			calls.Add(1)
			<-ctx.Done()
			<-release
			return ctx.Err()
		}, leasing.ProcessorOptions{Concurrency: 1, BatchSize: 2})
		waitFor(t, func() bool { return calls.Load() == 1 && b.counter("processor.leases_acquired") == 2 }, "one runs, one waits")

		b.clock.Advance(31 * time.Second)
		require.Len(t, b.claimAsOther(t), 2)
		waitFor(t, func() bool { return b.counter("processor.lease_lost") == 2 }, "both leases lost")
		close(release)
		waitFor(t, func() bool { return b.counter("processor.persist_skipped") == 2 }, "both skipped")
		require.EqualValues(t, 1, calls.Load(), "the waiting lease was lost before it started")
		for _, id := range ids {
			r := b.row(t, id)
			require.Equal(t, leasing.StatusProcessing, r.Status)
			require.Equal(t, "other", r.LeaseOwner)
		}
	})

	t.Run("Persist/RejectedWhenFenceRefuses", func(t *testing.T) {
		t.Parallel()
		b := setupProcessor(t, leasing.Inbox)
		id := b.enqueue(t, 1)[0]
		store := &storeHooks{Store: b.mem}
		var reclaimed atomic.Int32
		store.complete = func(ctx context.Context, leases ...leasing.Lease) (leasing.WriteResult, error) {
			// The lease expires and another worker reclaims the row between
			// the handler's return and the write.
			b.clock.Advance(31 * time.Second)
			other, err := b.mem.Claim(ctx, leasing.ClaimRequest{Owner: "other", BatchSize: 1, LeaseFor: 30 * time.Second})
			if err == nil {
				reclaimed.Add(int32(len(other)))
			}
			return b.mem.Complete(ctx, leases...)
		}
		b.start(t, store, func(context.Context, leasing.Lease) error { return nil }, leasing.ProcessorOptions{Concurrency: 1})
		waitFor(t, func() bool { return b.counter("processor.persist_rejected") == 1 }, "rejected")
		require.EqualValues(t, 1, reclaimed.Load())
		require.Equal(t, "other", b.row(t, id).LeaseOwner)
		b.requireCounters(t, map[string]int64{"processor.succeeded": 0, "processor.persist_rejected": 1})
	})

	t.Run("Persist/RetriesDriverErrorAlreadyApplied", func(t *testing.T) {
		t.Parallel()
		b := setupProcessor(t, leasing.Inbox)
		id := b.enqueue(t, 1)[0]
		store := &storeHooks{Store: b.mem}
		var calls atomic.Int32
		var retried atomic.Value
		store.complete = func(ctx context.Context, leases ...leasing.Lease) (leasing.WriteResult, error) {
			res, err := b.mem.Complete(ctx, leases...)
			if calls.Add(1) == 1 {
				// Committed, but the connection broke before the reply.
				return leasing.WriteResult{}, errors.New("conn closed")
			}
			retried.Store(res.Outcomes[0].Outcome)
			return res, err
		}
		var reported atomic.Int32
		b.start(t, store, func(context.Context, leasing.Lease) error { return nil }, leasing.ProcessorOptions{
			OnError: func(err error) {
				if strings.Contains(err.Error(), "conn closed") {
					reported.Add(1)
				}
			},
		})
		waitFor(t, func() bool { return b.counter("processor.succeeded") == 1 }, "succeeded after a retry")
		require.EqualValues(t, 2, calls.Load())
		require.Equal(t, leasing.OutcomeAlreadyApplied, retried.Load())
		require.EqualValues(t, 1, reported.Load())
		require.Equal(t, leasing.StatusCompleted, b.row(t, id).Status)
		require.EqualValues(t, 0, b.counter("processor.persist_rejected"))
	})

	t.Run("Persist/SlowStoreStopsClaims", func(t *testing.T) {
		// While the store does not answer a write, a worker whose outcome
		// finds Concurrency+1 waiting keeps its slot until the writer takes
		// it, so the processor stops claiming instead of leasing the whole
		// queue: here the blocked write took at most 3 waiting + 2 from
		// held workers, and as many wait for the next write.
		t.Parallel()
		b := setupProcessor(t, leasing.Inbox)
		ids := b.enqueue(t, 50)
		store := &storeHooks{Store: b.mem}
		var claimed atomic.Int64
		store.claim = func(ctx context.Context, r leasing.ClaimRequest) ([]leasing.Lease, error) {
			leases, err := b.mem.Claim(ctx, r)
			claimed.Add(int64(len(leases)))
			return leases, err
		}
		answer := make(chan struct{})
		var answerOnce sync.Once
		letAnswer := func() { answerOnce.Do(func() { close(answer) }) }
		store.complete = func(ctx context.Context, leases ...leasing.Lease) (leasing.WriteResult, error) {
			select {
			case <-answer:
			case <-ctx.Done():
				return leasing.WriteResult{}, ctx.Err()
			}
			return b.mem.Complete(ctx, leases...)
		}
		b.start(t, store, func(context.Context, leasing.Lease) error { return nil },
			leasing.ProcessorOptions{Concurrency: 2, BatchSize: 1})
		t.Cleanup(letAnswer) // runs before the processor's stop, also when the test fails
		waitFor(t, func() bool { return claimed.Load() >= 6 }, "claims until the writer's queue is full")
		time.Sleep(100 * time.Millisecond) // room for claims that should not happen
		require.LessOrEqual(t, claimed.Load(), int64(10), "leases claimed while the store did not answer")
		letAnswer()
		for _, id := range ids {
			waitFor(t, statusIs(b.mem, id, leasing.StatusCompleted), "completed once the store answers")
		}
	})

	t.Run("Shutdown/ReleasesUnstartedLeasesAtOnce", func(t *testing.T) {
		t.Parallel()
		b := setupProcessor(t, leasing.Inbox)
		ids := b.enqueue(t, 3)
		started, release := make(chan struct{}), make(chan struct{})
		r := b.start(t, nil, func(context.Context, leasing.Lease) error {
			close(started)
			<-release
			return nil
		}, leasing.ProcessorOptions{Concurrency: 1, BatchSize: 5})
		<-started
		waitFor(t, func() bool { return b.counter("processor.leases_acquired") == 3 }, "all three claimed")
		for _, id := range ids[1:] {
			require.Equal(t, 1, b.row(t, id).AttemptCount)
		}

		stopped := make(chan error, 1)
		go func() { stopped <- r.stop(t) }()
		// The running handler still holds its slot, yet the waiting leases
		// are released without waiting for it, or for their expiry.
		for _, id := range ids[1:] {
			waitFor(t, statusIs(b.mem, id, leasing.StatusPending), "released")
			row := b.row(t, id)
			require.Zero(t, row.AttemptCount, "a release gives back the attempt")
			require.Empty(t, row.LeaseOwner)
			require.Nil(t, row.LeaseExpiresAt)
		}
		require.Len(t, b.claimAsOther(t), 2, "another worker takes them at once")
		close(release)
		require.NoError(t, <-stopped)
		require.Equal(t, leasing.StatusCompleted, b.row(t, ids[0]).Status, "the running handler finished in the grace period")
		b.requireCounters(t, map[string]int64{"processor.succeeded": 1, "processor.persist_rejected": 0})
	})

	t.Run("Shutdown/GraceCancelsHandlerAndFailsWithoutDelay", func(t *testing.T) {
		t.Parallel()
		b := setupProcessor(t, leasing.Inbox)
		id := b.enqueue(t, 1)[0]
		started := make(chan struct{})
		cause := make(chan error, 1)
		r := b.start(t, nil, func(ctx context.Context, _ leasing.Lease) error {
			close(started)
			<-ctx.Done()
			cause <- context.Cause(ctx)
			return ctx.Err()
		}, leasing.ProcessorOptions{ShutdownGrace: 20 * time.Millisecond, Retry: leasing.RetryPolicy{MaxAttempts: 1}})
		<-started
		r.cancel() // cancelling Run's context shuts down like Stop
		require.ErrorIs(t, <-cause, leasing.ErrShutdown)
		require.NoError(t, r.stop(t))
		row := b.row(t, id)
		require.Equal(t, leasing.StatusFailed, row.Status, "not dead-lettered although attempts are spent")
		require.Equal(t, b.clock.Now(), row.VisibleAfter, "due again at once")
		require.True(t, strings.HasPrefix(row.LastError, leasing.ErrShutdown.Error()), row.LastError)
		require.Equal(t, 1, row.AttemptCount)
		b.requireCounters(t, map[string]int64{"processor.failed": 1, "processor.dead_lettered": 0})
	})

	t.Run("Shutdown/StopBeforeRunAndRunTwice", func(t *testing.T) {
		t.Parallel()
		b := setupProcessor(t, leasing.Inbox)
		b.enqueue(t, 1)
		p, err := leasing.NewProcessor(b.mem, func(context.Context, leasing.Lease) error { return nil }, leasing.ProcessorOptions{})
		require.NoError(t, err)
		require.NoError(t, p.Stop(context.Background()))
		require.NoError(t, p.Run(context.Background()), "Run after Stop returns at once")
		require.Error(t, p.Run(context.Background()), "a processor runs once")
		require.Equal(t, leasing.StatusPending, b.mem.Rows()[0].Status, "nothing claimed")
	})

	t.Run("WorkSignal/WakesBeforePollInterval", func(t *testing.T) {
		t.Parallel()
		b := setupProcessor(t, leasing.Inbox)
		var claims atomic.Int32
		store := &storeHooks{Store: b.mem}
		store.claim = func(ctx context.Context, r leasing.ClaimRequest) ([]leasing.Lease, error) {
			claims.Add(1)
			return b.mem.Claim(ctx, r)
		}
		wake := make(chan struct{}, 1)
		b.start(t, store, func(context.Context, leasing.Lease) error { return nil }, leasing.ProcessorOptions{
			PollInterval: time.Hour, WorkSignal: leasing.WakeChan(wake),
		})
		waitFor(t, func() bool { return claims.Load() == 1 }, "first claim at start")
		id := b.enqueue(t, 1)[0]
		wake <- struct{}{}
		waitFor(t, statusIs(b.mem, id, leasing.StatusCompleted), "woken, claimed and completed")
		require.EqualValues(t, 2, claims.Load())
	})
}

func TestProcessorOptions(t *testing.T) {
	t.Parallel()
	mem, err := leasing.NewMemory(leasing.Inbox, leasing.MemoryOptions{})
	require.NoError(t, err)
	ok := func(context.Context, leasing.Lease) error { return nil }

	t.Run("Defaults", func(t *testing.T) {
		t.Parallel()
		p, err := leasing.NewProcessor(mem, ok, leasing.ProcessorOptions{})
		require.NoError(t, err)
		o := p.Options()
		require.Equal(t, 10, o.BatchSize)
		require.Equal(t, 30*time.Second, o.LeaseDuration)
		require.Equal(t, 10*time.Second, o.HeartbeatInterval)
		require.Equal(t, 4, o.Concurrency)
		require.Equal(t, time.Second, o.PollInterval)
		require.Equal(t, 10*time.Second, o.ShutdownGrace)
		require.Equal(t, leasing.RetryPolicy{MaxAttempts: 5, InitialDelay: time.Second, MaxDelay: 5 * time.Minute, Multiplier: 2}, o.Retry)
		require.True(t, strings.HasPrefix(p.Owner(), "inbox-"), p.Owner())

		q, err := leasing.NewProcessor(mem, ok, leasing.ProcessorOptions{Owner: "billing"})
		require.NoError(t, err)
		r, err := leasing.NewProcessor(mem, ok, leasing.ProcessorOptions{Owner: "billing"})
		require.NoError(t, err)
		require.True(t, strings.HasPrefix(q.Owner(), "billing-"), q.Owner())
		require.NotEqual(t, q.Owner(), r.Owner(), "one label, two owners")

		label := strings.Repeat("o", leasing.MaxOwnerLabelBytes)
		long, err := leasing.NewProcessor(mem, ok, leasing.ProcessorOptions{Owner: label})
		require.NoError(t, err, "the longest label is kept whole")
		require.True(t, strings.HasPrefix(long.Owner(), label+"-"), long.Owner())
		require.Len(t, long.Owner(), leasing.MaxOwnerBytes)
	})

	t.Run("Invalid", func(t *testing.T) {
		t.Parallel()
		for name, tc := range map[string]struct {
			store leasing.Store
			h     leasing.Handler
			opts  leasing.ProcessorOptions
			field string
		}{
			"NilStore":                 {nil, ok, leasing.ProcessorOptions{}, "store"},
			"NilHandler":               {mem, nil, leasing.ProcessorOptions{}, "handler"},
			"HeartbeatOverHalfLease":   {mem, ok, leasing.ProcessorOptions{LeaseDuration: 10 * time.Second, HeartbeatInterval: 5*time.Second + 1}, "heartbeat interval"},
			"NegativeHeartbeat":        {mem, ok, leasing.ProcessorOptions{HeartbeatInterval: -time.Second}, "heartbeat interval"},
			"NegativeBatchSize":        {mem, ok, leasing.ProcessorOptions{BatchSize: -1}, "batch size"},
			"BatchSizeOverMax":         {mem, ok, leasing.ProcessorOptions{BatchSize: leasing.MaxBatchSize + 1}, "batch size"},
			"NegativeLease":            {mem, ok, leasing.ProcessorOptions{LeaseDuration: -time.Second}, "lease duration"},
			"LeaseOverMax":             {mem, ok, leasing.ProcessorOptions{LeaseDuration: leasing.MaxLeaseDuration + time.Second}, "lease duration"},
			"NegativeConcurrency":      {mem, ok, leasing.ProcessorOptions{Concurrency: -4}, "concurrency"},
			"NegativePollInterval":     {mem, ok, leasing.ProcessorOptions{PollInterval: -time.Second}, "poll interval"},
			"NegativeShutdownGrace":    {mem, ok, leasing.ProcessorOptions{ShutdownGrace: -time.Second}, "shutdown grace"},
			"OwnerWithNUL":             {mem, ok, leasing.ProcessorOptions{Owner: "a\x00b"}, "owner"},
			"OwnerTooLong":             {mem, ok, leasing.ProcessorOptions{Owner: strings.Repeat("o", leasing.MaxOwnerBytes)}, "owner"},
			"OwnerLabelOneTooLong":     {mem, ok, leasing.ProcessorOptions{Owner: strings.Repeat("o", leasing.MaxOwnerLabelBytes+1)}, "owner"},
			"RetryMaxAttemptsNegative": {mem, ok, leasing.ProcessorOptions{Retry: leasing.RetryPolicy{MaxAttempts: -1}}, "retry max attempts"},
			"RetryMultiplierBelowOne":  {mem, ok, leasing.ProcessorOptions{Retry: leasing.RetryPolicy{Multiplier: 0.5}}, "retry multiplier"},
			"RetryJitterOverOne":       {mem, ok, leasing.ProcessorOptions{Retry: leasing.RetryPolicy{Jitter: 1.5}}, "retry jitter"},
			"RetryMaxBelowInitial":     {mem, ok, leasing.ProcessorOptions{Retry: leasing.RetryPolicy{InitialDelay: time.Hour, MaxDelay: time.Minute}}, "retry max delay"},
			"RetryNegativeInitial":     {mem, ok, leasing.ProcessorOptions{Retry: leasing.RetryPolicy{InitialDelay: -time.Second}}, "retry initial delay"},
			"RetryInitialOverMax":      {mem, ok, leasing.ProcessorOptions{Retry: leasing.RetryPolicy{InitialDelay: leasing.MaxDelay + 1}}, "retry initial delay"},
			"RetryMaxOverMax":          {mem, ok, leasing.ProcessorOptions{Retry: leasing.RetryPolicy{MaxDelay: leasing.MaxDelay + 1}}, "retry max delay"},
			"TenantWithNUL":            {mem, ok, leasing.ProcessorOptions{TenantID: "t\x00"}, "tenant id"},
			"TenantInvalidUTF8":        {mem, ok, leasing.ProcessorOptions{TenantID: "\xff"}, "tenant id"},
			"VacuumNegativeDeadRows":   {mem, ok, leasing.ProcessorOptions{Vacuum: leasing.VacuumPolicy{DeadRows: -1}}, "vacuum dead rows"},
			"VacuumNegativeInterval":   {mem, ok, leasing.ProcessorOptions{Vacuum: leasing.VacuumPolicy{CheckInterval: -time.Second}}, "vacuum check interval"},
			"VacuumDutyCycleOverOne":   {mem, ok, leasing.ProcessorOptions{Vacuum: leasing.VacuumPolicy{DutyCycle: 1.5}}, "vacuum duty cycle"},
		} {
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				p, err := leasing.NewProcessor(tc.store, tc.h, tc.opts)
				require.Nil(t, p)
				require.ErrorIs(t, err, leasing.ErrInvalidArgument)
				var argErr *leasing.ArgumentError
				require.ErrorAs(t, err, &argErr)
				require.Equal(t, tc.field, argErr.Field)
			})
		}
	})
}

// A message whose earlier attempts all ended without an outcome (its
// handler crashed the worker each time) is dead-lettered once it is
// claimed past MaxAttempts, without running the handler again.
func TestProcessorDeadLettersCrashLoopingMessage(t *testing.T) {
	t.Parallel()
	b := setupProcessor(t, leasing.Inbox)
	id := b.enqueue(t, 1)[0]
	for range 3 { // three crashed attempts: claimed, never written
		require.Len(t, b.claimAsOther(t), 1)
		b.clock.Advance(30 * time.Second)
	}
	var runs atomic.Int64
	b.start(t, nil, func(context.Context, leasing.Lease) error {
		runs.Add(1)
		return nil
	}, leasing.ProcessorOptions{Retry: leasing.RetryPolicy{MaxAttempts: 3}})
	waitFor(t, statusIs(b.mem, id, leasing.StatusDeadLettered), "dead-lettered")
	require.Zero(t, runs.Load(), "the handler must not run a fourth time")
	row := b.row(t, id)
	require.Equal(t, 4, row.AttemptCount)
	require.Contains(t, row.LastError, leasing.ErrAttemptsExhausted.Error())
}
