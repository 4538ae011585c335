package leasing_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/leasestore/leasestore/internal/dbtest"
	"github.com/leasestore/leasestore/leasing"
	"github.com/leasestore/leasestore/leasing/processor"
	"github.com/stretchr/testify/require"
)

// poolerQueryMode is the pgx query exec mode the README configures for a
// pool behind a transaction pooler.
const poolerQueryMode = "exec"

// poolerModes are the query exec modes that work behind PgBouncer in
// transaction mode without protocol-level prepared statements (PgBouncer
// before 1.21, or max_prepared_statements = 0). Not cache_statement, whose
// named prepared statements live in one server session, nor describe_exec,
// which prepares the unnamed statement in one round trip and binds it in
// the next, by when the pooler may have handed the session to another
// client.
var poolerModes = []string{"cache_describe", "exec", "simple_protocol"}

// TestPgBouncerContract runs the store contract through PgBouncer in
// transaction mode, with the pool configured as the README shows.
func TestPgBouncerContract(t *testing.T) {
	t.Parallel()
	runContract(t, &dbtest.RecycledDBs{Owner: t}, func(tb testing.TB, url string) string {
		return withQueryMode(tb, dbtest.PgBouncerURL(tb, url), poolerQueryMode)
	})
}

// TestPgBouncerDrain drains messages with two processors, each on its own
// pool, through PgBouncer in transaction mode in each query mode that works
// there: every message is completed exactly once and no processor reports
// an error (no claim, renew or outcome write failed, none was given up).
func TestPgBouncerDrain(t *testing.T) {
	t.Parallel()
	for _, mode := range poolerModes {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			n := 500
			if mode == poolerQueryMode {
				n = 3000
			}
			url := withQueryMode(t, dbtest.PgBouncerURL(t, dbtest.DatabaseURL(t)), mode)
			elapsed := drain(t, url, leasing.Inbox, n)
			t.Logf("%s: %d messages through pgbouncer in %s", mode, n, elapsed.Round(time.Millisecond))
		})
	}
}

// drain enqueues n messages on q at url, runs two processors (batches of
// 10, 4 handlers each, each on its own pool) until all are completed, and
// checks that each message was handled once and completed, and that the
// processors reported no error. It returns the time from start to the last
// completion.
func drain(t *testing.T, url string, q leasing.Queue, n int) time.Duration {
	t.Helper()
	ctx := t.Context()
	openPool := func() *pgxpool.Pool {
		cfg, err := pgxpool.ParseConfig(url)
		require.NoError(t, err)
		cfg.MaxConns = 4
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		require.NoError(t, err)
		t.Cleanup(pool.Close)
		return pool
	}
	seed, err := leasing.NewPostgres(openPool(), q, leasing.PostgresOptions{})
	require.NoError(t, err)
	msgs := make([]leasing.NewMessage, n)
	for i := range msgs {
		msgs[i].Payload = fmt.Appendf(nil, `{"n":%d}`, i)
	}
	res, err := seed.Enqueue(ctx, msgs...)
	require.NoError(t, err)
	require.Len(t, res.IDs, n)

	var mu sync.Mutex
	handled := make(map[uuid.UUID]int, n)
	var errs []error
	done := make(chan struct{})
	handler := func(_ context.Context, l leasing.Lease) error {
		mu.Lock()
		defer mu.Unlock()
		handled[l.Message.ID]++
		if len(handled) == n {
			select {
			case <-done:
			default:
				close(done)
			}
		}
		return nil
	}
	onError := func(err error) {
		mu.Lock()
		defer mu.Unlock()
		errs = append(errs, err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	runErrs := make(chan error, 2)
	start := time.Now()
	for _, label := range []string{"a", "b"} {
		store, err := leasing.NewPostgres(openPool(), q, leasing.PostgresOptions{})
		require.NoError(t, err)
		p, err := processor.New(store, handler, processor.Options{
			Owner: label, BatchSize: 10, Concurrency: 4, PollInterval: 20 * time.Millisecond, OnError: onError,
		})
		require.NoError(t, err)
		wg.Go(func() { runErrs <- p.Run(runCtx) })
	}
	select {
	case <-done:
	case <-time.After(2 * time.Minute):
		t.Errorf("handled %d of %d messages in 2 minutes", len(handled), n)
	}
	// Wait for the last outcomes to be written.
	require.Eventually(t, func() bool {
		st, err := seed.Stats(ctx)
		return err == nil && st.Depth[q.Succeeded()] == int64(n)
	}, time.Minute, 10*time.Millisecond)
	elapsed := time.Since(start)
	cancel()
	wg.Wait()
	close(runErrs)
	for err := range runErrs {
		require.NoError(t, err)
	}
	mu.Lock()
	defer mu.Unlock()
	require.Empty(t, errs, "processor errors")
	for _, id := range res.IDs {
		require.Equal(t, 1, handled[id], "message %s handled once", id)
	}
	return elapsed
}

// TestListenerThroughPgBouncer: through PgBouncer in transaction mode
// LISTEN succeeds and then delivers nothing. The Listener finds out with
// the notification it sends itself, reports it to OnError and Run returns
// a *ListenerUndeliveredError instead of waiting forever. Connected to
// PostgreSQL directly, the same Listener starts and wakes.
func TestListenerThroughPgBouncer(t *testing.T) {
	t.Parallel()
	direct := dbtest.DatabaseURL(t)
	for _, c := range []struct {
		name string
		url  string
	}{
		{"pgbouncer", withQueryMode(t, dbtest.PgBouncerURL(t, direct), poolerQueryMode)},
		{"direct", direct},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			cfg, err := pgx.ParseConfig(c.url)
			require.NoError(t, err)
			var mu sync.Mutex
			var reported []error
			l, err := leasing.NewListener(cfg, leasing.Inbox, leasing.ListenerOptions{
				ProbeWait: time.Second,
				OnError: func(err error) {
					mu.Lock()
					defer mu.Unlock()
					reported = append(reported, err)
				},
			})
			require.NoError(t, err)
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			ran := make(chan error, 1)
			go func() { ran <- l.Run(ctx) }()

			if c.name == "direct" {
				select {
				case <-l.Wake():
				case err := <-ran:
					t.Fatalf("Run returned %v", err)
				case <-time.After(10 * time.Second):
					t.Fatal("no wake after LISTEN within 10s")
				}
				require.NotZero(t, l.BackendPID())
				cancel()
				require.NoError(t, <-ran)
				require.Empty(t, reported)
				return
			}
			select {
			case err = <-ran:
			case <-time.After(10 * time.Second):
				t.Fatal("Run did not return within 10s behind the pooler")
			}
			var undelivered *leasing.ListenerUndeliveredError
			require.ErrorAs(t, err, &undelivered)
			require.Equal(t, leasing.Inbox.Channel(), undelivered.Channel)
			require.Equal(t, time.Second, undelivered.Waited)
			mu.Lock()
			defer mu.Unlock()
			require.Len(t, reported, 1)
			require.ErrorIs(t, reported[0], err)
			require.Zero(t, l.BackendPID())
		})
	}
}
