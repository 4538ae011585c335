package leasing_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/leasestore/leasestore/internal/dbtest"
	"github.com/leasestore/leasestore/internal/logtest"
	"github.com/leasestore/leasestore/leasing"
	"github.com/leasestore/leasestore/leasing/leasingtest"
	"github.com/leasestore/leasestore/leasing/processor"
)

// orderingCall is one handler call of TestOrderingKeysUnderProcessors.
type orderingCall struct {
	id          uuid.UUID
	key         string
	start, end  time.Time
	leaseExpiry time.Time // the lease's expiry when the handler started
	generation  int64
	ok          bool
}

// TestOrderingKeysUnderProcessors runs 16 processors, each on a pool of its
// own, over 100 keys of 20 messages (created_at equal within each key: the
// enqueuing store's clock is pinned), with handlers that sleep and fail at
// random, while one key's head is held by a handler that pauses. Per key,
// the successes come in enqueue order and no two handler calls overlap;
// the other keys keep finishing while the paused head holds its key.
func TestOrderingKeysUnderProcessors(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := dbtest.DatabaseURL(t)
	const keys, perKey, procs = 100, 20, 16
	pinned := time.Now().Add(-time.Hour).UTC().Truncate(time.Microsecond)
	producer, err := leasing.NewPostgres(newPool(t, url, "ordering-producer", 4), leasing.Inbox,
		leasing.PostgresOptions{Now: func() time.Time { return pinned }})
	require.NoError(t, err)

	// 20 rounds; each call holds the round's message of every key, keys in
	// a random order. The enqueue order of a key is the round order.
	order := map[string][]uuid.UUID{}
	for range perKey {
		msgs := make([]leasing.NewMessage, 0, keys)
		for _, k := range rand.Perm(keys) {
			key := fmt.Sprintf("key-%03d", k)
			msgs = append(msgs, leasing.NewMessage{Payload: []byte(key), OrderingKey: key})
		}
		res, err := producer.Enqueue(ctx, msgs...)
		require.NoError(t, err)
		for i, id := range res.IDs {
			order[msgs[i].OrderingKey] = append(order[msgs[i].OrderingKey], id)
		}
	}
	var created []time.Time
	pool := newPool(t, url, "ordering-check", 2)
	rows, err := pool.Query(ctx, "SELECT DISTINCT created_at FROM inbox_messages")
	require.NoError(t, err)
	for rows.Next() {
		var c time.Time
		require.NoError(t, rows.Scan(&c))
		created = append(created, c)
	}
	require.NoError(t, rows.Err())
	require.Len(t, created, 1, "every message has the same created_at")

	const held = "key-042"
	var (
		mu        sync.Mutex
		calls     []orderingCall
		holdStart time.Time
		holdEnd   time.Time
		holdOnce  sync.Once
	)
	// othersSince counts the successful calls of other keys than held
	// that ended after start.
	othersSince := func(start time.Time) int {
		mu.Lock()
		defer mu.Unlock()
		n := 0
		for _, c := range calls {
			if c.ok && c.key != held && c.end.After(start) {
				n++
			}
		}
		return n
	}
	handler := func(hctx context.Context, l leasing.Lease) error {
		c := orderingCall{id: l.Message.ID, key: l.Message.OrderingKey, start: time.Now(), leaseExpiry: l.ExpiresAt, generation: l.Generation}
		hold := false
		if c.key == held && l.Message.ID == order[held][0] {
			holdOnce.Do(func() { hold = true })
		}
		var err error
		switch {
		case hold:
			// The paused worker: its heartbeat keeps the lease while it sleeps.
			mu.Lock()
			holdStart = time.Now()
			mu.Unlock()
			// Past the lease (the heartbeat must renew it) and until more
			// than 100 calls of other keys succeeded meanwhile, however
			// long a loaded machine takes for them (a fixed 3 s saw fewer
			// there); at most 30 s, so that held other keys still fail.
			time.Sleep(3 * time.Second)
			for wait := time.Now(); othersSince(holdStart) <= 100 && time.Since(wait) < 30*time.Second; {
				time.Sleep(10 * time.Millisecond)
			}
			mu.Lock()
			holdEnd = time.Now()
			mu.Unlock()
		default:
			time.Sleep(time.Duration(rand.IntN(3000)) * time.Microsecond)
			if rand.IntN(10) == 0 {
				err = errors.New("random failure")
			}
		}
		c.end, c.ok = time.Now(), err == nil
		mu.Lock()
		calls = append(calls, c)
		mu.Unlock()
		return err
	}
	logs := logtest.New(slog.LevelWarn)
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	var wg sync.WaitGroup
	for i := range procs {
		store, err := leasing.NewPostgres(newPool(t, url, fmt.Sprintf("ordering-%d", i), 3), leasing.Inbox, leasing.PostgresOptions{})
		require.NoError(t, err)
		p, err := processor.New(store, handler, processor.Options{
			Owner: fmt.Sprintf("proc-%d", i), BatchSize: 8, Concurrency: 4, LeaseDuration: 2 * time.Second,
			PollInterval: 20 * time.Millisecond, Logger: logs.Logger(),
			RetryPolicy: processor.RetryPolicy{MaxAttempts: 50, InitialDelay: 5 * time.Millisecond, MaxDelay: 20 * time.Millisecond},
		})
		require.NoError(t, err)
		wg.Add(1)
		go func() { defer wg.Done(); _ = p.Run(runCtx) }()
	}
	check, err := leasing.NewPostgres(pool, leasing.Inbox, leasing.PostgresOptions{})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		st, err := check.Stats(ctx)
		require.NoError(t, err)
		return st.Depth[leasing.StatusCompleted] == keys*perKey
	}, 2*time.Minute, 50*time.Millisecond, "every message completes")
	stop()
	wg.Wait()

	mu.Lock()
	defer mu.Unlock()
	byKey := map[string][]orderingCall{}
	for _, c := range calls {
		byKey[c.key] = append(byKey[c.key], c)
	}
	require.Len(t, byKey, keys)
	unwritten := unwrittenOutcomes(logs)
	for key, cs := range byKey {
		slices.SortFunc(cs, func(a, b orderingCall) int { return a.start.Compare(b.start) })
		var succeeded []uuid.UUID
		var last orderingCall
		for i, c := range cs {
			if c.ok {
				if len(succeeded) > 0 && last.id == c.id {
					// Handled again after a success: at least once allows
					// it only when that success's outcome was not written.
					require.True(t, unwritten(last.id, last.generation), "key %s: %s succeeded twice, and the processors logged no lost lease or unwritten outcome for generation %d; calls:\n%s",
						key, c.id, last.generation, orderingCalls(cs))
				} else {
					succeeded = append(succeeded, c.id)
				}
				last = c
			}
			if i > 0 {
				prev := cs[i-1]
				// While both leases were valid (each call ended within its
				// lease, renewed by the heartbeat), no two calls overlap.
				require.False(t, c.start.Before(prev.end), "key %s: call of %s started before the call of %s ended", key, c.id, prev.id)
			}
		}
		require.Equal(t, order[key], succeeded, "key %s: successes in enqueue order; calls:\n%s", key, orderingCalls(cs))
	}
	require.False(t, holdStart.IsZero(), "the held head was handled")
	others := 0
	for _, c := range calls {
		if c.ok && c.key != held && c.end.After(holdStart) && c.end.Before(holdEnd) {
			others++
		}
		if c.key == held && c.id != order[held][0] {
			require.True(t, c.start.After(holdEnd), "the rest of the held key waits for its head")
		}
	}
	require.Greater(t, others, 100, "other keys keep finishing while one head holds its key")
}

// unwrittenOutcomes returns whether the processors logged the outcome of
// the lease on id at generation as not written: the lease was lost, the
// fence refused the write, or the write was given up (logged with the
// message ids only).
func unwrittenOutcomes(logs *logtest.Recorder) func(id uuid.UUID, generation int64) bool {
	type leaseRef struct {
		id         string
		generation int64
	}
	refused, gaveUp := map[leaseRef]bool{}, map[string]bool{}
	for _, r := range logs.Records() {
		switch r.Message {
		case "lease lost", "outcome not written: the lease fence refused it":
			refused[leaseRef{r.Str(processor.LogKeyMessageID), r.Attrs[processor.LogKeyGeneration].Int64()}] = true
		case "gave up writing outcomes":
			ids, _ := r.Attrs["message_ids"].Any().([]string)
			for _, id := range ids {
				gaveUp[id] = true
			}
		}
	}
	return func(id uuid.UUID, generation int64) bool {
		return refused[leaseRef{id.String(), generation}] || gaveUp[id.String()]
	}
}

// orderingCalls formats calls, one per line, for a failure message.
func orderingCalls(calls []orderingCall) string {
	var b strings.Builder
	for _, c := range calls {
		fmt.Fprintf(&b, "  %s generation %d ok=%t %s-%s lease expiry %s\n", c.id, c.generation, c.ok,
			c.start.Format(time.StampMicro), c.end.Format(time.StampMicro), c.leaseExpiry.Format(time.StampMicro))
	}
	return b.String()
}

// TestOrderingKeyCrashedHeadIsReclaimedFirst: a worker claims a keyed head
// and disappears; after the lease expires, the head is reclaimed and
// handled before the next message of its key, which was never claimable
// meanwhile.
func TestOrderingKeyCrashedHeadIsReclaimedFirst(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := dbtest.DatabaseURL(t)
	for _, q := range queuesBoth {
		store, err := leasing.NewPostgres(newPool(t, url, "ordering-crash", 2), q, leasing.PostgresOptions{})
		require.NoError(t, err)
		res, err := store.Enqueue(ctx, leasing.NewMessage{Payload: []byte("1"), OrderingKey: "k"}, leasing.NewMessage{Payload: []byte("2"), OrderingKey: "k"})
		require.NoError(t, err)
		// A lease the next claim surely comes within, on a loaded machine
		// too (300 ms could expire before it).
		crashed, err := store.Claim(ctx, leasing.ClaimRequest{Owner: "crashed", BatchSize: 10, LeaseFor: 2 * time.Second})
		require.NoError(t, err)
		require.Len(t, crashed, 1)
		// The crashed worker writes nothing more. Until its lease expires,
		// nothing of the key can be claimed.
		none, err := store.Claim(ctx, leasing.ClaimRequest{Owner: "other", BatchSize: 10, LeaseFor: time.Minute})
		require.NoError(t, err)
		require.Empty(t, none)
		time.Sleep(time.Until(crashed[0].ExpiresAt))
		var re []leasing.Lease
		require.Eventually(t, func() bool { // the server's clock may lag a little
			re, err = store.Claim(ctx, leasing.ClaimRequest{Owner: "other", BatchSize: 10, LeaseFor: time.Minute})
			return err != nil || len(re) > 0
		}, 10*time.Second, 10*time.Millisecond, "nothing reclaimed after the lease expired")
		require.NoError(t, err)
		require.Equal(t, []uuid.UUID{res.IDs[0]}, []uuid.UUID{re[0].Message.ID}, "the reclaimed head first, alone")
		require.Len(t, re, 1)
		require.Equal(t, 2, re[0].Attempt)
		w, err := store.Complete(ctx, re[0])
		require.NoError(t, err)
		require.NoError(t, w.Err())
		next, err := store.Claim(ctx, leasing.ClaimRequest{Owner: "other", BatchSize: 10, LeaseFor: time.Minute})
		require.NoError(t, err)
		require.Len(t, next, 1)
		require.Equal(t, res.IDs[1], next[0].Message.ID)
	}
}

// purgedIncarnation opens a store of q on the database of url, with opts
// and a clock of its own, and returns it, its pool and a lease of an
// unkeyed row of q that was completed and purged, whose id was then
// enqueued again with ordering key "k", followed by next, of the same
// key: the new row is claimed by the lease's owner, "w", at the lease's
// generation, so that the lease passes the new row's fence though it
// names no key (see Lease). A new row's generations start above the
// purged row's (migration 00018), so the test sets the new row's back to
// where the purged row's started, as a row inserted with a generation of
// its own may have it.
func purgedIncarnation(t *testing.T, url string, q leasing.Queue, opts leasing.PostgresOptions) (pool *pgxpool.Pool, store *leasing.Postgres, old leasing.Lease, next uuid.UUID) {
	t.Helper()
	ctx := context.Background()
	clock := leasingtest.NewClock(leasingtest.Start)
	opts.Now = clock.Now
	pool = newPool(t, url, "ordering-purged", 4)
	store, err := leasing.NewPostgres(pool, q, opts)
	require.NoError(t, err)
	claim := func() []leasing.Lease {
		l, err := store.Claim(ctx, leasing.ClaimRequest{Owner: "w", BatchSize: 10, LeaseFor: time.Minute})
		require.NoError(t, err)
		require.Len(t, l, 1)
		return l
	}
	m := plainMessage(q)
	m.ID = uuid.New()
	_, err = store.Enqueue(ctx, m)
	require.NoError(t, err)
	old = claim()[0]
	w, err := store.Complete(ctx, old)
	require.NoError(t, err)
	require.NoError(t, w.Err())
	clock.Advance(time.Hour)
	_, err = store.Purge(ctx, leasing.PurgeRequest{OlderThan: time.Minute, BatchSize: 10})
	require.NoError(t, err)

	keyed, after := m, plainMessage(q)
	keyed.OrderingKey, after.OrderingKey = "k", "k"
	res, err := store.Enqueue(ctx, keyed, after)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, "UPDATE "+q.Table()+" SET lease_generation = $1 WHERE message_id = $2", old.Generation-1, m.ID)
	require.NoError(t, err)
	require.Equal(t, old.Generation, claim()[0].Generation)
	return pool, store, old, res.IDs[1]
}

// TestOrderingKeyCompleteTxOfAPurgedIncarnation: CompleteTx with a lease
// of a purged row whose id was enqueued again, keyed, and claimed by an
// owner of the same name, frees the new row's key in the caller's
// transaction, though the lease names no key (see Lease).
func TestOrderingKeyCompleteTxOfAPurgedIncarnation(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := dbtest.DatabaseURL(t)
	for _, q := range queuesBoth {
		pool, store, old, next := purgedIncarnation(t, url, q, leasing.PostgresOptions{})

		tx, err := pool.Begin(ctx)
		require.NoError(t, err)
		w, err := store.CompleteTx(ctx, tx, old)
		require.NoError(t, err)
		require.NoError(t, w.Err())
		claim := leasing.ClaimRequest{Owner: "w", BatchSize: 10, LeaseFor: time.Minute}
		none, err := store.Claim(ctx, claim)
		require.NoError(t, err)
		require.Empty(t, none, "the key is freed when tx commits")
		require.NoError(t, tx.Commit(ctx))
		l, err := store.Claim(ctx, claim)
		require.NoError(t, err)
		require.Equal(t, []uuid.UUID{next}, ids(l), "the new row's key is free")
	}
}

// TestOrderingKeyUnnamedKeyNotFreed: when freeing the key of a row that a
// lease naming no key finished fails (an open enqueue of the key holds
// its row past the lock timeout), the committed write says so with an
// error that is not ErrLockTimeout, which means nothing changed;
// CompleteAndClaim returns its leases beside it; and sending the write
// again frees the key.
func TestOrderingKeyUnnamedKeyNotFreed(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := dbtest.DatabaseURL(t)
	writes := []func(store *leasing.Postgres, old leasing.Lease) (leasing.WriteResult, []leasing.Lease, error){
		func(store *leasing.Postgres, old leasing.Lease) (leasing.WriteResult, []leasing.Lease, error) {
			res, err := store.Complete(ctx, old)
			return res, nil, err
		},
		func(store *leasing.Postgres, old leasing.Lease) (leasing.WriteResult, []leasing.Lease, error) {
			return store.CompleteAndClaim(ctx, []leasing.Lease{old}, leasing.ClaimRequest{Owner: "w2", BatchSize: 10, LeaseFor: time.Minute})
		},
	}
	for _, q := range queuesBoth {
		for i, write := range writes {
			pool, store, old, next := purgedIncarnation(t, url, q, leasing.PostgresOptions{LockTimeout: 100 * time.Millisecond})
			free := plainMessage(q)
			_, err := store.Enqueue(ctx, free)
			require.NoError(t, err)
			tx, err := pool.Begin(ctx)
			require.NoError(t, err)
			defer func() { _ = tx.Rollback(ctx) }() // a failed assertion must not leave the key held
			held := plainMessage(q)
			held.OrderingKey = "k"
			_, err = store.EnqueueTx(ctx, tx, held)
			require.NoError(t, err)

			res, leases, err := write(store, old)
			require.ErrorContains(t, err, "committed", "write %d", i)
			require.NotErrorIs(t, err, leasing.ErrLockTimeout, "write %d: it changed the row", i)
			require.Equal(t, []leasing.Outcome{leasing.OutcomeApplied}, []leasing.Outcome{res.Outcomes[0].Outcome})
			row, err := store.Get(ctx, old.Message.ID)
			require.NoError(t, err)
			require.Equal(t, q.Succeeded(), row.Status)
			if i == 1 {
				require.Len(t, leases, 1, "the claim's leases come with the error")
				w, err := store.Complete(ctx, leases...)
				require.NoError(t, err)
				require.NoError(t, w.Err())
			}
			require.NoError(t, tx.Rollback(ctx))

			again, err := store.Complete(ctx, old)
			require.NoError(t, err)
			require.Equal(t, leasing.OutcomeAlreadyApplied, again.Outcomes[0].Outcome)
			l, err := store.Claim(ctx, leasing.ClaimRequest{Owner: "w", BatchSize: 10, LeaseFor: time.Minute})
			require.NoError(t, err)
			require.Contains(t, ids(l), next, "write %d: sent again, it freed the key", i)
			w, err := store.Complete(ctx, l...)
			require.NoError(t, err)
			require.NoError(t, w.Err())
		}
	}
}

// TestOrderingKeyConcurrentEnqueuesCommitOrder: enqueues of one key from
// concurrent transactions take their places in commit order. The first
// transaction enqueues and holds its commit; the second, started later,
// waits for the key's row and is placed behind it even though the first
// commits last of the two begins.
func TestOrderingKeyConcurrentEnqueuesCommitOrder(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := dbtest.DatabaseURL(t)
	pool := newPool(t, url, "ordering-concurrent", 4)
	store, err := leasing.NewPostgres(pool, leasing.Outbox, leasing.PostgresOptions{})
	require.NoError(t, err)

	tx1, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx1.Rollback(ctx) }()
	first, err := store.EnqueueTx(ctx, tx1, leasing.NewMessage{Payload: []byte("first"), OrderingKey: "k"})
	require.NoError(t, err)

	second := make(chan uuid.UUID, 1)
	go func() {
		res, err := store.Enqueue(ctx, leasing.NewMessage{Payload: []byte("second"), OrderingKey: "k"})
		if err != nil {
			t.Error(err)
			close(second)
			return
		}
		second <- res.IDs[0]
	}()
	select {
	case <-second:
		t.Fatal("the second enqueue did not wait for the first transaction's key row")
	case <-time.After(300 * time.Millisecond):
	}
	require.NoError(t, tx1.Commit(ctx))
	id2 := <-second
	r1, err := store.Get(ctx, first.IDs[0])
	require.NoError(t, err)
	r2, err := store.Get(ctx, id2)
	require.NoError(t, err)
	require.Less(t, r1.KeySeq, r2.KeySeq, "commit order")
	require.True(t, r2.CreatedAt.After(r1.CreatedAt))
	require.Equal(t, leasing.StatusPending, r1.Status)
	require.Equal(t, leasing.StatusWaiting, r2.Status)
}

// TestOrderingKeyEnqueueCopy: messages bulk-loaded with EnqueueCopy take
// their places in their keys' lines in the caller's transaction, in input
// order, behind the messages the key already has.
func TestOrderingKeyEnqueueCopy(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := newPool(t, dbtest.DatabaseURL(t), "ordering-copy", 2)
	store, err := leasing.NewPostgres(pool, leasing.Inbox, leasing.PostgresOptions{})
	require.NoError(t, err)
	first, err := store.Enqueue(ctx, leasing.NewMessage{OrderingKey: "k"})
	require.NoError(t, err)
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	ids, err := store.EnqueueCopy(ctx, tx, leasing.NewMessage{OrderingKey: "k"}, leasing.NewMessage{OrderingKey: "k"},
		leasing.NewMessage{OrderingKey: "j"}, leasing.NewMessage{})
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
	want := [][]string{{first.IDs[0].String(), ids[2].String(), ids[3].String()}, {ids[0].String()}, {ids[1].String()}}
	for _, w := range want {
		leases, err := store.Claim(ctx, leasing.ClaimRequest{Owner: "w", BatchSize: 10, LeaseFor: time.Minute})
		require.NoError(t, err)
		var got []string
		for _, l := range leases {
			got = append(got, l.Message.ID.String())
		}
		require.ElementsMatch(t, w, got)
		res, err := store.Complete(ctx, leases...)
		require.NoError(t, err)
		require.NoError(t, res.Err())
	}
}

// TestOrderingKeyOpenProducerDelaysOnlyItsKey: a producer transaction that
// enqueued to a key and stays open holds the key's row, so the write that
// finishes that key's head waits for it (up to LockTimeout a try). A
// processor whose batch holds that head beside unkeyed messages and
// another key's head still writes those at once, and delivers none of them
// twice; once the producer commits, the key goes on in order.
func TestOrderingKeyOpenProducerDelaysOnlyItsKey(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := dbtest.DatabaseURL(t)
	pool := newPool(t, url, "ordering-open-producer", 4)
	store, err := leasing.NewPostgres(pool, leasing.Outbox, leasing.PostgresOptions{LockTimeout: 200 * time.Millisecond})
	require.NoError(t, err)
	res, err := store.Enqueue(ctx,
		leasing.NewMessage{Topic: "t", OrderingKey: "held"}, leasing.NewMessage{Topic: "t"},
		leasing.NewMessage{Topic: "t", OrderingKey: "free"}, leasing.NewMessage{Topic: "t"})
	require.NoError(t, err)
	head, others := res.IDs[0], res.IDs[1:]

	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	behind, err := store.EnqueueTx(ctx, tx, leasing.NewMessage{Topic: "t", OrderingKey: "held"})
	require.NoError(t, err)

	var mu sync.Mutex
	delivered := map[uuid.UUID]int{}
	var order []uuid.UUID
	// The outcomes of the held head, the other key's head and one
	// unkeyed message meet in one write: the first write (the other
	// unkeyed message's) is slowed down while they arrive.
	var started sync.WaitGroup
	started.Add(4)
	first := others[0]
	p, err := processor.New(&slowFirstComplete{Postgres: store, delay: 400 * time.Millisecond}, func(ctx context.Context, l leasing.Lease) error {
		mu.Lock()
		delivered[l.Message.ID]++
		order = append(order, l.Message.ID)
		again := delivered[l.Message.ID] > 1
		mu.Unlock()
		if !again {
			started.Done()
			started.Wait()
			if l.Message.ID != first {
				time.Sleep(100 * time.Millisecond)
			}
		}
		return nil
	}, processor.Options{BatchSize: 10, Concurrency: 4, LeaseDuration: 2 * time.Second, PollInterval: 20 * time.Millisecond})
	require.NoError(t, err)
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- p.Run(runCtx) }()
	defer func() { stop(); <-done }()

	status := func(id uuid.UUID) leasing.Status {
		r, err := store.Get(ctx, id)
		require.NoError(t, err)
		return r.Status
	}
	require.Eventually(t, func() bool {
		for _, id := range others {
			if status(id) != leasing.StatusPublished {
				return false
			}
		}
		return true
	}, 10*time.Second, 10*time.Millisecond, "the unkeyed messages and the other key publish while the producer is open")
	require.Equal(t, leasing.StatusPublishing, status(head), "the held key's head waits for the producer")

	require.NoError(t, tx.Commit(ctx))
	require.Eventually(t, func() bool { return status(behind.IDs[0]) == leasing.StatusPublished }, 60*time.Second,
		20*time.Millisecond, "the key goes on once the producer commits")
	require.Equal(t, leasing.StatusPublished, status(head))
	mu.Lock()
	defer mu.Unlock()
	for _, id := range others {
		require.Equal(t, 1, delivered[id], "delivered once: %s", id)
	}
	require.Less(t, slices.Index(order, head), slices.Index(order, behind.IDs[0]), "the head before the message behind it")
}

// slowFirstComplete is a store whose first Complete call takes delay
// longer, so that the outcomes submitted meanwhile meet in the next write.
type slowFirstComplete struct {
	*leasing.Postgres
	delay time.Duration
	once  sync.Once
}

func (s *slowFirstComplete) Complete(ctx context.Context, leases ...leasing.Lease) (leasing.WriteResult, error) {
	s.once.Do(func() { time.Sleep(s.delay) })
	return s.Postgres.Complete(ctx, leases...)
}

// TestStrictOrderingOffFreesHeadsInFlight: a dead letter of a keyed head
// that read strict ordering on and has not committed when
// SetStrictOrdering(false) commits still has its key freed by that call,
// which waits for it. The dead letter's commit is held on an advisory lock
// the test owns (a deferred trigger), released only once
// SetStrictOrdering has returned or waits for the head.
func TestStrictOrderingOffFreesHeadsInFlight(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := dbtest.NewPool(t)
	store, err := leasing.NewPostgres(pool, leasing.Inbox, leasing.PostgresOptions{})
	require.NoError(t, err)
	require.NoError(t, store.SetStrictOrdering(ctx, true))
	res, err := store.Enqueue(ctx, leasing.NewMessage{OrderingKey: "k"}, leasing.NewMessage{OrderingKey: "k"})
	require.NoError(t, err)
	head, err := store.Claim(ctx, leasing.ClaimRequest{Owner: "w", BatchSize: 10, LeaseFor: time.Minute})
	require.NoError(t, err)
	require.Len(t, head, 1)

	const gate = 7301 // advisory lock key, this database's own
	_, err = pool.Exec(ctx, `
CREATE FUNCTION gate_dead_letter() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.status = 'dead_lettered' THEN PERFORM pg_advisory_xact_lock_shared(7301); END IF;
    RETURN NULL;
END $$;
CREATE CONSTRAINT TRIGGER gate_dead_letter AFTER UPDATE ON inbox_messages
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION gate_dead_letter()`)
	require.NoError(t, err)
	holder, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer holder.Release()
	_, err = holder.Exec(ctx, "SELECT pg_advisory_lock($1)", gate)
	require.NoError(t, err)

	waiting := func(query string) bool {
		var n int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%' || $1 || '%'`, query).Scan(&n))
		return n > 0
	}
	deadLettered := make(chan error, 1)
	go func() {
		_, err := store.DeadLetter(ctx, leasing.Failure{Lease: head[0], Error: "boom"})
		deadLettered <- err
	}()
	require.Eventually(t, func() bool { return waiting("CommitCall") }, 10*time.Second, 5*time.Millisecond,
		"the dead letter waits to commit, strict ordering read on")
	turnedOff := make(chan error, 1)
	go func() { turnedOff <- store.SetStrictOrdering(ctx, false) }()
	var returned bool
	require.Eventually(t, func() bool {
		select {
		case err := <-turnedOff:
			turnedOff <- err
			returned = true
		default:
		}
		return returned || waiting("DeadLetteredHeads")
	}, 10*time.Second, 5*time.Millisecond)
	require.False(t, returned, "SetStrictOrdering(false) returned before the dead letter in flight committed")
	_, err = holder.Exec(ctx, "SELECT pg_advisory_unlock($1)", gate)
	require.NoError(t, err)
	require.NoError(t, <-deadLettered)
	require.NoError(t, <-turnedOff)

	next, err := store.Claim(ctx, leasing.ClaimRequest{Owner: "w", BatchSize: 10, LeaseFor: time.Minute})
	require.NoError(t, err)
	require.Len(t, next, 1, "the key's next message is claimable")
	require.Equal(t, res.IDs[1], next[0].Message.ID)
}
