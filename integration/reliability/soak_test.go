package reliability_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/leasestore/leasestore/internal/dbtest"
	"github.com/leasestore/leasestore/leasing"
	"github.com/leasestore/leasestore/leasing/processor"
)

// soakDuration is how long TestSoakAllOperations runs: a few seconds in
// the always-on form, three minutes under -stress (make stress), or
// LEASESTORE_SOAK_DURATION (a Go duration) when set.
func soakDuration(t *testing.T) time.Duration {
	if s := os.Getenv("LEASESTORE_SOAK_DURATION"); s != "" {
		d, err := time.ParseDuration(s)
		require.NoError(t, err, "LEASESTORE_SOAK_DURATION")
		return d
	}
	return pick(4*time.Second, 3*time.Minute)
}

// TestSoakAllOperations runs every store operation at once against one
// database, on both queues: enqueues (inbox duplicates among them,
// delivered twice at once in opposite orders), claims and
// CompleteAndClaim, renews, completes, fails, dead-letters, releases,
// leases held past their expiry and written after another worker
// reclaimed them, ReleaseOrphans, Requeue by id (in reverse id order) and
// RequeueAll, Purge with and without dead letters, Bulk (dead-letter of
// waiting messages, purge of dead letters), VacuumIfDead and the
// processors' vacuum policy (processor.KeepVacuumed), with half the
// messages keyed (promotions in every complete and dead letter) and strict
// ordering switched on and off. It asserts the store's
// one lock order (db/queries/partials.sql.tmpl): no call returned an error
// (outcomes such as lost or terminal are answers, not errors), and the
// database's deadlock counter moved no more than the one cycle that order
// cannot prevent explains (see the bound below).
func TestSoakAllOperations(t *testing.T) {
	t.Parallel()
	url := dbtest.DatabaseURL(t)
	admin := adminConn(t, url)
	ctx := context.Background()
	deadlocks := func() int64 {
		var n int64
		_, err := admin.Exec(ctx, "SELECT pg_stat_clear_snapshot()")
		require.NoError(t, err)
		require.NoError(t, admin.QueryRow(ctx,
			"SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()").Scan(&n))
		return n
	}
	before := deadlocks()

	duration := soakDuration(t)
	s := &soak{t: t, ops: map[string]*atomic.Int64{}, stop: make(chan struct{})}
	pool := newPool(t, url, "soak", 24)
	for _, q := range queuesBoth {
		store, err := leasing.NewPostgres(pool, q, leasing.PostgresOptions{})
		require.NoError(t, err)
		s.run(q, store)
	}
	start := time.Now()
	time.Sleep(duration)
	// On a loaded machine a few seconds may not reach every kind (one run
	// made 258 calls in 6.3 s and missed one): go on until each kind ran
	// on each queue, for at most a minute more; the assertion below
	// reports a kind that still did not.
	deadline := time.Now().Add(time.Minute)
	for len(s.missingKinds()) > 0 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	close(s.stop)
	s.wg.Wait()
	elapsed := time.Since(start)
	pool.Close()

	// A backend sends its statistics at most once a second, and always as
	// it exits: wait for the soak's backends to be gone, then read.
	require.Eventually(t, func() bool {
		var n int
		require.NoError(t, admin.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND pid <> pg_backend_pid() AND backend_type = 'client backend'`).Scan(&n))
		return n == 0
	}, 30*time.Second, 50*time.Millisecond)
	after := deadlocks()

	var kinds []string
	total := int64(0)
	for k, v := range s.ops {
		kinds = append(kinds, fmt.Sprintf("%s=%d", k, v.Load()))
		total += v.Load()
	}
	sort.Strings(kinds)
	t.Logf("soak: %s, %d calls, deadlocks %d, failed calls %d", elapsed.Round(time.Millisecond), total, after-before, s.failed.Load())
	t.Logf("soak: calls by kind: %s", strings.Join(kinds, " "))
	for _, e := range s.firstErrors() {
		t.Errorf("soak: call failed: %v", e)
	}
	// No call failed, deadlocks included: the store sends a deadlock's
	// victim again (leasing/postgres_send.go). The counter still counts
	// those, from the cycles the lock order does not prevent: a SKIP LOCKED
	// claim that follows a just-updated row waits (see deadlockRetries), and
	// a requeue of a dead letter dead-lettered after KeyAdvance's snapshot
	// (docs/notes/2026-12-03-requeue-deadlock.md, not fixed). Measured on 2
	// cores: 0-2 in each of eight 4 s soaks (about 4,400 calls), 5 in a 40 s
	// soak of 45,415 calls. The bound leaves room for those, so that a 4 s
	// soak does not fail on them (it did, about one run in eight, at 1 +
	// calls/20,000); a statement out of the lock order deadlocks far more
	// often (main's Requeue and Enqueue before this suite: 25 in 60 s), and
	// a longer soak (LEASESTORE_SOAK_DURATION) catches it.
	allowed := 3 + total/4_000
	require.LessOrEqual(t, after-before, allowed, "pg_stat_database.deadlocks moved more than the known cycles explain")
	require.Zero(t, s.failed.Load(), "failed calls")
	// Every kind ran at least once, or the soak did not test it.
	require.Empty(t, s.missingKinds(), "kinds that never ran")
}

// missingKinds returns the "queue kind" counters of soakKinds that are
// still zero, on either queue.
func (s *soak) missingKinds() []string {
	var missing []string
	for _, k := range soakKinds {
		for _, q := range queuesBoth {
			if s.counter(string(q)+" "+k).Load() == 0 {
				missing = append(missing, string(q)+" "+k)
			}
		}
	}
	return missing
}

// soakKinds are the operations every soak must have run on each queue.
var soakKinds = []string{
	"enqueue", "enqueue-duplicates", "claim", "complete-and-claim", "renew", "complete", "fail", "dead-letter",
	"release", "stale-write", "release-orphans", "requeue", "requeue-all", "purge", "purge-dead-lettered",
	"vacuum-if-dead", "keep-vacuumed", "strict-ordering", "bulk-dead-letter-waiting", "bulk-purge-dead-lettered",
}

// soak is one TestSoakAllOperations run: its actors, counters and errors.
type soak struct {
	t      *testing.T
	wg     sync.WaitGroup
	stop   chan struct{}
	mu     sync.Mutex
	ops    map[string]*atomic.Int64
	errs   []error
	failed atomic.Int64
	// dead holds recently dead-lettered ids per queue, for Requeue by id.
	dead sync.Map // leasing.Queue -> *deadIDs
}

type deadIDs struct {
	mu  sync.Mutex
	ids []uuid.UUID
}

func (s *soak) counter(kind string) *atomic.Int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	c, ok := s.ops[kind]
	if !ok {
		c = new(atomic.Int64)
		s.ops[kind] = c
	}
	return c
}

// call counts one call of kind on q and records its error, if any.
func (s *soak) call(q leasing.Queue, kind string, err error) bool {
	s.counter(string(q) + " " + kind).Add(1)
	if err == nil {
		return true
	}
	s.failed.Add(1)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		err = fmt.Errorf("%s %s: SQLSTATE %s: %w", q, kind, pgErr.Code, err)
	} else {
		err = fmt.Errorf("%s %s: %w", q, kind, err)
	}
	s.mu.Lock()
	s.errs = append(s.errs, err)
	s.mu.Unlock()
	return false
}

func (s *soak) firstErrors() []error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.errs[:min(len(s.errs), 10)]
}

func (s *soak) stopped() bool {
	select {
	case <-s.stop:
		return true
	default:
		return false
	}
}

// loop runs fn until the soak stops, pausing pause between calls.
func (s *soak) loop(fn func(r *rand.Rand), pause time.Duration) {
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		r := rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64()))
		for !s.stopped() {
			fn(r)
			if pause > 0 {
				time.Sleep(pause)
			}
		}
	}()
}

func (s *soak) deadOf(q leasing.Queue) *deadIDs {
	d, _ := s.dead.LoadOrStore(q, &deadIDs{})
	return d.(*deadIDs)
}

// run starts the actors on store's queue q. Calls use a context that never
// ends, so that stopping never cancels a call: every error is the store's.
func (s *soak) run(q leasing.Queue, store *leasing.Postgres) {
	ctx := context.Background()
	const leaseFor = 300 * time.Millisecond
	// Half the messages have one of 20 ordering keys, so that keys form
	// lines: their heads are promoted by completes and dead letters, in
	// the same transactions, while enqueues of the same keys run.
	message := func() leasing.NewMessage {
		m := leasing.NewMessage{ID: uuid.New(), Type: "soak", Payload: []byte("x")}
		if k := rand.IntN(40); k < 20 {
			m.OrderingKey = fmt.Sprintf("soak-key-%d", k)
		}
		return m
	}
	// Strict ordering switched on and off: dead-lettered heads then keep
	// their keys until requeued or purged.
	s.loop(func(r *rand.Rand) {
		s.call(q, "strict-ordering", store.SetStrictOrdering(ctx, r.IntN(2) == 0))
	}, 50*time.Millisecond)

	// Enqueues; inbox duplicates: the same new ids enqueued by two calls at
	// once, one in reverse order.
	s.loop(func(r *rand.Rand) {
		msgs := make([]leasing.NewMessage, 1+r.IntN(20))
		for i := range msgs {
			msgs[i] = message()
		}
		_, err := store.Enqueue(ctx, msgs...)
		s.call(q, "enqueue", err)
	}, 2*time.Millisecond)
	s.loop(func(r *rand.Rand) {
		msgs := make([]leasing.NewMessage, 2+r.IntN(10))
		for i := range msgs {
			msgs[i] = message()
		}
		if q == leasing.Outbox {
			// The outbox refuses duplicates; enqueue the halves at once.
			var wg sync.WaitGroup
			for _, half := range [][]leasing.NewMessage{msgs[:len(msgs)/2], msgs[len(msgs)/2:]} {
				wg.Go(func() { _, err := store.Enqueue(ctx, half...); s.call(q, "enqueue-duplicates", err) })
			}
			wg.Wait()
			return
		}
		reversed := slices.Clone(msgs)
		slices.Reverse(reversed)
		var wg sync.WaitGroup
		for _, batch := range [][]leasing.NewMessage{msgs, reversed} {
			wg.Go(func() { _, err := store.Enqueue(ctx, batch...); s.call(q, "enqueue-duplicates", err) })
		}
		wg.Wait()
	}, 5*time.Millisecond)

	// Workers: claim (or complete and claim), then each lease gets one of
	// every outcome write; some leases are held past their expiry, so that
	// another worker reclaims them, and written afterwards.
	for w := range 4 {
		owner := leasing.NewOwner(fmt.Sprintf("soak-%s-%d", q, w))
		var done []leasing.Lease
		s.loop(func(r *rand.Rand) {
			req := leasing.ClaimRequest{Owner: owner, BatchSize: 1 + r.IntN(30), LeaseFor: leaseFor}
			var leases []leasing.Lease
			var err error
			if len(done) > 0 {
				var res leasing.WriteResult
				res, leases, err = store.CompleteAndClaim(ctx, done, req)
				s.call(q, "complete-and-claim", err)
				_ = res
				done = nil
			} else {
				leases, err = store.Claim(ctx, req)
				s.call(q, "claim", err)
			}
			if err != nil || len(leases) == 0 {
				time.Sleep(5 * time.Millisecond)
				return
			}
			r.Shuffle(len(leases), func(i, j int) { leases[i], leases[j] = leases[j], leases[i] })
			var renew, complete, release []leasing.Lease
			var fail, dead []leasing.Failure
			for _, l := range leases {
				switch x := r.IntN(100); {
				case x < 35:
					complete = append(complete, l)
				case x < 55:
					done = append(done, l)
				case x < 70:
					fail = append(fail, leasing.Failure{Lease: l, RetryAfter: time.Duration(r.IntN(20)) * time.Millisecond, Error: "soak"})
				case x < 82:
					dead = append(dead, leasing.Failure{Lease: l, Error: "soak"})
				case x < 92:
					release = append(release, l)
				default:
					renew = append(renew, l)
				}
			}
			if len(renew) > 0 {
				_, err := store.Renew(ctx, leaseFor, renew...)
				s.call(q, "renew", err)
				complete = append(complete, renew...)
			}
			if len(release) > 0 {
				_, err := store.Release(ctx, release...)
				s.call(q, "release", err)
			}
			if len(fail) > 0 {
				_, err := store.Fail(ctx, fail...)
				s.call(q, "fail", err)
			}
			if len(dead) > 0 {
				res, err := store.DeadLetter(ctx, dead...)
				if s.call(q, "dead-letter", err) {
					d := s.deadOf(q)
					d.mu.Lock()
					for _, o := range res.Outcomes {
						if o.Outcome == leasing.OutcomeApplied {
							d.ids = append(d.ids, o.MessageID)
						}
					}
					if len(d.ids) > 2000 {
						d.ids = slices.Clone(d.ids[len(d.ids)-1000:])
					}
					d.mu.Unlock()
				}
			}
			if len(complete) > 0 {
				_, err := store.Complete(ctx, complete...)
				s.call(q, "complete", err)
			}
		}, 0)
	}

	// A stale worker: holds its leases past their expiry while the workers
	// above reclaim them, then writes every outcome with the old leases.
	staleOwner := leasing.NewOwner("soak-stale-" + string(q))
	s.loop(func(r *rand.Rand) {
		leases, err := store.Claim(ctx, leasing.ClaimRequest{Owner: staleOwner, BatchSize: 1 + r.IntN(20), LeaseFor: 20 * time.Millisecond})
		if !s.call(q, "claim", err) || len(leases) == 0 {
			time.Sleep(5 * time.Millisecond)
			return
		}
		time.Sleep(time.Duration(30+r.IntN(100)) * time.Millisecond)
		failures := make([]leasing.Failure, len(leases))
		for i, l := range leases {
			failures[i] = leasing.Failure{Lease: l, Error: "stale"}
		}
		var werr error
		switch r.IntN(5) {
		case 0:
			_, werr = store.Complete(ctx, leases...)
		case 1:
			_, werr = store.Fail(ctx, failures...)
		case 2:
			_, werr = store.DeadLetter(ctx, failures...)
		case 3:
			_, werr = store.Release(ctx, leases...)
		default:
			_, werr = store.Renew(ctx, leaseFor, leases...)
		}
		s.call(q, "stale-write", werr)
	}, 0)

	// An orphan sweeper: the owner claims, forgets half its leases and
	// releases them with ReleaseOrphans, then completes the half it held.
	orphanOwner := leasing.NewOwner("soak-orphans-" + string(q))
	s.loop(func(r *rand.Rand) {
		leases, err := store.Claim(ctx, leasing.ClaimRequest{Owner: orphanOwner, BatchSize: 2 + r.IntN(20), LeaseFor: leaseFor})
		if !s.call(q, "claim", err) || len(leases) == 0 {
			time.Sleep(5 * time.Millisecond)
			return
		}
		held := leases[:len(leases)/2]
		ids := make([]uuid.UUID, len(held))
		for i, l := range held {
			ids[i] = l.Message.ID
		}
		_, err = store.ReleaseOrphans(ctx, orphanOwner, ids)
		s.call(q, "release-orphans", err)
		if len(held) > 0 {
			_, err = store.Complete(ctx, held...)
			s.call(q, "complete", err)
		}
	}, 2*time.Millisecond)

	// Operators: Requeue by id in reverse id order, RequeueAll, Purge.
	s.loop(func(r *rand.Rand) {
		d := s.deadOf(q)
		d.mu.Lock()
		ids := slices.Clone(d.ids[max(0, len(d.ids)-200):])
		d.mu.Unlock()
		ids = slices.Compact(slices.SortedFunc(slices.Values(ids), func(a, b uuid.UUID) int { return strings.Compare(a.String(), b.String()) }))
		slices.Reverse(ids)
		if len(ids) == 0 {
			ids = []uuid.UUID{uuid.New()}
		}
		_, err := store.Requeue(ctx, ids...)
		s.call(q, "requeue", err)
	}, 3*time.Millisecond)
	s.loop(func(*rand.Rand) {
		_, err := store.RequeueAll(ctx)
		s.call(q, "requeue-all", err)
	}, 20*time.Millisecond)
	s.loop(func(r *rand.Rand) {
		dead := r.IntN(2) == 0
		_, err := store.Purge(ctx, leasing.PurgeRequest{OlderThan: time.Millisecond, BatchSize: 1 + r.IntN(200), IncludeDeadLettered: dead})
		kind := "purge"
		if dead {
			kind = "purge-dead-lettered"
		}
		s.call(q, kind, err)
	}, 5*time.Millisecond)

	// Bulk by filter: dead-letter waiting messages (one transaction each),
	// purge dead letters by id. (Bulk requeue is Requeue by id, above.)
	s.loop(func(r *rand.Rand) {
		_, err := store.Bulk(ctx, leasing.BulkRequest{Action: leasing.BulkDeadLetter, Reason: "soak",
			Filter: leasing.ListFilter{Status: leasing.StatusWaiting}, BatchSize: 1 + r.IntN(20)})
		s.call(q, "bulk-dead-letter-waiting", err)
	}, 30*time.Millisecond)
	s.loop(func(r *rand.Rand) {
		_, err := store.Bulk(ctx, leasing.BulkRequest{Action: leasing.BulkPurge,
			Filter: leasing.ListFilter{Status: leasing.StatusDeadLettered}, BatchSize: 1 + r.IntN(200)})
		s.call(q, "bulk-purge-dead-lettered", err)
	}, 20*time.Millisecond)

	// The vacuum policy, as processors run it, and VacuumIfDead directly.
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		vctx, cancel := context.WithCancel(context.Background())
		go func() { <-s.stop; cancel() }()
		s.counter(string(q) + " keep-vacuumed").Add(1)
		err := processor.KeepVacuumed(vctx, store, processor.VacuumPolicy{DeadRows: 200, CheckInterval: 20 * time.Millisecond},
			func(err error) { s.call(q, "keep-vacuumed", err) })
		if err != nil {
			s.call(q, "keep-vacuumed", err)
		}
	}()
	s.loop(func(*rand.Rand) {
		_, err := store.VacuumIfDead(ctx, 1)
		s.call(q, "vacuum-if-dead", err)
	}, 100*time.Millisecond)
}
