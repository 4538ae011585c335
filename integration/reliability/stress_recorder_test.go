package reliability_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"

	"github.com/leasestore/leasestore/leasing"
)

// invocation is one handler call.
type invocation struct {
	id         uuid.UUID
	gen        int64
	worker     string
	start, end time.Time
	result     string // ok, failed, crashed, cancelled
	attempt    int
}

type claimEvent struct {
	id     uuid.UUID
	gen    int64
	owner  string
	at     time.Time // the claim had committed by then
	expiry time.Time
}

type writeEvent struct {
	id         uuid.UUID
	gen        int64
	owner      string
	kind       string
	outcome    leasing.Outcome // "" when the call failed
	start, end time.Time
}

// sweepEvent is one ReleaseOrphans call.
type sweepEvent struct {
	owner string
	// released is what the reply said the call released; nil when the
	// call returned an error: it may have released rows all the same
	// (committed, reply lost or too late for the caller's deadline).
	released []uuid.UUID
	failed   bool
}

// stressRecorder collects what every worker saw.
type stressRecorder struct {
	mu          sync.Mutex
	claims      []claimEvent
	writes      []writeEvent
	sweeps      []sweepEvent
	invocations []invocation
	expiry      map[[2]any]time.Time // (id, gen) -> latest known lease expiry
	renewed     int
	renewLost   int
	callErrors  map[string]int
	firstErrors map[string]string
}

func newStressRecorder() *stressRecorder {
	return &stressRecorder{expiry: map[[2]any]time.Time{}, callErrors: map[string]int{}, firstErrors: map[string]string{}}
}

func (r *stressRecorder) callError(op string, err error) {
	r.mu.Lock()
	r.callErrors[op]++
	if _, ok := r.firstErrors[op]; !ok {
		r.firstErrors[op] = err.Error()
	}
	r.mu.Unlock()
}

// recordingStore wraps a worker's store: it records every call and can
// simulate the worker crashing (dead), freezing (paused), or one handler
// crashing (its lease is no longer renewed).
type recordingStore struct {
	leasing.Store
	rec    *stressRecorder
	worker string

	dead    atomic.Bool
	pauseMu sync.Mutex
	paused  chan struct{} // non-nil while paused; closed on resume
	crashed sync.Map      // [2]any{id, gen} -> true: not renewed any more
}

var errWorkerDead = errors.New("stress: worker crashed")

// gate blocks while the store is paused and fails once it is dead.
func (s *recordingStore) gate(ctx context.Context) error {
	s.pauseMu.Lock()
	p := s.paused
	s.pauseMu.Unlock()
	if p != nil {
		select {
		case <-p:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if s.dead.Load() {
		return errWorkerDead
	}
	return nil
}

func (s *recordingStore) pause() {
	s.pauseMu.Lock()
	defer s.pauseMu.Unlock()
	if s.paused == nil {
		s.paused = make(chan struct{})
	}
}

func (s *recordingStore) resume() {
	s.pauseMu.Lock()
	defer s.pauseMu.Unlock()
	if s.paused != nil {
		close(s.paused)
		s.paused = nil
	}
}

func (s *recordingStore) Claim(ctx context.Context, r leasing.ClaimRequest) ([]leasing.Lease, error) {
	if err := s.gate(ctx); err != nil {
		return nil, err
	}
	leases, err := s.Store.Claim(ctx, r)
	at := time.Now()
	// A *ParkedError comes with good leases: the claim dead-lettered rows
	// it could not lease and leased the rest, which are recorded.
	if pe := (*leasing.ParkedError)(nil); err != nil && !errors.As(err, &pe) {
		s.rec.callError("claim", err)
		return leases, err
	}
	s.rec.mu.Lock()
	for _, l := range leases {
		s.rec.claims = append(s.rec.claims, claimEvent{id: l.Message.ID, gen: l.Generation, owner: l.Owner, at: at, expiry: l.ExpiresAt})
		s.rec.expiry[[2]any{l.Message.ID, l.Generation}] = l.ExpiresAt
	}
	s.rec.mu.Unlock()
	return leases, err
}

func (s *recordingStore) Renew(ctx context.Context, d time.Duration, leases ...leasing.Lease) (leasing.RenewResult, error) {
	if err := s.gate(ctx); err != nil {
		return leasing.RenewResult{}, err
	}
	var keep []leasing.Lease
	for _, l := range leases {
		if _, crashed := s.crashed.Load([2]any{l.Message.ID, l.Generation}); !crashed {
			keep = append(keep, l)
		}
	}
	if len(keep) == 0 {
		return leasing.RenewResult{Renewed: []leasing.Lease{}, Lost: []uuid.UUID{}}, nil
	}
	res, err := s.Store.Renew(ctx, d, keep...)
	if err != nil {
		s.rec.callError("renew", err)
		return res, err
	}
	s.rec.mu.Lock()
	for _, l := range res.Renewed {
		s.rec.expiry[[2]any{l.Message.ID, l.Generation}] = l.ExpiresAt
	}
	s.rec.renewed += len(res.Renewed)
	s.rec.renewLost += len(res.Lost)
	s.rec.mu.Unlock()
	return res, nil
}

func (s *recordingStore) write(ctx context.Context, kind string, leases []leasing.Lease, call func() (leasing.WriteResult, error)) (leasing.WriteResult, error) {
	if err := s.gate(ctx); err != nil {
		return leasing.WriteResult{}, err
	}
	start := time.Now()
	res, err := call()
	end := time.Now()
	if err != nil {
		s.rec.callError(kind, err)
	}
	s.rec.mu.Lock()
	defer s.rec.mu.Unlock()
	for i, l := range leases {
		ev := writeEvent{id: l.Message.ID, gen: l.Generation, owner: l.Owner, kind: kind, start: start, end: end}
		if err == nil {
			ev.outcome = res.Outcomes[i].Outcome
		}
		s.rec.writes = append(s.rec.writes, ev)
	}
	return res, err
}

// ReleaseOrphans records each sweep: the rows its reply said it released
// (each returns the attempt of a claim whose reply never reached its
// processor), or that it failed and may have released rows unseen.
func (s *recordingStore) ReleaseOrphans(ctx context.Context, owner string, held []uuid.UUID) ([]uuid.UUID, error) {
	if err := s.gate(ctx); err != nil {
		return nil, err // never sent
	}
	ids, err := s.Store.ReleaseOrphans(ctx, owner, held)
	ev := sweepEvent{owner: owner, released: ids, failed: err != nil}
	if err != nil {
		s.rec.callError("release-orphans", err)
		ev.released = nil
	}
	s.rec.mu.Lock()
	s.rec.sweeps = append(s.rec.sweeps, ev)
	s.rec.mu.Unlock()
	return ids, err
}

func (s *recordingStore) Release(ctx context.Context, leases ...leasing.Lease) (leasing.WriteResult, error) {
	return s.write(ctx, "release", leases, func() (leasing.WriteResult, error) { return s.Store.Release(ctx, leases...) })
}

func (s *recordingStore) Complete(ctx context.Context, leases ...leasing.Lease) (leasing.WriteResult, error) {
	return s.write(ctx, "complete", leases, func() (leasing.WriteResult, error) { return s.Store.Complete(ctx, leases...) })
}

func (s *recordingStore) Fail(ctx context.Context, fs ...leasing.Failure) (leasing.WriteResult, error) {
	return s.write(ctx, "fail", failureLeases(fs), func() (leasing.WriteResult, error) { return s.Store.Fail(ctx, fs...) })
}

func (s *recordingStore) DeadLetter(ctx context.Context, fs ...leasing.Failure) (leasing.WriteResult, error) {
	return s.write(ctx, "dead-letter", failureLeases(fs), func() (leasing.WriteResult, error) { return s.Store.DeadLetter(ctx, fs...) })
}
