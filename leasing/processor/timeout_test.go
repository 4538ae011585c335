package processor_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/leasestore/leasestore/leasing"
	"github.com/leasestore/leasestore/leasing/processor"
)

// writeLog wraps a Store and records, per message, every lease the
// processor renewed and every outcome write it sent (complete, fail, dead
// letter), in order.
type writeLog struct {
	leasing.Store
	mu      sync.Mutex
	renews  int                    // Renew calls
	renewed map[uuid.UUID]int      // Renew calls that carried the message
	writes  map[uuid.UUID][]string // "complete", "fail", "dead_letter"
	errors  map[uuid.UUID][]string // the error text of each fail and dead letter
}

func newWriteLog(s leasing.Store) *writeLog {
	return &writeLog{Store: s, renewed: map[uuid.UUID]int{}, writes: map[uuid.UUID][]string{}, errors: map[uuid.UUID][]string{}}
}

func (w *writeLog) Renew(ctx context.Context, d time.Duration, leases ...leasing.Lease) (leasing.RenewResult, error) {
	w.mu.Lock()
	w.renews++
	for _, l := range leases {
		w.renewed[l.Message.ID]++
	}
	w.mu.Unlock()
	return w.Store.Renew(ctx, d, leases...)
}

func (w *writeLog) Complete(ctx context.Context, leases ...leasing.Lease) (leasing.WriteResult, error) {
	w.mu.Lock()
	for _, l := range leases {
		w.writes[l.Message.ID] = append(w.writes[l.Message.ID], "complete")
	}
	w.mu.Unlock()
	return w.Store.Complete(ctx, leases...)
}

func (w *writeLog) Fail(ctx context.Context, failures ...leasing.Failure) (leasing.WriteResult, error) {
	w.record("fail", failures)
	return w.Store.Fail(ctx, failures...)
}

func (w *writeLog) DeadLetter(ctx context.Context, failures ...leasing.Failure) (leasing.WriteResult, error) {
	w.record("dead_letter", failures)
	return w.Store.DeadLetter(ctx, failures...)
}

func (w *writeLog) record(kind string, failures []leasing.Failure) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, f := range failures {
		id := f.Lease.Message.ID
		w.writes[id] = append(w.writes[id], kind)
		w.errors[id] = append(w.errors[id], f.Error)
	}
}

// of returns the writes sent for id and how many renews carried it.
func (w *writeLog) of(id uuid.UUID) (writes []string, renewed int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.writes[id]), w.renewed[id]
}

func (w *writeLog) renewCalls() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.renews
}

// TestProcessorHandlerTimeout: a handler that runs past HandlerTimeout is
// cancelled with ErrHandlerTimeout, its attempt written as failed, retried
// and dead-lettered per the policy; its lease is no longer renewed, even
// while the handler ignores its context, and what it returns later is not
// written.
func TestProcessorHandlerTimeout(t *testing.T) {
	t.Parallel()
	// Long enough for what must beat it: next's call, which returns at
	// once, and the shutdown's cancel of a call just started. At 20 ms a
	// loaded machine could time them out first.
	const timeout = 500 * time.Millisecond
	timedOut := fmt.Sprintf("processor: handler timed out after %s", timeout)

	t.Run("HonoursContext/FailedThenRetriedThenDeadLettered", func(t *testing.T) {
		t.Parallel()
		b := setupProcessor(t, leasing.Inbox)
		id := b.enqueue(t, 1)[0]
		log := newWriteLog(b.mem)
		causes := make(chan error, 2)
		proc := b.start(t, log, func(ctx context.Context, _ leasing.Lease) error {
			<-ctx.Done() // hung until the processor gives up on it
			causes <- context.Cause(ctx)
			return ctx.Err()
		}, processor.Options{
			HandlerTimeout: timeout,
			RetryPolicy:    processor.RetryPolicy{MaxAttempts: 2, InitialDelay: time.Minute},
		})

		cause := <-causes
		require.ErrorIs(t, cause, processor.ErrHandlerTimeout)
		require.EqualError(t, cause, timedOut)
		waitFor(t, statusIs(b.mem, id, leasing.StatusFailed), "failed by the timeout")
		r := b.row(t, id)
		require.Equal(t, timedOut, r.LastError)
		require.Equal(t, 1, r.AttemptCount)
		require.Nil(t, r.LeaseExpiresAt, "the lease ended with the failure")
		require.Equal(t, b.clock.Now().Add(time.Minute), r.VisibleAfter, "retried after the policy's backoff")

		b.clock.Advance(time.Minute)
		require.ErrorIs(t, <-causes, processor.ErrHandlerTimeout, "the retry times out too")
		waitFor(t, statusIs(b.mem, id, leasing.StatusDeadLettered), "dead-lettered on the last attempt")
		r = b.row(t, id)
		require.Equal(t, timedOut, r.LastError)
		require.Equal(t, 2, r.AttemptCount)
		require.NoError(t, proc.stop(t))
		writes, _ := log.of(id)
		require.Equal(t, []string{"fail", "dead_letter"}, writes, "one write per attempt")
		b.requireCounters(t, map[string]int64{
			"processor.leases_acquired": 2, "processor.failed": 1, "processor.dead_lettered": 1,
			"processor.succeeded": 0, "processor.lease_lost": 0, "processor.persist_skipped": 0, "processor.persist_rejected": 0,
		})
	})

	t.Run("IgnoresContext/FailedAtTimeoutNotRenewedNotWrittenTwice", func(t *testing.T) {
		t.Parallel()
		b := setupProcessor(t, leasing.Inbox)
		ids := b.enqueue(t, 2)
		hung, next := ids[0], ids[1]
		log := newWriteLog(b.mem)
		release := make(chan struct{})
		unblock := sync.OnceFunc(func() { close(release) })
		var released atomic.Bool
		var startedAfterRelease sync.Map // message id -> whether it started after release
		proc := b.start(t, log, func(ctx context.Context, l leasing.Lease) error {
			startedAfterRelease.Store(l.Message.ID, released.Load())
			if l.Message.ID == hung {
				<-release // ignores ctx
				return nil
			}
			return nil
		}, processor.Options{
			// One slot, both claimed at once: next waits for the slot.
			HandlerTimeout: timeout, Concurrency: 1, BatchSize: 2,
			// Shorter than the lease, so that stepping the clock past it
			// leaves next's renewed lease live.
			RetryPolicy: processor.RetryPolicy{InitialDelay: 10 * time.Second},
		})
		t.Cleanup(unblock) // runs before the processor's stop, should the test fail

		waitFor(t, statusIs(b.mem, hung, leasing.StatusFailed), "failed at the timeout while the handler still runs")
		r := b.row(t, hung)
		require.Equal(t, timedOut, r.LastError)
		require.Nil(t, r.LeaseExpiresAt)
		writes, renewedAtFail := log.of(hung)
		require.Equal(t, []string{"fail"}, writes)

		// The heartbeat goes on (the renews carry the waiting message and
		// nothing else) but never renews the timed-out lease again.
		mark := log.renewCalls()
		waitFor(t, func() bool { return log.renewCalls() >= mark+3 }, "three more heartbeats")
		_, renewed := log.of(hung)
		require.LessOrEqual(t, renewed, renewedAtFail+1, "at most a renew already on its way at the write")
		mark, renewedAfter := log.renewCalls(), renewed
		waitFor(t, func() bool { return log.renewCalls() >= mark+3 }, "three more heartbeats")
		_, renewed = log.of(hung)
		require.Equal(t, renewedAfter, renewed, "never renewed after its failure was written")
		require.Equal(t, leasing.StatusProcessing, b.row(t, next).Status, "claimed, waiting: the slot stays busy")

		// The row is retryable: another worker takes it after the backoff,
		// although the first handler still runs.
		b.clock.Advance(10 * time.Second)
		others := b.claimAsOther(t)
		require.Len(t, others, 1)
		require.Equal(t, hung, others[0].Message.ID)

		released.Store(true)
		unblock()
		waitFor(t, statusIs(b.mem, next, leasing.StatusCompleted), "the freed slot runs the next message")
		afterRelease, _ := startedAfterRelease.Load(next)
		require.Equal(t, true, afterRelease, "the next message waited for the hung handler to return")
		require.NoError(t, proc.stop(t))
		writes, _ = log.of(hung)
		require.Equal(t, []string{"fail"}, writes, "the late nil return is not written")
		r = b.row(t, hung)
		require.Equal(t, others[0].Owner, r.LeaseOwner, "the other worker's lease is untouched")
		require.Equal(t, leasing.StatusProcessing, r.Status)
		b.requireCounters(t, map[string]int64{
			"processor.failed": 1, "processor.succeeded": 1, "processor.lease_lost": 0,
			"processor.persist_skipped": 0, "processor.persist_rejected": 0,
		})
	})

	t.Run("ReturnsAtTheTimeout/OneWriteEach", func(t *testing.T) {
		t.Parallel()
		// Handlers that return about when their timeout fires: whichever
		// comes first decides, and every attempt gets exactly one write.
		mem, err := leasing.NewMemory(leasing.Inbox, leasing.MemoryOptions{})
		require.NoError(t, err)
		const n = 100
		msgs := make([]leasing.NewMessage, n)
		res, err := mem.Enqueue(context.Background(), msgs...)
		require.NoError(t, err)
		b := setupProcessor(t, leasing.Inbox)
		log := newWriteLog(mem)
		var calls atomic.Int64
		proc := b.start(t, log, func(ctx context.Context, _ leasing.Lease) error {
			d := time.Duration(calls.Add(1)%3) * time.Millisecond
			time.Sleep(d) // ignores ctx: 0, 1 or 2ms against a 1ms timeout
			return ctx.Err()
		}, processor.Options{
			HandlerTimeout: time.Millisecond, Concurrency: 8, BatchSize: 8,
			RetryPolicy: processor.RetryPolicy{MaxAttempts: 1},
		})
		for _, id := range res.IDs {
			waitFor(t, func() bool {
				r, err := mem.Get(context.Background(), id)
				return err == nil && r.Status.Terminal()
			}, "finished")
		}
		require.NoError(t, proc.stop(t))
		for _, id := range res.IDs {
			writes, _ := log.of(id)
			require.Len(t, writes, 1, "message %s: %v", id, writes)
		}
		require.EqualValues(t, n, calls.Load())
		b.requireCounters(t, map[string]int64{
			"processor.leases_acquired": n, "processor.failed": 0,
			"processor.lease_lost": 0, "processor.persist_skipped": 0, "processor.persist_rejected": 0,
		})
		require.EqualValues(t, n, b.counter("processor.succeeded")+b.counter("processor.dead_lettered"))
	})

	t.Run("EachCallAtItsOwnDeadline", func(t *testing.T) {
		t.Parallel()
		// One timer watches every call: when it fires for the first call,
		// a call that started later runs on until its own deadline, and a
		// call started once the others returned times out too. The second
		// call starts timeout/2 after the first, so a timer that fires late
		// by that much takes both calls at once: 500 ms, not the 150 ms of
		// a 300 ms timeout, which a loaded machine could be late by.
		const timeout = time.Second
		b := setupProcessor(t, leasing.Inbox)
		first := b.enqueue(t, 1)[0]
		firstStarted, firstEnded := make(chan struct{}), make(chan struct{})
		secondRan := make(chan error, 1) // the second call's ctx.Err() once the first call ended
		causes := make(chan error, 3)
		var calls atomic.Int64 // each message is enqueued once the calls before it started
		proc := b.start(t, nil, func(ctx context.Context, _ leasing.Lease) error {
			switch calls.Add(1) {
			case 1:
				close(firstStarted)
				defer close(firstEnded)
			case 2:
				<-firstEnded
				secondRan <- ctx.Err()
			}
			<-ctx.Done()
			causes <- context.Cause(ctx)
			return ctx.Err()
		}, processor.Options{HandlerTimeout: timeout, RetryPolicy: processor.RetryPolicy{MaxAttempts: 1}})

		<-firstStarted
		time.Sleep(timeout / 2)
		second := b.enqueue(t, 1)[0]
		require.ErrorIs(t, receive(t, causes, "the first call's cause"), processor.ErrHandlerTimeout, "the first call times out")
		require.NoError(t, receive(t, secondRan, "the second call"), "the second call runs on past the first call's deadline")
		require.ErrorIs(t, receive(t, causes, "the second call's cause"), processor.ErrHandlerTimeout, "the second call times out at its own deadline")
		waitFor(t, statusIs(b.mem, second, leasing.StatusDeadLettered), "the second call's timeout is written")
		third := b.enqueue(t, 1)[0]
		require.ErrorIs(t, receive(t, causes, "the third call's cause"), processor.ErrHandlerTimeout, "a call started once the others returned times out")
		waitFor(t, statusIs(b.mem, third, leasing.StatusDeadLettered), "the third call's timeout is written")
		require.NoError(t, proc.stop(t))
		require.Equal(t, leasing.StatusDeadLettered, b.row(t, first).Status)
	})

	t.Run("NotHeldUpByAnotherCallsWrite", func(t *testing.T) {
		t.Parallel()
		// A's timeout outcome waits for a writer whose Complete waits for
		// what B holds (as a row lock of B's open transaction would) until
		// B's context ends: B's own timeout must still cancel it on time,
		// or A, the writer and B wait on each other until the write gives
		// up.
		const timeout = 300 * time.Millisecond
		b := setupProcessor(t, leasing.Inbox)
		bReleased := make(chan struct{}) // closed when B's handler returns
		store := &storeHooks{Store: b.mem, complete: func(ctx context.Context, leases ...leasing.Lease) (leasing.WriteResult, error) {
			select {
			case <-bReleased:
			case <-ctx.Done():
				return leasing.WriteResult{}, ctx.Err()
			}
			return b.mem.Complete(ctx, leases...)
		}}
		aStarted, bStarted := make(chan struct{}), make(chan struct{})
		bCancelled := make(chan error, 1)
		var calls atomic.Int64
		proc := b.start(t, store, func(ctx context.Context, _ leasing.Lease) error {
			switch calls.Add(1) {
			case 1: // A
				close(aStarted)
			case 2: // B
				close(bStarted)
				defer close(bReleased)
				<-ctx.Done()
				bCancelled <- context.Cause(ctx)
				return ctx.Err()
			default: // quick ones, through the third slot
				return nil
			}
			<-ctx.Done()
			return ctx.Err()
		}, processor.Options{
			HandlerTimeout: timeout, Concurrency: 3, BatchSize: 4, LeaseDuration: 2 * time.Second,
			RetryPolicy: processor.RetryPolicy{MaxAttempts: 1},
		})

		b.enqueue(t, 1)
		<-aStarted
		b.enqueue(t, 1)
		<-bStarted
		// The writer's first Complete waits for B; the rest fill its queue
		// (8 outcomes per slot) before A's deadline.
		b.enqueue(t, 40)
		select {
		case cause := <-bCancelled:
			require.ErrorIs(t, cause, processor.ErrHandlerTimeout)
		case <-time.After(timeout + time.Second):
			require.FailNow(t, "B not cancelled within a second of its HandlerTimeout")
		}
		require.NoError(t, proc.stop(t))
	})

	t.Run("PastTimeoutDuringShutdown/FailsOnceWithoutDelay", func(t *testing.T) {
		t.Parallel()
		// Cancelled by the shutdown first, then past its timeout while it
		// ignores its context: written once, at the timeout, as a shutdown
		// failure (due at once, never dead-lettered); the late return is
		// dropped.
		b := setupProcessor(t, leasing.Inbox)
		id := b.enqueue(t, 1)[0]
		log := newWriteLog(b.mem)
		started, release := make(chan struct{}), make(chan struct{})
		causes := make(chan error, 1)
		r := b.start(t, log, func(ctx context.Context, _ leasing.Lease) error {
			close(started)
			<-ctx.Done()
			causes <- context.Cause(ctx)
			<-release
			return errors.New("late")
		}, processor.Options{
			HandlerTimeout: timeout, ShutdownGrace: time.Millisecond,
			RetryPolicy: processor.RetryPolicy{MaxAttempts: 1},
		})
		<-started
		r.cancel()
		require.ErrorIs(t, <-causes, processor.ErrShutdown)
		waitFor(t, statusIs(b.mem, id, leasing.StatusFailed), "failed at the timeout while the handler still runs")
		close(release)
		require.NoError(t, r.stop(t))
		row := b.row(t, id)
		require.Equal(t, leasing.StatusFailed, row.Status)
		require.Equal(t, processor.ErrShutdown.Error()+": "+timedOut, row.LastError)
		require.Equal(t, b.clock.Now(), row.VisibleAfter, "due again at once")
		writes, _ := log.of(id)
		require.Equal(t, []string{"fail"}, writes)
	})
}
