package processor_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/leasestore/leasestore/internal/metrictest"
	"github.com/leasestore/leasestore/leasing"
	"github.com/leasestore/leasestore/leasing/leasingtest"
	"github.com/leasestore/leasestore/leasing/processor"
)

type processorBundle struct {
	clock *leasingtest.Clock
	mem   *leasing.Memory
	meter *metrictest.Provider
}

func setupProcessor(t *testing.T, q leasing.Queue) *processorBundle {
	t.Helper()
	clock := leasingtest.NewClock(leasingtest.Start)
	mem, err := leasing.NewMemory(q, leasing.MemoryOptions{Now: clock.Now})
	require.NoError(t, err)
	return &processorBundle{clock: clock, mem: mem, meter: metrictest.NewProvider()}
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

// rowOf returns the row of id in store.
func (b *processorBundle) rowOf(t *testing.T, store leasing.Store, id uuid.UUID) leasing.Row {
	t.Helper()
	r, err := store.Get(context.Background(), id)
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

// counter returns the total of the int64 counter of the queue named
// litebus.<queue>.<name>, 0 when never recorded. It never fails the test,
// so conditions of waitFor may call it.
func (b *processorBundle) counter(name string) int64 {
	return b.meter.Sum(processor.MetricName(b.mem.Queue(), name))
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
	p      *processor.Processor
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
func (b *processorBundle) start(t *testing.T, store leasing.Store, h processor.Handler, opts processor.Options) *running {
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
	p, err := processor.New(store, h, opts)
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

// waitAdvancing is waitFor for a condition that needs the store's clock to
// move on: it advances clock by step before each look. A handler call that
// began before the test changed its answer can write its release (due
// after a delay on the store's clock) after the test last moved the clock;
// only a moving clock makes that message due again. step must stay well
// under the lease duration, which the heartbeat renews on that clock.
func waitAdvancing(t *testing.T, clock *leasingtest.Clock, step time.Duration, cond func() bool, msg string) {
	t.Helper()
	waitFor(t, func() bool {
		clock.Advance(step)
		return cond()
	}, msg)
}

// receive returns the next value from ch, failing the test when none
// comes within waitFor's 5 seconds, so that a regression fails instead of
// hanging the test binary.
func receive[T any](t *testing.T, ch <-chan T, msg string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(5 * time.Second):
		require.FailNow(t, "nothing received in time: "+msg)
		panic("unreachable")
	}
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

// TestProcessor runs the processor's cases, part by part: the claim loop
// (loop_test.go), the heartbeat (book_test.go), the outcome writer
// (writer_test.go) and shutdown.
func TestProcessor(t *testing.T) {
	t.Parallel()
	testClaimLoop(t)
	testHeartbeat(t)
	testPersist(t)
	testShutdown(t)
}

// testShutdown: Stop, a cancelled Run context, and the shutdown grace.
func testShutdown(t *testing.T) {
	t.Run("Shutdown/ReleasesUnstartedLeasesAtOnce", func(t *testing.T) {
		t.Parallel()
		b := setupProcessor(t, leasing.Inbox)
		ids := b.enqueue(t, 3)
		started, release := make(chan struct{}), make(chan struct{})
		r := b.start(t, nil, func(context.Context, leasing.Lease) error {
			close(started)
			<-release
			return nil
		}, processor.Options{Concurrency: 1, BatchSize: 5})
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
		}, processor.Options{ShutdownGrace: 20 * time.Millisecond, RetryPolicy: processor.RetryPolicy{MaxAttempts: 1}})
		<-started
		r.cancel() // cancelling Run's context shuts down like Stop
		require.ErrorIs(t, <-cause, processor.ErrShutdown)
		require.NoError(t, r.stop(t))
		row := b.row(t, id)
		require.Equal(t, leasing.StatusFailed, row.Status, "not dead-lettered although attempts are spent")
		require.Equal(t, b.clock.Now(), row.VisibleAfter, "due again at once")
		require.True(t, strings.HasPrefix(row.LastError, processor.ErrShutdown.Error()), row.LastError)
		require.Equal(t, 1, row.AttemptCount)
		b.requireCounters(t, map[string]int64{"processor.failed": 1, "processor.dead_lettered": 0})
	})

	t.Run("Shutdown/StopBeforeRunAndRunTwice", func(t *testing.T) {
		t.Parallel()
		b := setupProcessor(t, leasing.Inbox)
		b.enqueue(t, 1)
		p, err := processor.New(b.mem, func(context.Context, leasing.Lease) error { return nil }, processor.Options{})
		require.NoError(t, err)
		require.NoError(t, p.Stop(context.Background()))
		require.NoError(t, p.Run(context.Background()), "Run after Stop returns at once")
		require.Error(t, p.Run(context.Background()), "a processor runs once")
		require.Equal(t, leasing.StatusPending, b.mem.Rows()[0].Status, "nothing claimed")
	})
}
