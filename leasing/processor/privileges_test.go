package processor_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/leasestore/leasestore/leasing"
	"github.com/leasestore/leasestore/leasing/processor"
)

// privilegeStore is a storeHooks whose CheckPrivileges returns check.
type privilegeStore struct {
	storeHooks
	check   error
	checkFn func() error // when set, its result instead of check's
	checks  atomic.Int32
}

func (s *privilegeStore) CheckPrivileges(context.Context) error {
	defer s.checks.Add(1)
	if s.checkFn != nil {
		return s.checkFn()
	}
	return s.check
}

// runAlone runs a processor over store with handler until Run returns on
// its own, and returns what OnError received and Run's error; it fails the
// test when Run has not returned after 5 seconds.
func runAlone(t *testing.T, store processor.Store, h processor.Handler) ([]error, error) {
	t.Helper()
	reported := make(chan error, 100)
	p, err := processor.New(store, h, processor.Options{
		Concurrency: 1, BatchSize: 1, PollInterval: 5 * time.Millisecond, HeartbeatInterval: 5 * time.Millisecond,
		OnError: func(err error) { reported <- err },
	})
	require.NoError(t, err)
	errc := make(chan error, 1)
	go func() { errc <- p.Run(context.Background()) }()
	var runErr error
	select {
	case runErr = <-errc:
	case <-time.After(5 * time.Second):
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = p.Stop(ctx)
		require.FailNow(t, "Run did not return on its own")
	}
	close(reported)
	var errs []error
	for err := range reported {
		errs = append(errs, err)
	}
	return errs, runErr
}

// TestPrivileges: a processor whose store's role lacks privileges does not
// run handlers whose outcomes it cannot write.
func TestPrivileges(t *testing.T) {
	t.Parallel()

	t.Run("RefusesToRunWithoutThem", func(t *testing.T) {
		t.Parallel()
		b := setupProcessor(t, leasing.Inbox)
		id := b.enqueue(t, 1)[0]
		missing := &leasing.PrivilegeError{Queue: leasing.Inbox, User: "app",
			Refused: []leasing.RefusedCall{{Call: "complete", Err: fmt.Errorf("%w: permission denied for table inbox_ordering_keys", leasing.ErrPermissionDenied)}}}
		store := &privilegeStore{storeHooks: storeHooks{Store: b.mem}, check: missing}
		var claims, handled atomic.Int32
		store.claim = func(ctx context.Context, r leasing.ClaimRequest) ([]leasing.Lease, error) {
			claims.Add(1)
			return b.mem.Claim(ctx, r)
		}
		reported, runErr := runAlone(t, store, func(context.Context, leasing.Lease) error { handled.Add(1); return nil })

		var pe *leasing.PrivilegeError
		require.ErrorAs(t, runErr, &pe)
		require.Same(t, missing, pe)
		require.ErrorIs(t, runErr, leasing.ErrPermissionDenied)
		require.ErrorContains(t, runErr, `processor: inbox refuses to run: leasing: a processor of inbox logged in as "app" may not complete (leasing: permission denied: permission denied for table inbox_ordering_keys)`)
		require.Len(t, reported, 1)
		require.ErrorIs(t, reported[0], leasing.ErrPermissionDenied)
		require.EqualValues(t, 1, store.checks.Load())
		require.Zero(t, claims.Load(), "nothing claimed")
		require.Zero(t, handled.Load())
		r := b.row(t, id)
		require.Equal(t, leasing.StatusPending, r.Status)
		require.Zero(t, r.AttemptCount)
	})

	t.Run("ClaimsNothingUntilTheCheckAnswers", func(t *testing.T) {
		t.Parallel()
		b := setupProcessor(t, leasing.Inbox)
		id := b.enqueue(t, 1)[0]
		store := &privilegeStore{storeHooks: storeHooks{Store: b.mem}}
		var answered, early atomic.Bool
		unreachable := errors.New("connection refused")
		store.checkFn = func() error {
			if store.checks.Load() < 2 {
				return unreachable
			}
			answered.Store(true)
			return nil
		}
		store.claim = func(ctx context.Context, r leasing.ClaimRequest) ([]leasing.Lease, error) {
			if !answered.Load() {
				early.Store(true)
			}
			return b.mem.Claim(ctx, r)
		}
		var reported atomic.Int32
		r := b.start(t, store, func(context.Context, leasing.Lease) error { return nil }, processor.Options{
			OnError: func(err error) {
				if errors.Is(err, unreachable) {
					reported.Add(1)
				}
			},
		})
		waitFor(t, statusIs(b.mem, id, leasing.StatusCompleted), "handled once the check answered")
		require.NoError(t, r.stop(t))
		require.False(t, early.Load(), "no claim before the check answered")
		require.EqualValues(t, 3, store.checks.Load(), "asked until it answered, then not again")
		require.EqualValues(t, 2, reported.Load())
	})

	t.Run("StopsWhenAWriteIsRefused", func(t *testing.T) {
		// Privileges revoked while the processor runs: the refused complete
		// is not tried again, and the processor stops instead of claiming
		// messages whose outcomes it cannot write.
		t.Parallel()
		b := setupProcessor(t, leasing.Inbox)
		ids := b.enqueue(t, 5)
		store := &privilegeStore{storeHooks: storeHooks{Store: b.mem}}
		var completes atomic.Int32
		store.complete = func(context.Context, ...leasing.Lease) (leasing.WriteResult, error) {
			completes.Add(1)
			return leasing.WriteResult{}, fmt.Errorf("%w: permission denied for table inbox_ordering_keys", leasing.ErrPermissionDenied)
		}
		// One slot, one message per claim: the slot frees as soon as an
		// outcome is submitted, before the writer sends it, so the second
		// message is claimed (a third may wait, claimed ahead, and is
		// released at the stop) while the first one's complete is refused.
		// Each call returns only once the outcomes before it were refused,
		// plus 100 ms for the refusal to stop the claim loop: a processor
		// that claims on after a refusal works a third message, whatever
		// the machine's speed. (A fixed 100 ms sleep raced the writer.)
		var calls atomic.Int32
		reported, runErr := runAlone(t, store, func(context.Context, leasing.Lease) error {
			before := calls.Add(1) - 1
			for deadline := time.Now().Add(5 * time.Second); completes.Load() < before && time.Now().Before(deadline); {
				time.Sleep(time.Millisecond)
			}
			time.Sleep(100 * time.Millisecond)
			return nil
		})

		require.ErrorIs(t, runErr, leasing.ErrPermissionDenied)
		require.ErrorContains(t, runErr, "processor: inbox stopped: the database refused an outcome write")
		require.NotEmpty(t, reported)
		require.Equal(t, leasing.Inbox.InFlight(), b.row(t, ids[0]).Status, "the outcome was not written; the lease expires")
		var claimed int32
		for _, id := range ids {
			if b.row(t, id).AttemptCount > 0 {
				claimed++
			}
		}
		require.LessOrEqual(t, claimed, int32(2), "claiming stopped at the refusal")
		require.Equal(t, claimed, completes.Load(), "each refused write sent once, not tried again")
	})
}
