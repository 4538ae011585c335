package processor_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/leasestore/leasestore/leasing"
	"github.com/leasestore/leasestore/leasing/processor"
)

// testPersist: the outcome writer.
func testPersist(t *testing.T) {
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
		b.start(t, store, func(context.Context, leasing.Lease) error { return nil }, processor.Options{Concurrency: 1})
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
		b.start(t, store, func(context.Context, leasing.Lease) error { return nil }, processor.Options{
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
		// finds 8 x Concurrency waiting keeps its slot until the writer
		// takes it, so the processor stops claiming instead of leasing the
		// whole queue: here the blocked write took at most 16 waiting + 2
		// from held workers, as many wait for the next write, and the
		// claims in flight when the workers stopped (two at most, of one
		// lease each) return leases that wait for a slot.
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
			processor.Options{Concurrency: 2, BatchSize: 1})
		t.Cleanup(letAnswer) // runs before the processor's stop, also when the test fails
		waitFor(t, func() bool { return claimed.Load() >= 18 }, "claims until the writer's queue is full")
		time.Sleep(100 * time.Millisecond) // room for claims that should not happen
		require.LessOrEqual(t, claimed.Load(), int64(36+2), "leases claimed while the store did not answer")
		letAnswer()
		for _, id := range ids {
			waitFor(t, statusIs(b.mem, id, leasing.StatusCompleted), "completed once the store answers")
		}
	})

	t.Run("Persist/HeldKeyDelaysOnlyItsOwnOutcomes", func(t *testing.T) {
		// A completion that finishes a key's head locks the key's row; an
		// open producer transaction that enqueued to the key holds it. The
		// write of a batch with that head times out as a whole; the
		// writer then writes each key's outcomes on their own, so the
		// unkeyed messages and the other key complete, and only the held
		// key's head is retried (and given up here: the row stays held).
		t.Parallel()
		b := setupProcessor(t, leasing.Outbox)
		msgs := []leasing.NewMessage{
			{Topic: "t", OrderingKey: "held"}, {Topic: "t"}, {Topic: "t", OrderingKey: "free"}, {Topic: "t"},
		}
		res, err := b.mem.Enqueue(context.Background(), msgs...)
		require.NoError(t, err)
		held, others := res.IDs[0], res.IDs[1:]
		store := &storeHooks{Store: b.mem}
		var mu sync.Mutex
		var calls [][]string // keys of each Complete call, "" for unkeyed
		store.complete = func(ctx context.Context, leases ...leasing.Lease) (leasing.WriteResult, error) {
			keys := make([]string, len(leases))
			blocked := false
			for i, l := range leases {
				keys[i] = l.Message.OrderingKey
				blocked = blocked || l.Message.OrderingKey == "held"
			}
			mu.Lock()
			calls = append(calls, keys)
			mu.Unlock()
			if blocked {
				return leasing.WriteResult{}, fmt.Errorf("complete: %w", leasing.ErrLockTimeout)
			}
			return b.mem.Complete(ctx, leases...)
		}
		started := make(chan struct{})
		var once sync.Once
		b.start(t, store, func(ctx context.Context, l leasing.Lease) error {
			once.Do(func() { close(started) })
			return nil
		}, processor.Options{BatchSize: 10, Concurrency: 4})
		<-started
		for _, id := range others {
			waitFor(t, statusIs(b.mem, id, leasing.StatusPublished), "published beside a held key")
		}
		heldAlone := func() int {
			mu.Lock()
			defer mu.Unlock()
			n := 0
			for _, keys := range calls {
				if len(keys) == 1 && keys[0] == "held" {
					n++
				}
			}
			return n
		}
		waitFor(t, func() bool { return heldAlone() >= 5 }, // the held key's own write, tried writeTries times
			"the held key's write given up")
		require.Equal(t, leasing.StatusPublishing, b.row(t, held).Status, "the held key's head is not written")
		mu.Lock()
		defer mu.Unlock()
		mixed := 0 // calls with the held key and others: at most the first try
		for _, keys := range calls {
			if slices.Contains(keys, "held") && len(keys) > 1 {
				mixed++
			}
		}
		require.LessOrEqual(t, mixed, 1, "the held key is written alone after the first try: %q", calls)
	})
}
