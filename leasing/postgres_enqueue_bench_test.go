package leasing_test

import (
	"context"
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/leasestore/leasestore/internal/dbtest"
	"github.com/leasestore/leasestore/leasing"
)

// BenchmarkEnqueueKeys measures one Enqueue of 10,000 inbox messages, in
// its own transaction, without ordering keys and over 10, 1,000 and 5,000
// keys, on a table emptied (and vacuumed) off the clock before each op.
// It reports ms/op; the keyed target is at most 3x the unkeyed figure
// (docs/notes/2026-12-03-performance.md):
//
//	go test -run '^$' -bench BenchmarkEnqueueKeys -benchtime 5x ./leasing
func BenchmarkEnqueueKeys(b *testing.B) {
	const messages = 10_000
	for _, keys := range []int{0, 10, 1_000, 5_000} {
		b.Run(fmt.Sprintf("keys=%d", keys), func(b *testing.B) {
			ctx := context.Background()
			pool := benchPool(b)
			store, err := leasing.NewPostgres(pool, leasing.Inbox, leasing.PostgresOptions{})
			require.NoError(b, err)
			msgs := make([]leasing.NewMessage, messages)
			for b.Loop() {
				b.StopTimer()
				_, err := pool.Exec(ctx, "TRUNCATE inbox_messages, inbox_ordering_keys")
				require.NoError(b, err)
				_, err = pool.Exec(ctx, "VACUUM (ANALYZE) inbox_messages, inbox_ordering_keys")
				require.NoError(b, err)
				for i := range msgs {
					msgs[i] = leasing.NewMessage{Type: "bench", Payload: []byte{1}}
					if keys > 0 {
						msgs[i].OrderingKey = fmt.Sprintf("key-%d", i%keys)
					}
				}
				b.StartTimer()
				res, err := store.Enqueue(ctx, msgs...)
				require.NoError(b, err)
				require.Empty(b, res.Duplicates)
			}
			b.ReportMetric(float64(b.Elapsed().Milliseconds())/float64(b.N), "ms/op")
		})
	}
}

// BenchmarkProducers measures what an enqueue costs the application's own
// transaction: 8 producers each commit transactions that insert one row
// into an orders table and, but for "order only", enqueue one outbox
// message through EnqueueTx, unkeyed or over 1,000 ordering keys. No
// processor runs (the keys' lines only grow). It reports tx/s:
//
//	go test -run '^$' -bench BenchmarkProducers -benchtime 5s ./leasing
func BenchmarkProducers(b *testing.B) {
	for _, variant := range []string{"order-only", "unkeyed", "keyed"} {
		b.Run(variant, func(b *testing.B) {
			ctx := context.Background()
			cfg, err := pgxpool.ParseConfig(dbtest.DatabaseURL(b))
			require.NoError(b, err)
			cfg.MaxConns, cfg.AfterConnect = 8, leasing.RegisterTypes
			pool, err := pgxpool.NewWithConfig(ctx, cfg)
			require.NoError(b, err)
			defer pool.Close()
			_, err = pool.Exec(ctx, "CREATE TABLE orders (id bigserial PRIMARY KEY, total bigint NOT NULL)")
			require.NoError(b, err)
			store, err := leasing.NewPostgres(pool, leasing.Outbox, leasing.PostgresOptions{})
			require.NoError(b, err)
			var keySeq atomic.Int64
			b.SetParallelism(8 / runtime.GOMAXPROCS(0))
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
						if _, err := tx.Exec(ctx, "INSERT INTO orders (total) VALUES (100)"); err != nil {
							return err
						}
						if variant == "order-only" {
							return nil
						}
						m := leasing.NewMessage{Type: "order.placed", Topic: "orders", Payload: []byte(`{"total":100}`)}
						if variant == "keyed" {
							m.OrderingKey = fmt.Sprintf("customer-%d", keySeq.Add(1)%1_000)
						}
						_, err := store.EnqueueTx(ctx, tx, m)
						return err
					})
					require.NoError(b, err)
				}
			})
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "tx/s")
		})
	}
}

// BenchmarkEnqueueDuplicates measures an inbox Enqueue of batches of 10
// keyed messages: all new (the INSERT alone, as before duplicates named
// their stored messages), and all duplicates of stored messages (the
// INSERT, then the lookup of the stored ids: a second round trip). ns/op
// is one call.
func BenchmarkEnqueueDuplicates(b *testing.B) {
	for _, dup := range []bool{false, true} {
		b.Run(map[bool]string{false: "new", true: "duplicates"}[dup], func(b *testing.B) {
			store, err := leasing.NewPostgres(benchPoolAt(b, dbtest.DatabaseURL(b)), leasing.Inbox, leasing.PostgresOptions{})
			require.NoError(b, err)
			batch := func(n int) []leasing.NewMessage {
				msgs := make([]leasing.NewMessage, 10)
				for i := range msgs {
					msgs[i] = leasing.NewMessage{Type: "bench", Payload: []byte("{}"), IdempotencyKey: fmt.Sprintf("k-%d-%d", n, i)}
				}
				return msgs
			}
			if dup {
				_, err := store.Enqueue(b.Context(), batch(0)...)
				require.NoError(b, err)
			}
			b.ResetTimer()
			for n := 0; b.Loop(); n++ {
				k := n + 1
				if dup {
					k = 0
				}
				res, err := store.Enqueue(b.Context(), batch(k)...)
				if err != nil {
					b.Fatal(err)
				}
				if dup != (len(res.Duplicates) == 10) {
					b.Fatalf("%d duplicates", len(res.Duplicates))
				}
			}
		})
	}
}
