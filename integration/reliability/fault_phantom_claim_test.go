package reliability_test

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

	"github.com/leasestore/leasestore/leasing"
	"github.com/leasestore/leasestore/leasing/leasingtest"
	"github.com/leasestore/leasestore/leasing/processor"
)

// phantomClaimStore commits the first claim and then reports that the
// call timed out: the reply arrived after the caller's deadline, as it does
// when a claim statement outlives the processor's claim timeout under load.
type phantomClaimStore struct {
	leasing.Store
	once    sync.Once
	phantom atomic.Int64
}

func (s *phantomClaimStore) Claim(ctx context.Context, r leasing.ClaimRequest) ([]leasing.Lease, error) {
	first := false
	s.once.Do(func() { first = true })
	if !first {
		return s.Store.Claim(ctx, r)
	}
	leases, err := s.Store.Claim(context.WithoutCancel(ctx), r)
	if err != nil {
		return nil, err
	}
	s.phantom.Add(int64(len(leases)))
	return nil, fmt.Errorf("leasing: claim inbox: %w", context.DeadlineExceeded)
}

// phantomLease is the processors' lease in the phantom claim tests. The
// orphan sweep after the failed claim must come before the phantom lease
// expires (a sweep leaves expired leases, their attempts counted): 200 ms
// could pass first on a loaded machine. Without the sweep the message
// still comes back, once this lease expires, well within the tests' wait.
const phantomLease = 2 * time.Second

// TestFaultPhantomClaimBurnsAttempt: a claim that commits after the
// processor gave up on it (its reply was lost) leaves a lease nobody holds.
// Without care the message comes back only once that lease expires, and the
// claim counts an attempt no handler ran: with MaxAttempts 2 and a handler
// that always fails it would be dead-lettered after one handler run. The
// processor's ReleaseOrphans sweep after a failed claim returns the lease and
// its attempt, so attempt counts match handler runs.
func TestFaultPhantomClaimBurnsAttempt(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := freshURL(t)
	admin := adminConn(t, url)
	pg, err := leasing.NewPostgres(newPool(t, url, "", 2), leasing.Inbox, leasing.PostgresOptions{})
	require.NoError(t, err)
	res, err := pg.Enqueue(ctx, leasing.NewMessage{})
	require.NoError(t, err)
	store := &phantomClaimStore{Store: pg}
	var runs atomic.Int64
	proc, err := processor.New(store, func(context.Context, leasing.Lease) error {
		runs.Add(1)
		return errors.New("always fails")
	}, processor.Options{
		BatchSize: 1, Concurrency: 1, LeaseDuration: phantomLease, HeartbeatInterval: 50 * time.Millisecond,
		PollInterval: 20 * time.Millisecond, RetryPolicy: processor.RetryPolicy{MaxAttempts: 2, InitialDelay: time.Millisecond},
	})
	require.NoError(t, err)
	go func() { _ = proc.Run(ctx) }()
	require.Eventually(t, func() bool {
		status, _ := rowState(t, admin, leasing.Inbox, res.IDs[0])
		return status == "dead_lettered"
	}, 10*time.Second, 10*time.Millisecond)
	stopCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	require.NoError(t, proc.Stop(stopCtx))
	require.Equal(t, int64(1), store.phantom.Load())
	row, err := pg.Get(ctx, res.IDs[0])
	require.NoError(t, err)
	require.Equal(t, int64(row.AttemptCount), runs.Load(),
		"dead-lettered after %d attempts but the handler ran %d times: a claim the processor never saw counted as an attempt",
		row.AttemptCount, runs.Load())
}

// lateSweepStore is phantomClaimStore whose first orphan sweep also
// commits and then reports that the call timed out.
type lateSweepStore struct {
	phantomClaimStore
	sweepOnce sync.Once
	late      atomic.Int64 // rows the late sweep released
}

func (s *lateSweepStore) ReleaseOrphans(ctx context.Context, owner string, held []uuid.UUID) ([]uuid.UUID, error) {
	first := false
	s.sweepOnce.Do(func() { first = true })
	if !first {
		return s.Store.ReleaseOrphans(ctx, owner, held)
	}
	ids, err := s.Store.ReleaseOrphans(context.WithoutCancel(ctx), owner, held)
	if err != nil {
		return nil, err
	}
	s.late.Add(int64(len(ids)))
	return nil, fmt.Errorf("leasing: release orphans inbox: %w", context.DeadlineExceeded)
}

// TestFaultSweepReplyLost: the orphan sweep after a phantom claim commits
// but its caller sees a timeout, as a sweep's 300 ms deadline can pass
// under load while the server commits. The release stands all the same:
// attempt_count counts the handler runs only, and the attempt history
// records the release, so a client that counts releases from replies
// alone misses one (the stress check reads the history).
func TestFaultSweepReplyLost(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := freshURL(t)
	admin := adminConn(t, url)
	pg, err := leasing.NewPostgres(newPool(t, url, "", 2), leasing.Inbox, leasing.PostgresOptions{})
	require.NoError(t, err)
	res, err := pg.Enqueue(ctx, leasing.NewMessage{})
	require.NoError(t, err)
	store := &lateSweepStore{phantomClaimStore: phantomClaimStore{Store: pg}}
	var runs atomic.Int64
	proc, err := processor.New(store, func(context.Context, leasing.Lease) error {
		runs.Add(1)
		return errors.New("always fails")
	}, processor.Options{
		Owner:     "sweeper",
		BatchSize: 1, Concurrency: 1, LeaseDuration: phantomLease, HeartbeatInterval: 50 * time.Millisecond,
		PollInterval: 20 * time.Millisecond, RetryPolicy: processor.RetryPolicy{MaxAttempts: 2, InitialDelay: time.Millisecond},
	})
	require.NoError(t, err)
	go func() { _ = proc.Run(ctx) }()
	require.Eventually(t, func() bool {
		status, _ := rowState(t, admin, leasing.Inbox, res.IDs[0])
		return status == "dead_lettered"
	}, 10*time.Second, 10*time.Millisecond)
	stopCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	require.NoError(t, proc.Stop(stopCtx))
	require.Equal(t, int64(1), store.phantom.Load())
	require.Equal(t, int64(1), store.late.Load(), "the late sweep released the phantom lease")
	row, err := pg.Get(ctx, res.IDs[0])
	require.NoError(t, err)
	require.Equal(t, int64(row.AttemptCount), runs.Load(), "attempt_count %d, handler runs %d", row.AttemptCount, runs.Load())
	// The first generation (the phantom claim) released, then two handler runs.
	require.Equal(t, int64(3), leasingtest.Generations(row))
	require.Len(t, row.Attempts, 3)
	require.Equal(t, leasing.AttemptReleased, row.Attempts[0].End)
	require.Equal(t, row.LeaseGeneration-2, row.Attempts[0].Generation)
	require.True(t, strings.HasPrefix(row.Attempts[0].Owner, "sweeper-"), "released by %q", row.Attempts[0].Owner)
	require.Equal(t, int(leasingtest.Generations(row))-1, row.AttemptCount, "generations minus the one release")
}
