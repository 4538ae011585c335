package processor_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/leasestore/leasestore/leasing"
	"github.com/leasestore/leasestore/leasing/processor"
)

// testClaimLoop: claims, dispatch to workers, outcomes by the retry policy
// and wake-ups.
func testClaimLoop(t *testing.T) {
	t.Run("Inbox/Success", func(t *testing.T) {
		t.Parallel()
		b := setupProcessor(t, leasing.Inbox)
		ids := b.enqueue(t, 3)
		var handled sync.Map
		proc := b.start(t, nil, func(_ context.Context, l leasing.Lease) error {
			handled.Store(l.Message.ID, l.Attempt)
			return nil
		}, processor.Options{})
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

	t.Run("WorkersOutliveCalls", func(t *testing.T) {
		t.Parallel()
		b := setupProcessor(t, leasing.Inbox)
		ids := b.enqueue(t, 30)
		var mu sync.Mutex
		goroutines := map[string]int{} // handler calls per goroutine
		proc := b.start(t, nil, func(context.Context, leasing.Lease) error {
			mu.Lock()
			defer mu.Unlock()
			goroutines[goroutineID()]++
			return nil
		}, processor.Options{Concurrency: 3, BatchSize: 10})
		for _, id := range ids {
			waitFor(t, statusIs(b.mem, id, leasing.StatusCompleted), "completed")
		}
		require.NoError(t, proc.stop(t))
		mu.Lock()
		defer mu.Unlock()
		calls := 0
		for _, n := range goroutines {
			calls += n
		}
		require.Equal(t, 30, calls)
		require.LessOrEqual(t, len(goroutines), 3, "at most Concurrency workers, each running call after call")
	})

	t.Run("Outbox/PublisherSuccess", func(t *testing.T) {
		t.Parallel()
		b := setupProcessor(t, leasing.Outbox)
		ids := b.enqueue(t, 4)
		var mu sync.Mutex
		var delivered []uuid.UUID // the fake broker
		publish := processor.Publisher(func(_ context.Context, m leasing.Message) error {
			mu.Lock()
			defer mu.Unlock()
			if m.Topic == "orders" {
				delivered = append(delivered, m.ID)
			}
			return nil
		})
		proc := b.start(t, nil, publish.Handler(), processor.Options{Concurrency: 1})
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
		}, processor.Options{RetryPolicy: processor.RetryPolicy{InitialDelay: time.Minute}})

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
		}, processor.Options{PollInterval: time.Hour, RetryPolicy: processor.RetryPolicy{InitialDelay: 10 * time.Millisecond}})
		waitFor(t, statusIs(mem, res.IDs[0], leasing.StatusCompleted), "completed on the retry")
		require.EqualValues(t, 2, calls.Load())
	})

	// Handlers that fail at once, with a poll an hour away: each retry is
	// claimed when its backoff ends, whether a work signal (which never
	// fires here) makes the loop re-poll 2 ... 64 ms after a claim or not
	// (the backoff, 150 ms, outlasts those re-polls: 126 ms in all),
	// and the keyed successor of a head that succeeds on its last attempt
	// is claimed as soon as the head's outcome promotes it.
	for _, signal := range []bool{false, true} {
		for _, keyed := range []bool{false, true} {
			t.Run(fmt.Sprintf("ImmediateFailuresRetriedWhenDue/signal=%v/keyed=%v", signal, keyed), func(t *testing.T) {
				t.Parallel()
				mem, err := leasing.NewMemory(leasing.Inbox, leasing.MemoryOptions{}) // the real clock
				require.NoError(t, err)
				key := ""
				if keyed {
					key = "k"
				}
				res, err := mem.Enqueue(context.Background(),
					leasing.NewMessage{OrderingKey: key, Payload: []byte("head")},
					leasing.NewMessage{OrderingKey: key, Payload: []byte("next")})
				require.NoError(t, err)
				const attempts = 3
				var calls sync.Map // message id -> *atomic.Int32
				opts := processor.Options{
					PollInterval: time.Hour, Concurrency: 1,
					RetryPolicy: processor.RetryPolicy{MaxAttempts: attempts + 1, InitialDelay: 150 * time.Millisecond, Multiplier: 1},
				}
				if signal {
					opts.WorkSignal = processor.WakeChan(make(chan struct{}))
				}
				b := setupProcessor(t, leasing.Inbox)
				b.start(t, mem, func(_ context.Context, l leasing.Lease) error {
					n, _ := calls.LoadOrStore(l.Message.ID, new(atomic.Int32))
					if n.(*atomic.Int32).Add(1) < attempts && string(l.Message.Payload) == "head" {
						return errors.New("fails at once")
					}
					return nil
				}, opts)
				for _, id := range res.IDs {
					waitFor(t, statusIs(mem, id, leasing.StatusCompleted), "completed within seconds, not at the next poll")
				}
				require.Equal(t, attempts, b.rowOf(t, mem, res.IDs[0]).AttemptCount)
			})
		}
	}

	t.Run("FailuresUntilDeadLetter", func(t *testing.T) {
		t.Parallel()
		b := setupProcessor(t, leasing.Inbox)
		id := b.enqueue(t, 1)[0]
		var calls atomic.Int32
		policy := processor.RetryPolicy{MaxAttempts: 3, InitialDelay: time.Second, Multiplier: 3}
		proc := b.start(t, nil, func(_ context.Context, l leasing.Lease) error {
			calls.Add(1)
			return fmt.Errorf("attempt %d failed", l.Attempt)
		}, processor.Options{RetryPolicy: policy})

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
		proc := b.start(t, nil, func(context.Context, leasing.Lease) error { panic("kaboom") }, processor.Options{})
		waitFor(t, statusIs(b.mem, id, leasing.StatusFailed), "failed")
		require.Contains(t, b.row(t, id).LastError, "handler panicked: kaboom")
		require.NoError(t, proc.stop(t)) // Run returns once every outcome is written and counted
		require.EqualValues(t, 1, b.counter("processor.failed"))
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
		b.start(t, store, func(context.Context, leasing.Lease) error { return nil }, processor.Options{
			PollInterval: time.Hour, WorkSignal: processor.WakeChan(wake),
		})
		waitFor(t, func() bool { return claims.Load() == 1 }, "first claim at start")
		id := b.enqueue(t, 1)[0]
		wake <- struct{}{}
		waitFor(t, statusIs(b.mem, id, leasing.StatusCompleted), "woken, claimed and completed")
		// The claim at start found nothing, so the next waits PollInterval
		// (an hour): only the wake claimed the message. After that claim,
		// which found work, come the short re-polls (2 ... 64 ms, six).
		require.GreaterOrEqual(t, claims.Load(), int32(2))
		require.LessOrEqual(t, claims.Load(), int32(2+6))
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
	}, processor.Options{RetryPolicy: processor.RetryPolicy{MaxAttempts: 3}})
	waitFor(t, statusIs(b.mem, id, leasing.StatusDeadLettered), "dead-lettered")
	require.Zero(t, runs.Load(), "the handler must not run a fourth time")
	row := b.row(t, id)
	require.Equal(t, 4, row.AttemptCount)
	require.Contains(t, row.LastError, processor.ErrAttemptsExhausted.Error())
}

// goroutineID returns the calling goroutine's id, from its stack's first
// line ("goroutine 18 [running]:").
func goroutineID() string {
	buf := make([]byte, 64)
	buf = buf[:runtime.Stack(buf, false)]
	id, _, _ := strings.Cut(strings.TrimPrefix(string(buf), "goroutine "), " ")
	return id
}
