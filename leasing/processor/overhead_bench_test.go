package processor_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/leasestore/leasestore/leasing"
	"github.com/leasestore/leasestore/leasing/processor"
)

// instantStore is a processor.Store that answers at once, for measuring a
// processor's own cost per message: Claim leases the next of ids (one
// lease list per claim, as leasing.Postgres allocates) until they run out,
// and every write reports each lease applied. Renews and sweeps find
// nothing to do. Not a lease store: nothing is fenced or kept.
type instantStore struct {
	ids  []uuid.UUID
	mu   sync.Mutex
	next int
}

func (s *instantStore) Queue() leasing.Queue { return leasing.Inbox }

func (s *instantStore) Claim(_ context.Context, r leasing.ClaimRequest) ([]leasing.Lease, error) {
	s.mu.Lock()
	ids := s.ids[s.next:min(s.next+r.BatchSize, len(s.ids))]
	s.next += len(ids)
	s.mu.Unlock()
	now := time.Now()
	leases := make([]leasing.Lease, len(ids))
	for i, id := range ids {
		leases[i] = leasing.Lease{
			Queue: leasing.Inbox, Owner: r.Owner, Generation: 1, ExpiresAt: now.Add(r.LeaseFor), Attempt: 1, DueAt: now,
			Message: leasing.Message{ID: id, Type: "bench", Topic: "bench", Payload: []byte(`{}`), Headers: []byte(`{}`), CreatedAt: now, VisibleAfter: now},
		}
	}
	return leases, nil
}

func (s *instantStore) Renew(_ context.Context, _ time.Duration, leases ...leasing.Lease) (leasing.RenewResult, error) {
	return leasing.RenewResult{Renewed: leases}, nil
}

func applied(leases []leasing.Lease) leasing.WriteResult {
	res := leasing.WriteResult{Outcomes: make([]leasing.MessageOutcome, len(leases))}
	for i, l := range leases {
		res.Outcomes[i] = leasing.MessageOutcome{MessageID: l.Message.ID, Outcome: leasing.OutcomeApplied}
	}
	return res
}

func failuresApplied(failures []leasing.Failure) leasing.WriteResult {
	leases := make([]leasing.Lease, len(failures))
	for i, f := range failures {
		leases[i] = f.Lease
	}
	return applied(leases)
}

func (s *instantStore) Release(_ context.Context, leases ...leasing.Lease) (leasing.WriteResult, error) {
	return applied(leases), nil
}

func (s *instantStore) ReleaseAfter(_ context.Context, failures ...leasing.Failure) (leasing.WriteResult, error) {
	return failuresApplied(failures), nil
}

func (s *instantStore) ReleaseOrphans(context.Context, string, []uuid.UUID) ([]uuid.UUID, error) {
	return nil, nil
}

func (s *instantStore) Complete(_ context.Context, leases ...leasing.Lease) (leasing.WriteResult, error) {
	return applied(leases), nil
}

func (s *instantStore) Fail(_ context.Context, failures ...leasing.Failure) (leasing.WriteResult, error) {
	return failuresApplied(failures), nil
}

func (s *instantStore) DeadLetter(_ context.Context, failures ...leasing.Failure) (leasing.WriteResult, error) {
	return failuresApplied(failures), nil
}

// BenchmarkProcessorOverhead measures what a processor itself costs a
// message, without a database: one processor drains b.N messages from an
// instantStore with a handler that returns at once, batch 100, Concurrency
// 100 and 1,000. One op is one message, from Run until the last handler
// call returned. Its ns/op, B/op and allocs/op are the claim loop's, the
// workers', the writer's and the book's, with a lease list and a result
// per call as a store allocates them; a drain on PostgreSQL adds the
// driver's and the database's (BenchmarkProcessorDrain in leasing).
func BenchmarkProcessorOverhead(b *testing.B) {
	for _, concurrency := range []int{100, 1_000} {
		b.Run(fmt.Sprintf("concurrency=%d", concurrency), func(b *testing.B) {
			store := &instantStore{ids: make([]uuid.UUID, b.N)}
			for i := range store.ids {
				store.ids[i] = uuid.New()
			}
			var handled atomic.Int64
			all := make(chan struct{})
			p, err := processor.New(store, func(context.Context, leasing.Lease) error {
				if handled.Add(1) == int64(b.N) {
					close(all)
				}
				return nil
			}, processor.Options{
				BatchSize: 100, Concurrency: concurrency, PollInterval: 10 * time.Millisecond,
				OnError: func(err error) { b.Error(err) },
			})
			require.NoError(b, err)
			ctx, stop := context.WithCancel(context.Background())
			done := make(chan error, 1)
			b.ReportAllocs()
			b.ResetTimer()
			go func() { done <- p.Run(ctx) }()
			<-all
			b.StopTimer()
			stop()
			require.NoError(b, <-done)
		})
	}
}
