package leasing_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/leasestore/leasestore/gen"
	"github.com/leasestore/leasestore/internal/bench"
	"github.com/leasestore/leasestore/internal/dbtest"
	"github.com/leasestore/leasestore/internal/explain"
	"github.com/leasestore/leasestore/leasing"
	"github.com/leasestore/leasestore/leasing/processor"
)

// benchPool returns a pool on a fresh, migrated database whose connections
// send uuids in binary (leasing.RegisterTypes), as the README recommends.
func benchPool(tb testing.TB) *pgxpool.Pool {
	tb.Helper()
	return benchPoolAt(tb, dbtest.DatabaseURL(tb))
}

// benchPoolAt is benchPool on the database at url.
func benchPoolAt(tb testing.TB, url string) *pgxpool.Pool {
	tb.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	require.NoError(tb, err)
	cfg.AfterConnect = leasing.RegisterTypes
	pool, err := pgxpool.NewWithConfig(tb.Context(), cfg)
	require.NoError(tb, err)
	tb.Cleanup(pool.Close)
	return pool
}

// benchFill inserts due pending inbox rows and, before them in FIFO order,
// terminal (completed) rows, with generate_series, then VACUUM ANALYZE.
func benchFill(tb testing.TB, pool *pgxpool.Pool, due, terminal int) {
	tb.Helper()
	ctx := context.Background()
	_, err := pool.Exec(ctx, `
		INSERT INTO inbox_messages (message_id, payload, created_at, visible_after, status,
		                            lease_owner, lease_generation, attempt_count, completed_at)
		SELECT gen_random_uuid(), '\x01', c, c, 'completed', 'bench', 1, 1, c
		FROM (SELECT now() - interval '30 days' + g * interval '1 millisecond' AS c
		      FROM generate_series(1, $1::int) AS g) AS s`, terminal)
	require.NoError(tb, err)
	benchRefill(tb, pool, due)
}

// benchRefill adds n due pending inbox rows after every existing row.
func benchRefill(tb testing.TB, pool *pgxpool.Pool, n int) {
	tb.Helper()
	ctx := context.Background()
	_, err := pool.Exec(ctx, `
		INSERT INTO inbox_messages (message_id, payload, created_at, visible_after)
		SELECT gen_random_uuid(), '\x01', c, c
		FROM (SELECT now() - interval '10 days' + g * interval '1 millisecond' AS c
		      FROM generate_series(1, $1::int) AS g) AS s`, n)
	require.NoError(tb, err)
	_, err = pool.Exec(ctx, "VACUUM (ANALYZE) inbox_messages")
	require.NoError(tb, err)
}

// BenchmarkClaim measures one claim of 10 through the generated statement
// at a fixed backlog: each claim runs in a transaction that is rolled back,
// so every iteration sees the same table. It reports the plan's shared
// buffers per claim (buffers/op) from explain.Claim.
func BenchmarkClaim(b *testing.B) {
	for _, shape := range []struct{ due, terminal int }{{10_000, 0}, {100_000, 100_000}} {
		b.Run(fmt.Sprintf("due=%d/terminal=%d/batch=10", shape.due, shape.terminal), func(b *testing.B) {
			ctx := context.Background()
			pool := benchPool(b)
			benchFill(b, pool, shape.due, shape.terminal)
			plan, err := explain.Claim(ctx, pool, leasing.Inbox, 10, explain.Options{})
			require.NoError(b, err)
			conn, err := pool.Acquire(ctx)
			require.NoError(b, err)
			defer conn.Release()
			q := gen.New()
			params := gen.InboxClaimParams{BatchSize: 10, LeaseOwner: "bench", LeaseFor: time.Minute}

			b.ResetTimer()
			for b.Loop() {
				tx, err := conn.Begin(ctx)
				require.NoError(b, err)
				rows, err := q.InboxClaim(ctx, tx, params)
				require.NoError(b, err)
				require.Len(b, rows, 10)
				require.NoError(b, tx.Rollback(ctx))
			}
			b.ReportMetric(float64(plan.Buffers), "buffers/op")
		})
	}
}

// benchLoopRows is how many due rows the drain-loop benchmarks fill and
// refill at a time.
const benchLoopRows = 20_000

// benchLoopStore returns a benchPool filled with benchLoopRows due inbox
// rows and the inbox store on it.
func benchLoopStore(b *testing.B) (*pgxpool.Pool, *leasing.Postgres) {
	b.Helper()
	pool := benchPool(b)
	benchFill(b, pool, benchLoopRows, 0)
	store, err := leasing.NewPostgres(pool, leasing.Inbox, leasing.PostgresOptions{})
	require.NoError(b, err)
	return pool, store
}

// BenchmarkClaimComplete measures the drain loop of one worker through the
// leasing API: Claim of a batch, then one Complete of the batch, each in
// its own transaction (synchronous commit as the server is set). The table
// is refilled, off the clock, whenever it runs dry. It reports messages/s.
func BenchmarkClaimComplete(b *testing.B) {
	for _, batch := range []int{1, 10, 100} {
		b.Run(fmt.Sprintf("batch=%d", batch), func(b *testing.B) {
			ctx := context.Background()
			pool, store := benchLoopStore(b)
			req := leasing.ClaimRequest{Owner: leasing.NewOwner("bench"), BatchSize: batch, LeaseFor: time.Minute}

			var messages int
			b.ResetTimer()
			for b.Loop() {
				leases, err := store.Claim(ctx, req)
				require.NoError(b, err)
				if len(leases) == 0 {
					b.StopTimer()
					benchRefill(b, pool, benchLoopRows)
					b.StartTimer()
					continue
				}
				res, err := store.Complete(ctx, leases...)
				require.NoError(b, err)
				require.NoError(b, res.Err())
				messages += len(leases)
			}
			b.ReportMetric(float64(messages)/b.Elapsed().Seconds(), "msgs/s")
		})
	}
}

// BenchmarkCompleteAndClaim measures the same loop with one
// CompleteAndClaim call per batch: the previous batch's complete and the
// next claim in one round trip and one commit. It reports messages/s.
func BenchmarkCompleteAndClaim(b *testing.B) {
	for _, batch := range []int{1, 10, 100} {
		b.Run(fmt.Sprintf("batch=%d", batch), func(b *testing.B) {
			ctx := context.Background()
			pool, store := benchLoopStore(b)
			req := leasing.ClaimRequest{Owner: leasing.NewOwner("bench"), BatchSize: batch, LeaseFor: time.Minute}

			b.ResetTimer()
			messages := completeAndClaimLoop(ctx, b, store, pool, req)
			b.ReportMetric(float64(messages)/b.Elapsed().Seconds(), "msgs/s")
		})
	}
}

// completeAndClaimLoop runs the CompleteAndClaim loop for b.Loop(): each
// call completes the previous batch and claims the next under req, and the
// table behind pool is refilled off the clock whenever a claim comes back
// empty. It returns how many messages were completed.
func completeAndClaimLoop(ctx context.Context, b *testing.B, store *leasing.Postgres, pool *pgxpool.Pool, req leasing.ClaimRequest) int {
	var messages int
	var held []leasing.Lease
	for b.Loop() {
		res, next, err := store.CompleteAndClaim(ctx, held, req)
		require.NoError(b, err)
		require.NoError(b, res.Err())
		messages += len(held)
		held = next
		if len(held) == 0 {
			b.StopTimer()
			benchRefill(b, pool, benchLoopRows)
			b.StartTimer()
		}
	}
	return messages
}

// BenchmarkProcessorDrain measures what Processor users get: four
// processors on one pool (leasing.RegisterTypes) drain 50,000 due inbox
// messages with a handler that returns at once, batch 100, each holding up
// to Concurrency leases. One op is one drain, refilled off the clock, from
// Run to every Run returned (the last outcomes are written at shutdown); it
// checks that every message was completed and reports messages/s and the
// test process's CPU time per message (client-µs/msg: the processors, the
// pool and the Go runtime; on a machine whose cores the client shares with
// the server, CPU the server does not get). The merge variant sets
// MergeCompletions.
func BenchmarkProcessorDrain(b *testing.B) {
	for _, shape := range []struct {
		concurrency int
		merge       bool
	}{{100, false}, {1_000, false}, {100, true}} {
		name := fmt.Sprintf("concurrency=%d", shape.concurrency)
		if shape.merge {
			name += ",merge"
		}
		b.Run(name, func(b *testing.B) {
			ctx := context.Background()
			pool := benchPool(b)
			const n = 50_000
			var drained, cpu time.Duration
			for range b.N {
				b.StopTimer()
				benchRefill(b, pool, n)
				b.StartTimer()
				var handled atomic.Int64
				all := make(chan struct{})
				handler := func(context.Context, leasing.Lease) error {
					if handled.Add(1) == n {
						close(all)
					}
					return nil
				}
				runCtx, stop := context.WithCancel(ctx)
				var wg sync.WaitGroup
				cpu0, _ := bench.ProcessCPU()
				start := time.Now()
				for range 4 {
					store, err := leasing.NewPostgres(pool, leasing.Inbox, leasing.PostgresOptions{})
					require.NoError(b, err)
					p, err := processor.New(store, handler, processor.Options{
						BatchSize: 100, Concurrency: shape.concurrency, PollInterval: 10 * time.Millisecond,
						MergeCompletions: shape.merge, OnError: func(err error) { b.Error(err) },
					})
					require.NoError(b, err)
					wg.Go(func() { _ = p.Run(runCtx) })
				}
				<-all
				stop()
				wg.Wait()
				drained += time.Since(start)
				cpu1, _ := bench.ProcessCPU()
				cpu += cpu1 - cpu0
				var left int
				require.NoError(b, pool.QueryRow(ctx, "SELECT count(*) FROM inbox_messages WHERE status <> 'completed'").Scan(&left))
				require.Zero(b, left, "messages not completed")
			}
			b.ReportMetric(float64(n*b.N)/drained.Seconds(), "msgs/s")
			b.ReportMetric(float64(cpu.Microseconds())/float64(n*b.N), "client-µs/msg")
		})
	}
}

// BenchmarkTxHandlerDrain drains 5,000 due inbox messages with one NewTx
// processor (Concurrency 16, batch 100) whose handler inserts one row in
// its transaction: one transaction and commit per message, as the
// transactional inbox runs. One op is one drain, refilled off the clock,
// from Run to Run returned; it checks that every message was completed
// once and reports messages/s.
func BenchmarkTxHandlerDrain(b *testing.B) {
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(dbtest.DatabaseURL(b))
	require.NoError(b, err)
	cfg.AfterConnect = leasing.RegisterTypes
	cfg.MaxConns = 18 // 16 handler transactions, the claims and the writer
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(b, err)
	b.Cleanup(pool.Close)
	_, err = pool.Exec(ctx, `CREATE TABLE effects (message_id uuid NOT NULL)`)
	require.NoError(b, err)
	store, err := leasing.NewPostgres(pool, leasing.Inbox, leasing.PostgresOptions{})
	require.NoError(b, err)
	const n = 5_000
	var drained time.Duration
	for range b.N {
		b.StopTimer()
		benchRefill(b, pool, n)
		_, err := pool.Exec(ctx, `TRUNCATE effects`)
		require.NoError(b, err)
		b.StartTimer()
		var handled atomic.Int64
		all := make(chan struct{})
		p, err := processor.NewTx(store, func(ctx context.Context, tx pgx.Tx, l leasing.Lease) error {
			if _, err := tx.Exec(ctx, `INSERT INTO effects (message_id) VALUES ($1)`, l.Message.ID); err != nil {
				return err
			}
			if handled.Add(1) == n {
				close(all)
			}
			return nil
		}, processor.Options{
			Concurrency: 16, BatchSize: 100, PollInterval: 10 * time.Millisecond,
			OnError: func(err error) { b.Error(err) },
		})
		require.NoError(b, err)
		drained += runUntil(b, p, all)
		b.StopTimer()
		var left, effects int
		require.NoError(b, pool.QueryRow(ctx, "SELECT count(*) FROM inbox_messages WHERE status <> 'completed'").Scan(&left))
		require.Zero(b, left, "messages not completed")
		require.NoError(b, pool.QueryRow(ctx, "SELECT count(*) FROM effects").Scan(&effects))
		require.Equal(b, n, effects, "one effect per message")
		b.StartTimer()
	}
	b.ReportMetric(float64(n*b.N)/drained.Seconds(), "msgs/s")
}

// runUntil runs p until done is closed, then stops it, and returns the
// time from Run to its return (the last outcomes written).
func runUntil(b *testing.B, p *processor.Processor, done <-chan struct{}) time.Duration {
	b.Helper()
	ctx, stop := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	start := time.Now()
	go func() { ran <- p.Run(ctx) }()
	<-done
	stop()
	require.NoError(b, <-ran)
	return time.Since(start)
}
