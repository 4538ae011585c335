package processor_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/codes"

	"github.com/leasestore/leasestore/internal/dbtest"
	"github.com/leasestore/leasestore/internal/spantest"
	"github.com/leasestore/leasestore/leasing"
	"github.com/leasestore/leasestore/leasing/processor"
)

// mergeStore is a store that completes and claims in one call.
type mergeStore interface {
	leasing.Store
	processor.CompleteClaimer
}

// countingMerges counts the completions a processor writes alone and
// those it sends with a claim; fail makes a CompleteAndClaim call fail
// after it committed, as when the reply is lost.
type countingMerges struct {
	mergeStore
	alone, merged atomic.Int64
	fail          func() bool
}

func (s *countingMerges) Complete(ctx context.Context, leases ...leasing.Lease) (leasing.WriteResult, error) {
	s.alone.Add(int64(len(leases)))
	return s.mergeStore.Complete(ctx, leases...)
}

func (s *countingMerges) CompleteAndClaim(ctx context.Context, done []leasing.Lease, r leasing.ClaimRequest) (leasing.WriteResult, []leasing.Lease, error) {
	res, leases, err := s.mergeStore.CompleteAndClaim(ctx, done, r)
	if err == nil && len(done) > 0 && s.fail != nil && s.fail() {
		_, _ = s.mergeStore.Release(ctx, leases...) // the claim committed too; its leases are unknown to the caller
		return leasing.WriteResult{}, nil, errors.New("conn closed")
	}
	s.merged.Add(int64(len(done)))
	return res, leases, err
}

// TestProcessorMergesCompletionsWithClaims: with MergeCompletions, while a
// processor drains a backlog, the completions of unkeyed messages ride
// with its claims (one transaction for both), on Memory and on PostgreSQL;
// without it none do. Every message is completed once.
func TestProcessorMergesCompletionsWithClaims(t *testing.T) {
	t.Parallel()
	const n = 3000
	msgs := make([]leasing.NewMessage, n)
	for i := range msgs {
		msgs[i] = leasing.NewMessage{Type: "test", Payload: []byte("{}")}
	}
	stores := []struct {
		name  string
		store func(t *testing.T) mergeStore
	}{
		{"Memory", func(t *testing.T) mergeStore { return setupProcessor(t, leasing.Inbox).mem }},
		{"Postgres", func(t *testing.T) mergeStore {
			pg, err := leasing.NewPostgres(dbtest.NewPool(t), leasing.Inbox, leasing.PostgresOptions{})
			require.NoError(t, err)
			return pg
		}},
	}
	for _, tc := range stores {
		for _, merge := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/MergeCompletions=%t", tc.name, merge), func(t *testing.T) {
				t.Parallel()
				store := &countingMerges{mergeStore: tc.store(t)}
				_, err := store.Enqueue(context.Background(), msgs...)
				require.NoError(t, err)
				var handled sync.Map
				var calls atomic.Int64
				p, err := processor.New(store, func(_ context.Context, l leasing.Lease) error {
					if _, again := handled.LoadOrStore(l.Message.ID, true); again {
						t.Errorf("message %s handled twice", l.Message.ID)
					}
					calls.Add(1)
					return nil
				}, processor.Options{Concurrency: 16, BatchSize: 50, PollInterval: time.Hour, MergeCompletions: merge})
				require.NoError(t, err)
				errc := make(chan error, 1)
				go func() { errc <- p.Run(context.Background()) }()
				require.Eventually(t, func() bool { return calls.Load() == n }, 60*time.Second, 5*time.Millisecond)
				require.NoError(t, p.Stop(context.Background()))
				require.NoError(t, <-errc)

				merged, alone := store.merged.Load(), store.alone.Load()
				t.Logf("%d completions sent with a claim, %d alone", merged, alone)
				require.EqualValues(t, n, merged+alone, "each completion written once")
				if merge {
					require.Greater(t, merged, int64(n/4), "most completions ride with a claim while the processor drains")
				} else {
					require.Zero(t, merged)
				}
				st, err := store.Stats(context.Background())
				require.NoError(t, err)
				require.EqualValues(t, n, st.Depth[leasing.StatusCompleted])
			})
		}
	}
}

// TestProcessorMergedWriteLostReply: when the call that sent completions
// with a claim fails after it committed, the writer writes them again,
// which reports them already applied; nothing is rejected or lost.
func TestProcessorMergedWriteLostReply(t *testing.T) {
	t.Parallel()
	b := setupProcessor(t, leasing.Inbox)
	ids := b.enqueue(t, 400)
	var failed atomic.Int32
	store := &countingMerges{mergeStore: b.mem, fail: func() bool { return failed.Add(1) == 1 }}
	r := b.start(t, store, func(context.Context, leasing.Lease) error { return nil },
		processor.Options{Concurrency: 8, BatchSize: 20, MergeCompletions: true})
	for _, id := range ids {
		waitFor(t, statusIs(b.mem, id, leasing.StatusCompleted), "completed")
	}
	require.NoError(t, r.stop(t))
	require.GreaterOrEqual(t, failed.Load(), int32(1), "a merged call failed")
	require.EqualValues(t, 400, b.counter("processor.succeeded"))
	require.EqualValues(t, 0, b.counter("processor.persist_rejected"))
}

// TestProcessorMergedWriteLostReplySpan: the span of a call that sent
// completions with a claim and failed ends with an error status saying
// that its completions went back to the writer (not that a key's lock
// split them), and every span ends once.
func TestProcessorMergedWriteLostReplySpan(t *testing.T) {
	t.Parallel()
	b := setupTracing(t, leasing.Inbox)
	msgs := make([]leasing.NewMessage, 40)
	for i := range msgs {
		msgs[i] = leasing.NewMessage{Type: "test", Payload: []byte("{}")}
	}
	res, err := b.mem.Enqueue(context.Background(), msgs...)
	require.NoError(t, err)
	var failed atomic.Int32
	store := &countingMerges{mergeStore: b.mem, fail: func() bool { return failed.Add(1) == 1 }}
	r := b.start(t, store, func(context.Context, leasing.Lease) error { return nil },
		processor.Options{Concurrency: 4, BatchSize: 4, MergeCompletions: true, TracerProvider: b.tp})
	for _, id := range res.IDs {
		waitFor(t, statusIs(b.mem, id, leasing.StatusCompleted), "completed")
	}
	require.NoError(t, r.stop(t))
	require.GreaterOrEqual(t, failed.Load(), int32(1), "a merged call failed")

	var abandoned []spantest.Span
	for _, s := range b.tp.Named("complete inbox") {
		if s.Status == codes.Error {
			abandoned = append(abandoned, s)
		}
	}
	require.Len(t, abandoned, 1)
	require.Equal(t, "given back to the writer: conn closed", abandoned[0].Description)
}
