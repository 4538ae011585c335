package processor_test

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/leasestore/leasestore/internal/logtest"
	"github.com/leasestore/leasestore/leasing"
	"github.com/leasestore/leasestore/leasing/processor"
)

// writeCalls wraps a Store and records every outcome-write call: its kind
// ("complete", "fail", "dead_letter") and the ids it carried, in order.
type writeCalls struct {
	leasing.Store
	mu    sync.Mutex
	calls []writeCall
}

type writeCall struct {
	kind   string
	ids    []uuid.UUID
	errors []string // fail and dead letter
}

func (w *writeCalls) Complete(ctx context.Context, leases ...leasing.Lease) (leasing.WriteResult, error) {
	c := writeCall{kind: "complete"}
	for _, l := range leases {
		c.ids = append(c.ids, l.Message.ID)
	}
	w.add(c)
	return w.Store.Complete(ctx, leases...)
}

func (w *writeCalls) Fail(ctx context.Context, failures ...leasing.Failure) (leasing.WriteResult, error) {
	w.add(failureCall("fail", failures))
	return w.Store.Fail(ctx, failures...)
}

func (w *writeCalls) DeadLetter(ctx context.Context, failures ...leasing.Failure) (leasing.WriteResult, error) {
	w.add(failureCall("dead_letter", failures))
	return w.Store.DeadLetter(ctx, failures...)
}

func failureCall(kind string, failures []leasing.Failure) writeCall {
	c := writeCall{kind: kind}
	for _, f := range failures {
		c.ids = append(c.ids, f.Lease.Message.ID)
		c.errors = append(c.errors, f.Error)
	}
	return c
}

func (w *writeCalls) add(c writeCall) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.calls = append(w.calls, c)
}

func (w *writeCalls) all() []writeCall {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.calls)
}

// of returns the kinds of the write calls that carried id, in order.
func (w *writeCalls) of(id uuid.UUID) []string {
	var kinds []string
	for _, c := range w.all() {
		if slices.Contains(c.ids, id) {
			kinds = append(kinds, c.kind)
		}
	}
	return kinds
}

// batchCalls records the calls of a batch handler.
type batchCalls struct {
	mu    sync.Mutex
	calls [][]leasing.Lease
}

func (c *batchCalls) add(leases []leasing.Lease) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.calls = append(c.calls, slices.Clone(leases))
	return len(c.calls)
}

func (c *batchCalls) all() [][]leasing.Lease {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.calls)
}

func leaseIDs(leases []leasing.Lease) []uuid.UUID {
	ids := make([]uuid.UUID, len(leases))
	for i, l := range leases {
		ids[i] = l.Message.ID
	}
	return ids
}

// startBatch runs a batch processor on store (the bundle's Memory when
// nil), as start does for a single-message one.
func (b *processorBundle) startBatch(t *testing.T, store leasing.Store, h processor.BatchHandler, opts processor.Options) *running {
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
	p, err := processor.NewBatch(store, h, opts)
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

// allNil returns n nil outcomes: every message succeeded.
func allNil(n int) []error { return make([]error, n) }

// TestBatchProcessor: NewBatch's handler gets the leases of one claim per
// call and keeps every guarantee of the single-message form.
func TestBatchProcessor(t *testing.T) {
	t.Parallel()

	t.Run("NewBatch/BadInput", func(t *testing.T) {
		t.Parallel()
		mem, err := leasing.NewMemory(leasing.Inbox, leasing.MemoryOptions{})
		require.NoError(t, err)
		ok := func(_ context.Context, l []leasing.Lease) []error { return allNil(len(l)) }
		for name, c := range map[string]struct {
			store   processor.Store
			handler processor.BatchHandler
			opts    processor.Options
			field   string
		}{
			"NilStore":           {nil, ok, processor.Options{}, "store"},
			"NilHandler":         {mem, nil, processor.Options{}, "handler"},
			"NilStoreAndHandler": {nil, nil, processor.Options{}, "store"},
			"BatchTooLarge":      {mem, ok, processor.Options{BatchSize: leasing.MaxBatchSize + 1}, ""},
			"NegativeBatch":      {mem, ok, processor.Options{BatchSize: -1}, ""},
			"NegativeTimeout":    {mem, ok, processor.Options{HandlerTimeout: -2}, "handler timeout"},
		} {
			p, err := processor.NewBatch(c.store, c.handler, c.opts)
			require.Nil(t, p, name)
			var ae *leasing.ArgumentError
			require.ErrorAs(t, err, &ae, name)
			if c.field != "" {
				require.Equal(t, c.field, ae.Field, name)
			}
		}
		require.Empty(t, mem.Rows(), "nothing changed")
	})

	for _, q := range []leasing.Queue{leasing.Inbox, leasing.Outbox} {
		t.Run(string(q)+"/OneCallPerClaimWrittenTogether", func(t *testing.T) {
			t.Parallel()
			b := setupProcessor(t, q)
			ids := b.enqueue(t, 250)
			log := &writeCalls{Store: b.mem}
			var calls batchCalls
			var running, most atomic.Int32
			var topicsMu sync.Mutex
			topics := map[string]int{} // of the messages the publisher got, asserted on the test goroutine
			record := func(_ context.Context, leases []leasing.Lease) []error {
				n := running.Add(1)
				defer running.Add(-1)
				for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
				}
				calls.add(leases)
				time.Sleep(time.Millisecond) // the broker's round trip, so that calls overlap
				return allNil(len(leases))
			}
			handler := processor.BatchHandler(record)
			if q == leasing.Outbox {
				publish := processor.BatchPublisher(func(ctx context.Context, msgs []leasing.Message) []error {
					leases := make([]leasing.Lease, len(msgs))
					topicsMu.Lock()
					for i, m := range msgs {
						topics[m.Topic]++
						leases[i] = leasing.Lease{Message: m}
					}
					topicsMu.Unlock()
					return record(ctx, leases)
				})
				handler = publish.Handler()
			}
			proc := b.startBatch(t, log, handler, processor.Options{BatchSize: 100, Concurrency: 2})
			for _, id := range ids {
				waitFor(t, statusIs(b.mem, id, q.Succeeded()), "succeeded")
			}
			require.NoError(t, proc.stop(t))

			var delivered []uuid.UUID
			for _, c := range calls.all() {
				require.NotEmpty(t, c)
				require.LessOrEqual(t, len(c), 100, "at most BatchSize a call")
				delivered = append(delivered, leaseIDs(c)...)
				// The outcomes of one call go out in one write call.
				var carried []uuid.UUID
				for _, w := range log.all() {
					if slices.Contains(w.ids, c[0].Message.ID) {
						require.Equal(t, "complete", w.kind)
						carried = w.ids
					}
				}
				for _, id := range leaseIDs(c) {
					require.Contains(t, carried, id, "written with the rest of its call")
				}
			}
			require.ElementsMatch(t, ids, delivered, "each message delivered once")
			if q == leasing.Outbox {
				topicsMu.Lock()
				require.Equal(t, map[string]int{"orders": 250}, topics, "the publisher gets each message's topic")
				topicsMu.Unlock()
			}
			require.GreaterOrEqual(t, len(calls.all()), 3)
			require.LessOrEqual(t, most.Load(), int32(2), "Concurrency bounds the calls running at once")
			b.requireCounters(t, map[string]int64{
				"processor.leases_acquired": 250, processor.SucceededCounter(q): 250, "processor.failed": 0,
				"processor.lease_lost": 0, "processor.persist_skipped": 0, "processor.persist_rejected": 0,
			})
			records := b.meter.Records(processor.MetricName(q, "processor.handler_duration"))
			require.Len(t, records, len(calls.all()), "handler_duration: one record per call")
		})
	}

	t.Run("MixedOutcomes/RetriedThenDeadLettered", func(t *testing.T) {
		t.Parallel()
		b := setupProcessor(t, leasing.Inbox)
		ids := b.enqueue(t, 4)
		log := &writeCalls{Store: b.mem}
		var calls batchCalls
		b.startBatch(t, log, func(_ context.Context, leases []leasing.Lease) []error {
			call := calls.add(leases)
			errs := make([]error, len(leases))
			for i, l := range leases {
				if l.Message.ID == ids[1] || l.Message.ID == ids[3] {
					errs[i] = fmt.Errorf("rejected, call %d", call)
				}
			}
			return errs
		}, processor.Options{BatchSize: 10, RetryPolicy: processor.RetryPolicy{MaxAttempts: 2, InitialDelay: time.Minute}})

		for _, i := range []int{1, 3} {
			waitFor(t, statusIs(b.mem, ids[i], leasing.StatusFailed), "failed")
			r := b.row(t, ids[i])
			require.Equal(t, "rejected, call 1", r.LastError)
			require.Equal(t, b.clock.Now().Add(time.Minute), r.VisibleAfter, "due after the backoff")
		}
		for _, i := range []int{0, 2} {
			waitFor(t, statusIs(b.mem, ids[i], leasing.StatusCompleted), "completed")
		}
		b.clock.Advance(time.Minute)
		for _, i := range []int{1, 3} {
			waitFor(t, statusIs(b.mem, ids[i], leasing.StatusDeadLettered), "dead-lettered on the last attempt")
			r := b.row(t, ids[i])
			require.Equal(t, "rejected, call 2", r.LastError)
			require.Equal(t, 2, r.AttemptCount)
		}
		got := calls.all()
		require.Len(t, got, 2)
		require.Equal(t, ids, leaseIDs(got[0]), "one call, in claim order")
		require.Equal(t, []uuid.UUID{ids[1], ids[3]}, leaseIDs(got[1]), "the retry takes the failed ones")
		var kinds []string
		for _, w := range log.all() {
			kinds = append(kinds, w.kind)
			switch w.kind {
			case "complete":
				require.Equal(t, []uuid.UUID{ids[0], ids[2]}, w.ids)
			default:
				require.Equal(t, []uuid.UUID{ids[1], ids[3]}, w.ids)
			}
		}
		require.ElementsMatch(t, []string{"complete", "fail", "dead_letter"}, kinds, "one write call per kind")
		waitFor(t, func() bool { return b.counter("processor.dead_lettered") == 2 }, "counted")
		b.requireCounters(t, map[string]int64{
			"processor.leases_acquired": 6, "processor.succeeded": 2, "processor.failed": 2, "processor.dead_lettered": 2,
		})
	})

	t.Run("Heartbeat/RenewsEveryLeaseOfTheCall", func(t *testing.T) {
		t.Parallel()
		b := setupProcessor(t, leasing.Inbox)
		ids := b.enqueue(t, 3)
		t0 := b.clock.Now()
		started, release := make(chan struct{}), make(chan struct{})
		r := b.startBatch(t, nil, func(ctx context.Context, leases []leasing.Lease) []error {
			close(started)
			<-release
			return allNil(len(leases))
		}, processor.Options{LeaseDuration: 30 * time.Second})
		receive(t, started, "the call started")
		// Two steps of 20s take the store clock past the first expiry; the
		// heartbeat renews every lease of the running call after each.
		for _, now := range []time.Time{t0.Add(20 * time.Second), t0.Add(40 * time.Second)} {
			b.clock.Advance(20 * time.Second)
			for _, id := range ids {
				waitFor(t, func() bool {
					exp := b.peek(id).LeaseExpiresAt
					return exp != nil && exp.Equal(now.Add(30*time.Second))
				}, "renewed")
			}
			require.Empty(t, b.claimAsOther(t), "renewed leases are not reclaimed")
		}
		close(release)
		for _, id := range ids {
			waitFor(t, statusIs(b.mem, id, leasing.StatusCompleted), "completed")
			require.Equal(t, int64(1), b.row(t, id).LeaseGeneration, "never reclaimed")
		}
		require.NoError(t, r.stop(t))
		b.requireCounters(t, map[string]int64{"processor.lease_lost": 0, "processor.succeeded": 3})
	})

	t.Run("LostLease/SkippedOthersWritten", func(t *testing.T) {
		t.Parallel()
		b := setupProcessor(t, leasing.Inbox)
		ids := b.enqueue(t, 3)
		lost := ids[1]
		store := &storeHooks{Store: b.mem}
		store.renew = func(ctx context.Context, d time.Duration, leases ...leasing.Lease) (leasing.RenewResult, error) {
			// The store reports one lease lost: reclaimed by another worker.
			var keep []leasing.Lease
			for _, l := range leases {
				if l.Message.ID != lost {
					keep = append(keep, l)
				}
			}
			res, err := b.mem.Renew(ctx, d, keep...)
			if len(keep) < len(leases) {
				res.Lost = append(res.Lost, lost)
			}
			return res, err
		}
		log := &writeCalls{Store: store}
		release := make(chan struct{})
		ctxErr := make(chan error, 1)
		r := b.startBatch(t, log, func(ctx context.Context, leases []leasing.Lease) []error {
			<-release
			ctxErr <- ctx.Err()
			return allNil(len(leases)) // claims success for the lost one too
		}, processor.Options{BatchSize: 10})
		waitFor(t, func() bool { return b.counter("processor.lease_lost") == 1 }, "one lease lost")
		close(release)
		require.NoError(t, receive(t, ctxErr, "the call returned"), "a lease lost among others does not cancel the call")
		for _, id := range []uuid.UUID{ids[0], ids[2]} {
			waitFor(t, statusIs(b.mem, id, leasing.StatusCompleted), "the held ones are written")
		}
		waitFor(t, func() bool { return b.counter("processor.persist_skipped") == 1 }, "skipped")
		require.Empty(t, log.of(lost), "the lost lease's outcome is not written")
		require.Equal(t, leasing.StatusProcessing, b.row(t, lost).Status)
		require.NoError(t, r.stop(t))
		b.requireCounters(t, map[string]int64{
			"processor.succeeded": 2, "processor.lease_lost": 1, "processor.persist_skipped": 1, "processor.persist_rejected": 0,
		})
	})

	t.Run("LostLease/AllLostCancelsCall", func(t *testing.T) {
		t.Parallel()
		b := setupProcessor(t, leasing.Inbox)
		ids := b.enqueue(t, 2)
		cause := make(chan error, 1)
		log := &writeCalls{Store: b.mem}
		b.startBatch(t, log, func(ctx context.Context, leases []leasing.Lease) []error {
			<-ctx.Done()
			cause <- context.Cause(ctx)
			return allNil(len(leases))
		}, processor.Options{BatchSize: 10, Concurrency: 1, LeaseDuration: 30 * time.Second})
		waitFor(t, func() bool { return b.counter("processor.leases_acquired") == 2 }, "claimed")
		b.clock.Advance(31 * time.Second)
		require.Len(t, b.claimAsOther(t), 2)
		require.ErrorIs(t, receive(t, cause, "the call's context ended"), leasing.ErrLeaseLost)
		waitFor(t, func() bool { return b.counter("processor.persist_skipped") == 2 }, "both skipped")
		for _, id := range ids {
			require.Empty(t, log.of(id))
			require.Equal(t, "other", b.row(t, id).LeaseOwner)
		}
	})

	t.Run("Panic/FailsWholeBatchThenRetried", func(t *testing.T) {
		t.Parallel()
		b := setupProcessor(t, leasing.Inbox)
		ids := b.enqueue(t, 3)
		rec := logtest.New(slog.LevelDebug)
		var calls atomic.Int32
		r := b.startBatch(t, nil, func(_ context.Context, leases []leasing.Lease) []error {
			if calls.Add(1) == 1 {
				panic("boom")
			}
			return allNil(len(leases))
		}, processor.Options{Logger: rec.Logger(), RetryPolicy: processor.RetryPolicy{InitialDelay: time.Second}})
		for _, id := range ids {
			waitFor(t, statusIs(b.mem, id, leasing.StatusFailed), "failed by the panic")
			row := b.row(t, id)
			require.True(t, strings.HasPrefix(row.LastError, "processor: handler panicked: boom\n"), row.LastError)
			require.Contains(t, row.LastError, "goroutine", "with the stack")
		}
		ev := requireEvent(t, rec, r.p, leasing.Inbox, "handler panicked", slog.LevelError)
		require.Equal(t, "boom", ev.Str(processor.LogKeyError))
		require.EqualValues(t, 3, ev.Attrs["count"].Int64())
		require.Len(t, rec.Find("handler panicked"), 1, "one record for the call")
		b.clock.Advance(time.Second)
		for _, id := range ids {
			waitFor(t, statusIs(b.mem, id, leasing.StatusCompleted), "the retry succeeds")
		}
		require.NoError(t, r.stop(t))
		b.requireCounters(t, map[string]int64{"processor.failed": 3, "processor.succeeded": 3, "processor.dead_lettered": 0})
		outcomes := map[string]int{}
		for _, p := range b.meter.Records(processor.MetricName(leasing.Inbox, "processor.handler_duration")) {
			v, _ := p.Attributes.Value("result")
			outcomes[v.AsString()]++
		}
		require.Equal(t, map[string]int{"error": 1, "success": 1}, outcomes)
	})

	t.Run("WrongLength/FailsWholeBatchThenDeadLetters", func(t *testing.T) {
		t.Parallel()
		b := setupProcessor(t, leasing.Inbox)
		ids := b.enqueue(t, 3)
		rec := logtest.New(slog.LevelDebug)
		var calls atomic.Int32
		r := b.startBatch(t, nil, func(_ context.Context, leases []leasing.Lease) []error {
			if calls.Add(1) == 1 {
				return allNil(len(leases) - 1) // one short
			}
			return nil
		}, processor.Options{Logger: rec.Logger(), RetryPolicy: processor.RetryPolicy{MaxAttempts: 2, InitialDelay: time.Second}})
		for _, id := range ids {
			waitFor(t, statusIs(b.mem, id, leasing.StatusFailed), "failed: the handler's result is unusable")
			require.Equal(t, processor.ErrBatchLength.Error()+": 2 for 3 messages", b.row(t, id).LastError)
		}
		ev := requireEvent(t, rec, r.p, leasing.Inbox, "batch handler returned the wrong number of outcomes", slog.LevelError)
		require.EqualValues(t, 2, ev.Attrs["outcomes"].Int64())
		b.clock.Advance(time.Second)
		for _, id := range ids {
			waitFor(t, statusIs(b.mem, id, leasing.StatusDeadLettered), "a nil result is the wrong length too")
			require.Equal(t, processor.ErrBatchLength.Error()+": 0 for 3 messages", b.row(t, id).LastError)
		}
		require.NoError(t, r.stop(t))
		b.requireCounters(t, map[string]int64{"processor.failed": 3, "processor.dead_lettered": 3, "processor.succeeded": 0})
	})

	t.Run("Timeout/WholeBatchFailedAtOnceLateReturnDropped", func(t *testing.T) {
		t.Parallel()
		const timeout = 20 * time.Millisecond
		b := setupProcessor(t, leasing.Inbox)
		ids := b.enqueue(t, 3)
		log := &writeCalls{Store: b.mem}
		release := make(chan struct{})
		unblock := sync.OnceFunc(func() { close(release) })
		cause := make(chan error, 1)
		r := b.startBatch(t, log, func(ctx context.Context, leases []leasing.Lease) []error {
			<-ctx.Done()
			cause <- context.Cause(ctx)
			<-release // ignores ctx past the timeout
			return allNil(len(leases))
		}, processor.Options{HandlerTimeout: timeout, RetryPolicy: processor.RetryPolicy{InitialDelay: time.Minute}})
		t.Cleanup(unblock)
		c := receive(t, cause, "the call's context ended at the timeout")
		require.ErrorIs(t, c, processor.ErrHandlerTimeout)
		for _, id := range ids {
			waitFor(t, statusIs(b.mem, id, leasing.StatusFailed), "failed at the timeout while the call still runs")
			row := b.row(t, id)
			require.Equal(t, c.Error(), row.LastError)
			require.Equal(t, b.clock.Now().Add(time.Minute), row.VisibleAfter)
		}
		writes := log.all()
		require.Len(t, writes, 1, "one write call for the batch")
		require.Equal(t, "fail", writes[0].kind)
		require.ElementsMatch(t, ids, writes[0].ids)
		unblock()
		require.NoError(t, r.stop(t))
		require.Len(t, log.all(), 1, "the late success is not written")
		b.requireCounters(t, map[string]int64{"processor.failed": 3, "processor.succeeded": 0, "processor.persist_skipped": 0})
	})

	t.Run("Shutdown/GraceThenCancelFailsWithoutDelay", func(t *testing.T) {
		t.Parallel()
		b := setupProcessor(t, leasing.Inbox)
		ids := b.enqueue(t, 2)
		started := make(chan struct{})
		cause := make(chan error, 1)
		r := b.startBatch(t, nil, func(ctx context.Context, leases []leasing.Lease) []error {
			close(started)
			<-ctx.Done()
			cause <- context.Cause(ctx)
			return repeat(len(leases), ctx.Err())
		}, processor.Options{ShutdownGrace: 20 * time.Millisecond, RetryPolicy: processor.RetryPolicy{MaxAttempts: 1}})
		receive(t, started, "the call started")
		r.cancel()
		require.ErrorIs(t, receive(t, cause, "the call's context ended at shutdown"), processor.ErrShutdown)
		require.NoError(t, r.stop(t))
		for _, id := range ids {
			row := b.row(t, id)
			require.Equal(t, leasing.StatusFailed, row.Status, "not dead-lettered although attempts are spent")
			require.Equal(t, b.clock.Now(), row.VisibleAfter, "due again at once")
			require.True(t, strings.HasPrefix(row.LastError, processor.ErrShutdown.Error()), row.LastError)
		}
		b.requireCounters(t, map[string]int64{"processor.failed": 2, "processor.dead_lettered": 0})
	})

	t.Run("Shutdown/CallFinishingInGraceIsWritten", func(t *testing.T) {
		t.Parallel()
		b := setupProcessor(t, leasing.Inbox)
		ids := b.enqueue(t, 2)
		started, release := make(chan struct{}), make(chan struct{})
		r := b.startBatch(t, nil, func(ctx context.Context, leases []leasing.Lease) []error {
			close(started)
			<-release
			return allNil(len(leases))
		}, processor.Options{})
		receive(t, started, "the call started")
		stopped := make(chan error, 1)
		go func() { stopped <- r.stop(t) }()
		close(release)
		require.NoError(t, <-stopped)
		for _, id := range ids {
			require.Equal(t, leasing.StatusCompleted, b.row(t, id).Status)
		}
	})

	t.Run("AttemptsExhausted/DeadLetteredWithoutCall", func(t *testing.T) {
		t.Parallel()
		b := setupProcessor(t, leasing.Inbox)
		spent := b.enqueue(t, 1)[0]
		// A worker that crashes twice: two attempts without an outcome.
		for range 2 {
			l, err := b.mem.Claim(context.Background(), leasing.ClaimRequest{Owner: "crashed", BatchSize: 1, LeaseFor: time.Second})
			require.NoError(t, err)
			require.Len(t, l, 1)
			b.clock.Advance(2 * time.Second)
		}
		fresh := b.enqueue(t, 1)[0]
		var calls batchCalls
		b.startBatch(t, nil, func(_ context.Context, leases []leasing.Lease) []error {
			calls.add(leases)
			return allNil(len(leases))
		}, processor.Options{RetryPolicy: processor.RetryPolicy{MaxAttempts: 2}})
		waitFor(t, statusIs(b.mem, spent, leasing.StatusDeadLettered), "dead-lettered")
		waitFor(t, statusIs(b.mem, fresh, leasing.StatusCompleted), "completed")
		require.True(t, strings.HasPrefix(b.row(t, spent).LastError, processor.ErrAttemptsExhausted.Error()), b.row(t, spent).LastError)
		got := calls.all()
		require.Len(t, got, 1)
		require.Equal(t, []uuid.UUID{fresh}, leaseIDs(got[0]), "the spent message is not handed to the handler")
	})
}

func repeat(n int, err error) []error {
	errs := make([]error, n)
	for i := range errs {
		errs[i] = err
	}
	return errs
}
