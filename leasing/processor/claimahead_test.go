package processor_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/leasestore/leasestore/leasing"
	"github.com/leasestore/leasestore/leasing/processor"
)

// TestProcessorClaimsAhead: with every slot busy, a processor claims its
// next batch once fewer leases wait than half a batch (or half the slots),
// and no further; with one slot it claims only when the slot is free.
func TestProcessorClaimsAhead(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name               string
		concurrency, batch int
		held               int // leases held with every handler blocked
	}{
		{"FourSlots", 4, 4, 8},   // 4 running, a batch of 4 claimed when 0 < 2 waited
		{"OneSlot", 1, 4, 4},     // 1 running, 3 waiting from the first claim
		{"EightSlots", 8, 4, 12}, // 8 running from two claims, a third waits: 4 >= 2
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setupProcessor(t, leasing.Inbox)
			b.enqueue(t, 40)
			release := make(chan struct{})
			var started atomic.Int32
			b.start(t, nil, heldHandler(release, &started), processor.Options{Concurrency: tc.concurrency, BatchSize: tc.batch, ShutdownGrace: time.Second})
			defer close(release)
			leased := func() int {
				st, err := b.mem.Stats(context.Background())
				require.NoError(t, err)
				return int(st.Depth[leasing.StatusProcessing])
			}
			waitFor(t, func() bool { return int(started.Load()) == tc.concurrency && leased() == tc.held }, "claimed ahead")
			time.Sleep(50 * time.Millisecond) // ten poll intervals: no further claim
			require.Equal(t, tc.held, leased())
			require.EqualValues(t, tc.concurrency, started.Load())
		})
	}
}

// heldHandler returns a handler that counts its calls in started and
// returns once release yields (a receive each, or all once closed) or its
// context ends.
func heldHandler(release <-chan struct{}, started *atomic.Int32) processor.Handler {
	return func(ctx context.Context, _ leasing.Lease) error {
		started.Add(1)
		select {
		case <-release:
		case <-ctx.Done():
		}
		return nil
	}
}

// TestProcessorPipelinesClaims: while a backlog drains and its workers
// wait for leases, a New processor claiming batches of at most 100 has a
// second claim in flight, never a third; its first claim, before any claim
// has taken a full batch, goes alone. One with larger batches, and a
// NewBatch processor, have one claim in flight at most. Every message is
// handled once.
func TestProcessorPipelinesClaims(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name              string
		batch             bool
		concurrency, size int
		most              int32 // claims in flight at once
	}{
		{"New", false, 8, 4, 2},
		{"NewBatchOf100", false, 200, 100, 2},
		{"NewBatchOf101", false, 202, 101, 1},
		{"NewBatch", true, 8, 4, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setupProcessor(t, leasing.Inbox)
			n := 4 * tc.size
			b.enqueue(t, n)
			gate := make(chan struct{}) // each receive lets one claim through
			release := sync.OnceFunc(func() { close(gate) })
			var inFlight, most, sent atomic.Int32
			store := &storeHooks{Store: b.mem, claim: func(ctx context.Context, req leasing.ClaimRequest) ([]leasing.Lease, error) {
				sent.Add(1)
				now := inFlight.Add(1)
				for m := most.Load(); now > m && !most.CompareAndSwap(m, now); m = most.Load() {
				}
				defer inFlight.Add(-1)
				<-gate
				return b.mem.Claim(ctx, req)
			}}
			var handled atomic.Int32
			opts := processor.Options{Concurrency: tc.concurrency, BatchSize: tc.size}
			if tc.batch {
				b.startBatch(t, store, func(_ context.Context, leases []leasing.Lease) []error {
					handled.Add(int32(len(leases)))
					return make([]error, len(leases))
				}, opts)
			} else {
				b.start(t, store, func(context.Context, leasing.Lease) error {
					handled.Add(1)
					return nil
				}, opts)
			}
			t.Cleanup(release) // before the processor's stop, should the test fail

			waitFor(t, func() bool { return inFlight.Load() == 1 }, "first claim sent")
			time.Sleep(20 * time.Millisecond) // four poll intervals
			require.EqualValues(t, 1, inFlight.Load(), "a second claim before any claim took a full batch")
			gate <- struct{}{}
			// The first claim returned a full batch and the next went out.
			waitFor(t, func() bool { return sent.Load() >= 2 && inFlight.Load() == tc.most }, "claims in flight after a full batch")
			time.Sleep(20 * time.Millisecond)
			require.Equal(t, tc.most, inFlight.Load())

			release()
			waitFor(t, func() bool {
				st, err := b.mem.Stats(context.Background())
				return err == nil && st.Depth[leasing.StatusCompleted] == int64(n)
			}, "drained")
			require.EqualValues(t, n, handled.Load())
			require.Equal(t, tc.most, most.Load())
		})
	}
}

// TestProcessorDispatchesDuringClaim: a worker that finishes while a claim
// is in flight starts the next waiting lease at once, without waiting for
// the claim to return.
func TestProcessorDispatchesDuringClaim(t *testing.T) {
	t.Parallel()
	b := setupProcessor(t, leasing.Inbox)
	b.enqueue(t, 40)
	gate := make(chan struct{}) // each receive lets one claim through
	var inFlight atomic.Int32
	store := &storeHooks{Store: b.mem, claim: func(ctx context.Context, req leasing.ClaimRequest) ([]leasing.Lease, error) {
		inFlight.Add(1)
		defer inFlight.Add(-1)
		<-gate
		return b.mem.Claim(ctx, req)
	}}
	release := make(chan struct{}) // each receive lets one handler return
	var started atomic.Int32
	b.start(t, store, heldHandler(release, &started), processor.Options{Concurrency: 4, BatchSize: 4, ShutdownGrace: time.Second})
	defer close(release)
	defer close(gate)
	leased := func() int64 {
		st, err := b.mem.Stats(context.Background())
		require.NoError(t, err)
		return st.Depth[leasing.StatusProcessing]
	}

	gate <- struct{}{} // the first batch: four running
	waitFor(t, func() bool { return started.Load() == 4 }, "first batch started")
	gate <- struct{}{} // claimed ahead: four waiting
	waitFor(t, func() bool { return leased() == 8 && inFlight.Load() == 0 }, "second batch waiting")
	for range 3 {
		release <- struct{}{}
	}
	// Three of the waiting leases start; one waits, fewer than half a
	// batch, so the third claim goes and stays in flight.
	waitFor(t, func() bool { return started.Load() == 7 && inFlight.Load() == 1 }, "third claim in flight")
	release <- struct{}{}
	waitFor(t, func() bool { return started.Load() == 8 }, "last waiting lease started during the claim")
	require.EqualValues(t, 1, inFlight.Load())
}

// TestProcessorReleasesClaimInFlightOfOpenBreaker: when a breaker opens
// while a claim is in flight, the claim's leases of the open topic are
// released when it returns; their handlers do not start.
func TestProcessorReleasesClaimInFlightOfOpenBreaker(t *testing.T) {
	t.Parallel()
	b := setupProcessor(t, leasing.Inbox)
	b.enqueue(t, 6)
	gate := make(chan struct{})
	var claims atomic.Int32
	store := &storeHooks{Store: b.mem, claim: func(ctx context.Context, req leasing.ClaimRequest) ([]leasing.Lease, error) {
		if claims.Add(1) == 2 {
			<-gate // the second claim is in flight while the breaker opens
		}
		return b.mem.Claim(ctx, req)
	}}
	fail, release := make(chan struct{}), make(chan struct{})
	var started atomic.Int32
	r := b.start(t, store, func(ctx context.Context, _ leasing.Lease) error {
		if started.Add(1) == 1 {
			<-fail
			return processor.Unavailable(errors.New("down"))
		}
		select {
		case <-release:
		case <-ctx.Done():
		}
		return nil
	}, processor.Options{Concurrency: 2, BatchSize: 2, ShutdownGrace: time.Second,
		Breaker: processor.BreakerPolicy{Threshold: 1, ProbeInterval: time.Hour, MaxProbeInterval: time.Hour}})
	defer close(release)

	waitFor(t, func() bool { return started.Load() == 2 && claims.Load() == 2 }, "two running, second claim in flight")
	close(fail) // the breaker of type "test" opens
	waitFor(t, func() bool { return len(r.p.Health().OpenBreakers) == 1 }, "breaker open")
	time.Sleep(20 * time.Millisecond) // the loop has looked at the opening
	close(gate)                       // the claim sent before the opening returns two "test" leases
	time.Sleep(100 * time.Millisecond)
	require.EqualValues(t, 2, started.Load(), "a handler started on a lease of an open breaker's topic")
}

// TestProcessorOlderEmptyClaimKeepsBacklogDue: with two claims in flight,
// an older claim that found nothing and returns after a newer one that
// took a full batch does not stop the drain: the backlog is claimed at
// once, not at the next poll.
func TestProcessorOlderEmptyClaimKeepsBacklogDue(t *testing.T) {
	t.Parallel()
	b := setupProcessor(t, leasing.Inbox)
	b.enqueue(t, 4)
	gateA := make(chan struct{})
	aClaimed := make(chan struct{})
	var claims atomic.Int32
	store := &storeHooks{Store: b.mem, claim: func(ctx context.Context, req leasing.ClaimRequest) ([]leasing.Lease, error) {
		if claims.Add(1) == 2 { // A: takes what is due now (nothing), returns late
			leases, err := b.mem.Claim(ctx, req)
			close(aClaimed)
			<-gateA
			return leases, err
		}
		return b.mem.Claim(ctx, req)
	}}
	release := make(chan struct{})
	b.start(t, store, heldHandler(release, new(atomic.Int32)), processor.Options{Concurrency: 4, BatchSize: 4, PollInterval: 10 * time.Second, ShutdownGrace: time.Second})

	<-aClaimed       // claim 1 took 4 (full), all running; A took nothing and is held
	b.enqueue(t, 12) // a backlog arrives
	release <- struct{}{}
	// a slot free, none waiting, last claim full: B goes and takes a full batch
	waitFor(t, func() bool { return claims.Load() == 3 }, "B sent")
	time.Sleep(20 * time.Millisecond)
	close(gateA) // the older, empty result comes last
	time.Sleep(20 * time.Millisecond)
	close(release)
	waitFor(t, func() bool {
		st, err := b.mem.Stats(context.Background())
		return err == nil && st.Depth[leasing.StatusCompleted] == 16
	}, "backlog drained without waiting for PollInterval")
}

// TestProcessorStopReleasesClaimInFlight: the leases of a claim in flight
// when Stop is called are released, their handlers not started.
func TestProcessorStopReleasesClaimInFlight(t *testing.T) {
	t.Parallel()
	b := setupProcessor(t, leasing.Inbox)
	b.enqueue(t, 10)
	gate := make(chan struct{})
	var claims atomic.Int32
	store := &storeHooks{Store: b.mem, claim: func(ctx context.Context, req leasing.ClaimRequest) ([]leasing.Lease, error) {
		claims.Add(1)
		leases, err := b.mem.Claim(ctx, req)
		<-gate
		return leases, err
	}}
	r := b.start(t, store, func(ctx context.Context, _ leasing.Lease) error { return nil },
		processor.Options{Concurrency: 4, BatchSize: 4})
	waitFor(t, func() bool { return claims.Load() == 1 }, "claim in flight")
	// Stop is requested before the claim returns, whatever the machine's
	// speed: Stop asks for the shutdown before it waits, and with a
	// context already ended it returns once it has asked.
	ended, cancel := context.WithCancel(context.Background())
	cancel()
	require.ErrorIs(t, r.p.Stop(ended), context.Canceled, "Stop returned before the claim in flight did")
	close(gate)
	require.NoError(t, r.stop(t))
	st, err := b.mem.Stats(context.Background())
	require.NoError(t, err)
	require.Zero(t, st.Depth[leasing.StatusProcessing])
	require.EqualValues(t, 10, st.Depth[leasing.StatusPending])
}

// sweepCounter counts the orphan sweeps of a privilegeStore.
type sweepCounter struct {
	privilegeStore
	sweeps atomic.Int32
}

func (s *sweepCounter) ReleaseOrphans(ctx context.Context, owner string, held []uuid.UUID) ([]uuid.UUID, error) {
	s.sweeps.Add(1)
	return s.privilegeStore.storeHooks.Store.ReleaseOrphans(ctx, owner, held)
}

// TestProcessorFailedPrivilegeCheckSweepsNothing: a privilege check that
// could not tell sent no claim, so no orphan sweep follows it (a failed
// claim is followed by sweeps).
func TestProcessorFailedPrivilegeCheckSweepsNothing(t *testing.T) {
	t.Parallel()
	b := setupProcessor(t, leasing.Inbox)
	b.enqueue(t, 3)
	s := &sweepCounter{}
	s.storeHooks = storeHooks{Store: b.mem}
	var n atomic.Int32
	s.checkFn = func() error {
		if n.Add(1) == 1 {
			return errors.New("connection reset")
		}
		return nil
	}
	b.start(t, s, func(context.Context, leasing.Lease) error { return nil }, processor.Options{Concurrency: 1, BatchSize: 1})
	waitFor(t, func() bool {
		st, err := b.mem.Stats(context.Background())
		return err == nil && st.Depth[leasing.StatusCompleted] == 3
	}, "drained")
	require.Zero(t, s.sweeps.Load(), "orphan sweeps after a privilege check that sent no claim")
}
