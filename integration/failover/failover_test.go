package failover_test

import (
	"context"
	"errors"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/leasestore/leasestore/integration/internal/pgcluster"
	"github.com/leasestore/leasestore/leasing"
	"github.com/leasestore/leasestore/leasing/processor"
)

// drainTarget is how many messages a drain enqueues per queue; the stress
// form (LEASESTORE_FAILOVER_MESSAGES) enqueues more.
func drainTarget() int {
	if n, err := strconv.Atoi(os.Getenv("LEASESTORE_FAILOVER_MESSAGES")); err == nil && n > 0 {
		return n
	}
	return 1000
}

// failovers is how many times a drain fails over; the stress form
// (LEASESTORE_FAILOVER_ROUNDS) runs more drains.
func failoverRounds() int {
	if n, err := strconv.Atoi(os.Getenv("LEASESTORE_FAILOVER_ROUNDS")); err == nil && n > 0 {
		return n
	}
	return 1
}

// TestFailoverSyncDrain fails a synchronous primary over to its standby in
// the middle of a drain: producers enqueue on both queues, a processor per
// queue (the inbox's woken by a Listener) works them, and a direct writer
// claims and completes inbox messages of its own tenant, all through a
// multi-host URL with target_session_attrs=read-write (the primary stops
// fast: its sessions end with SQLSTATE 57P01), then again through a proxy
// that switches to the promoted standby, as an address-stable endpoint
// does (the primary crashes: connections reset). Nobody restarts.
//
// Asserted on the promoted standby: every enqueue that returned success is
// there and ends terminal (nothing lost, every message terminal); every
// Complete that returned applied kept its generation (no outcome lost, the
// message was not claimed again); no message holds a lower generation
// than a client saw (a generation is never handed out twice, so the fence
// tells every lease from before the switch apart from a newer one); a
// lease from before the switch cannot write over a newer one; the
// Listener listens on the new primary. The figures logged are the first
// successes after the primary stopped (docs/notes/2026-12-03-failover.md).
func TestFailoverSyncDrain(t *testing.T) {
	for round := range failoverRounds() {
		t.Run("multihost"+strconv.Itoa(round), func(t *testing.T) { syncDrain(t, drainTarget(), false) })
		t.Run("proxy"+strconv.Itoa(round), func(t *testing.T) { syncDrain(t, drainTarget(), true) })
	}
}

func syncDrain(t *testing.T, target int, viaProxy bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c := pgcluster.Start(t, pgcluster.Options{Mode: pgcluster.Sync})
	url := c.MultiHostURL()
	repl, warnings := replicationWarnings(ctx, t, c.Primary.URL())
	require.Equal(t, int64(1), repl.SynchronousStandbys)
	require.Empty(t, warnings, "doctor finds the inbox's replication synchronous")
	var proxy *pgcluster.Proxy
	if viaProxy {
		proxy = pgcluster.NewProxy(t, c.Primary.Addr())
		url = "postgres://postgres@" + proxy.Addr() + "/postgres?sslmode=disable&connect_timeout=2"
	}
	stores := openStores(t, url)
	led := newLedger()

	// A stale lease: claimed, expired and claimed again by another owner
	// before the switch.
	stale, fresh := staleAndFresh(ctx, t, stores[leasing.Inbox])

	work, stopWork := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() { stopWork(); wg.Wait() }()

	// The Listener, on the same multi-host URL.
	lcfg, err := pgx.ParseConfig(url)
	require.NoError(t, err)
	listener, err := leasing.NewListener(lcfg, leasing.Inbox, leasing.ListenerOptions{
		MinBackoff: 50 * time.Millisecond, MaxBackoff: 500 * time.Millisecond,
		HeartbeatInterval: time.Second, HeartbeatTimeout: time.Second,
	})
	require.NoError(t, err)
	wg.Go(func() { _ = listener.Run(work) })

	// A processor per queue on tenant "proc".
	for _, q := range queues {
		opts := processor.Options{Owner: "failover-" + string(q), TenantID: "proc", BatchSize: 50, Concurrency: 8,
			LeaseDuration: 5 * time.Second, PollInterval: 200 * time.Millisecond}
		if q == leasing.Inbox {
			opts.WorkSignal = listener
		}
		p, err := processor.New(stores[q], func(_ context.Context, ls leasing.Lease) error {
			led.handle(q, ls)
			return nil
		}, opts)
		require.NoError(t, err)
		wg.Go(func() { _ = p.Run(work) })
	}

	// Producers: batches of 20 per queue, tenant "proc", and inbox
	// batches of tenant "direct" for the direct writer.
	var enqueued atomic.Int64
	for _, q := range queues {
		wg.Go(func() {
			for sent := 0; sent < target && work.Err() == nil; {
				tenant := "proc"
				if q == leasing.Inbox && sent%100 == 0 {
					tenant = "direct"
				}
				msgs := newMessages(q, tenant, 20)
				callCtx, cancel := context.WithTimeout(work, 5*time.Second)
				res, err := stores[q].Enqueue(callCtx, msgs...)
				cancel()
				if err != nil {
					time.Sleep(50 * time.Millisecond) // the call may have committed: its ids are not acked
					continue
				}
				led.ack(q, res.IDs)
				sent += len(msgs)
				time.Sleep(20 * time.Millisecond) // about 1000 messages a second, so the switch comes mid-drain
				enqueued.Add(int64(len(msgs)))
			}
		})
	}
	// The direct writer: claim and complete tenant "direct".
	wg.Go(func() {
		owner := leasing.NewOwner("direct")
		for work.Err() == nil {
			callCtx, cancel := context.WithTimeout(work, 5*time.Second)
			leases, err := stores[leasing.Inbox].Claim(callCtx, leasing.ClaimRequest{Owner: owner, BatchSize: 10, LeaseFor: time.Minute, TenantID: "direct"})
			cancel()
			if err != nil || len(leases) == 0 {
				time.Sleep(50 * time.Millisecond)
				continue
			}
			led.claimed(leases)
			for {
				callCtx, cancel := context.WithTimeout(work, 5*time.Second)
				res, err := stores[leasing.Inbox].Complete(callCtx, leases...)
				cancel()
				if err == nil {
					led.complete(leases, res)
					break
				}
				if work.Err() != nil {
					return
				}
				time.Sleep(50 * time.Millisecond)
			}
		}
	})

	waitFor(t, func() bool {
		return led.ackedCount(leasing.Inbox) >= target/2 && led.ackedCount(leasing.Outbox) >= target/2 && led.handledCount() >= target/2
	}, time.Minute, "half of the drain before the switch")
	pidBefore := listener.BackendPID()
	// Through the multi-host URL the primary stops fast (its sessions get
	// SQLSTATE 57P01); behind the proxy it crashes (connections reset).
	mode := "fast"
	if proxy != nil {
		mode = "immediate"
	}
	stopped := c.Failover(mode)
	led.markStopped(stopped)
	if proxy != nil {
		proxy.SwitchTo(c.Standby.Addr())
	}
	listened := make(chan time.Duration, 1)
	wg.Go(func() {
		for work.Err() == nil {
			if listener.Healthy() && listener.BackendPID() != pidBefore {
				listened <- time.Since(stopped)
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
	})
	t.Logf("promoted %s after the primary stopped", time.Since(stopped).Round(time.Millisecond))

	// The stale lease is fenced off; the fresh one writes. A call may
	// meet a pooled connection the switch broke before the pool or another
	// caller found it broken (ErrUnavailable): it is sent again, as the
	// store's callers do; a fenced write sent twice reports already
	// applied.
	complete := func(l leasing.Lease) leasing.WriteResult {
		t.Helper()
		for try := 1; ; try++ {
			res, err := stores[leasing.Inbox].Complete(ctx, l)
			if errors.Is(err, leasing.ErrUnavailable) && try < 20 {
				t.Logf("complete, try %d: %v", try, err)
				time.Sleep(100 * time.Millisecond)
				continue
			}
			require.NoError(t, err)
			return res
		}
	}
	require.ErrorIs(t, complete(stale).Err(), leasing.ErrLeaseLost, "a lease from before the switch wrote over a newer one")
	require.NoError(t, complete(fresh).Err())

	// Every acked message ends terminal on the new primary.
	waitFor(t, func() bool {
		if enqueued.Load() < int64(2*target) {
			return false
		}
		for _, q := range queues {
			st, err := stores[q].Stats(ctx)
			if err != nil {
				t.Logf("stats: %v", err)
				return false
			}
			if st.Depth[leasing.StatusPending]+st.Depth[q.InFlight()]+st.Depth[leasing.StatusFailed] > 0 {
				return false
			}
		}
		return true
	}, 2*time.Minute, "the drain to finish on the new primary")
	select {
	case d := <-listened:
		t.Logf("listener on the new primary %s after the primary stopped", d.Round(time.Millisecond))
	case <-time.After(30 * time.Second):
		t.Fatal("timed out after 30s waiting for the listener on the new primary")
	}
	stopWork()
	wg.Wait()
	rec := led.recovery()
	t.Logf("first success after the primary stopped:%s", formatRecovery(rec))

	led.mu.Lock()
	defer led.mu.Unlock()
	lost, notTerminal := 0, 0
	got := map[leasing.Queue]map[[16]byte]rowState{}
	for _, q := range queues {
		got[q] = map[[16]byte]rowState{}
		for id, r := range readRows(ctx, t, c.Standby.URL(), q) {
			got[q][id] = r
		}
	}
	for id, q := range led.acked {
		r, ok := got[q][id]
		switch {
		case !ok:
			lost++
		case r.status != string(q.Succeeded()):
			notTerminal++
		}
	}
	require.Zero(t, lost, "enqueues that returned success lost in the switch")
	require.Zero(t, notTerminal, "acked messages not terminal")
	for id, gen := range led.completed {
		r := got[leasing.Inbox][id]
		require.Equal(t, string(leasing.Inbox.Succeeded()), r.status)
		require.Equal(t, gen, r.generation, "a completion that returned applied was lost: message %s claimed again", id)
	}
	for id, gen := range led.seenGen {
		q := leasing.Inbox
		if _, ok := got[q][id]; !ok {
			q = leasing.Outbox
		}
		require.GreaterOrEqual(t, got[q][id].generation, gen, "message %s holds a generation below one a client saw", id)
	}
	dup := 0
	for _, n := range led.handled {
		if n > 1 {
			dup++
		}
	}
	require.NotEmpty(t, led.completed)
	t.Logf("sync: %d acked, %d completed directly, %d handled, %d handled twice or more (at-least-once)", len(led.acked), len(led.completed), len(led.handled), dup)
}

// staleAndFresh enqueues one inbox message of tenant "fence", claims it
// for a moment (the stale lease), lets that lease expire and claims it
// again for an hour (the fresh lease).
func staleAndFresh(ctx context.Context, t *testing.T, s *leasing.Postgres) (stale, fresh leasing.Lease) {
	t.Helper()
	_, err := s.Enqueue(ctx, newMessages(leasing.Inbox, "fence", 1)...)
	require.NoError(t, err)
	leases, err := s.Claim(ctx, leasing.ClaimRequest{Owner: "fence-stale", BatchSize: 1, LeaseFor: 10 * time.Millisecond, TenantID: "fence"})
	require.NoError(t, err)
	require.Len(t, leases, 1)
	stale = leases[0]
	waitFor(t, func() bool {
		leases, err = s.Claim(ctx, leasing.ClaimRequest{Owner: "fence-fresh", BatchSize: 1, LeaseFor: time.Hour, TenantID: "fence"})
		return err == nil && len(leases) == 1
	}, 10*time.Second, "the stale lease to expire")
	return stale, leases[0]
}

// waitFor polls cond every 20 ms until it holds or limit passed (a
// timeout, not a timing assertion).
func waitFor(t *testing.T, cond func() bool, limit time.Duration, what string) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", limit, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

var _ = errors.Is
