package leasing_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/leasestore/leasestore/internal/bench"
	"github.com/leasestore/leasestore/leasing"
	"github.com/leasestore/leasestore/leasing/processor"
)

// benchBrokerRoundTrip is the simulated broker's time per call, whatever
// the number of messages in it.
const benchBrokerRoundTrip = time.Millisecond

// BenchmarkBatchHandler measures a relay's throughput with the batch
// handler beside the single-message form: one processor drains 20,000 due
// inbox messages (the code path is the outbox's too) through a simulated
// broker whose every call takes benchBrokerRoundTrip, one message a call
// for processor.New, up to BatchSize a call for processor.NewBatch. One op
// is one drain, refilled off the clock, from Run to Run returned; it
// checks that every message was completed and reports messages/s, broker
// calls per drain and the test process's CPU time per message.
func BenchmarkBatchHandler(b *testing.B) {
	for _, c := range []struct {
		form               string
		batch, concurrency int
	}{
		{"single", 100, 4}, {"single", 100, 100},
		{"batch", 100, 1}, {"batch", 100, 4},
	} {
		b.Run(fmt.Sprintf("form=%s/batch=%d/concurrency=%d", c.form, c.batch, c.concurrency), func(b *testing.B) {
			ctx := context.Background()
			pool := benchPool(b)
			const n = 20_000
			var drained, cpu time.Duration
			var calls atomic.Int64
			for range b.N {
				b.StopTimer()
				benchRefill(b, pool, n)
				b.StartTimer()
				var handled atomic.Int64
				all := make(chan struct{})
				done := func(k int) {
					if handled.Add(int64(k)) == n {
						close(all)
					}
				}
				store, err := leasing.NewPostgres(pool, leasing.Inbox, leasing.PostgresOptions{})
				require.NoError(b, err)
				opts := processor.Options{
					BatchSize: c.batch, Concurrency: c.concurrency, PollInterval: 10 * time.Millisecond,
					OnError: func(err error) { b.Error(err) },
				}
				var p *processor.Processor
				if c.form == "batch" {
					p, err = processor.NewBatch(store, func(_ context.Context, leases []leasing.Lease) []error {
						calls.Add(1)
						time.Sleep(benchBrokerRoundTrip)
						done(len(leases))
						return make([]error, len(leases))
					}, opts)
				} else {
					p, err = processor.New(store, func(context.Context, leasing.Lease) error {
						calls.Add(1)
						time.Sleep(benchBrokerRoundTrip)
						done(1)
						return nil
					}, opts)
				}
				require.NoError(b, err)
				cpu0, _ := bench.ProcessCPU()
				drained += runUntil(b, p, all)
				cpu1, _ := bench.ProcessCPU()
				cpu += cpu1 - cpu0
				var left int
				require.NoError(b, pool.QueryRow(ctx, "SELECT count(*) FROM inbox_messages WHERE status <> 'completed'").Scan(&left))
				require.Zero(b, left, "messages not completed")
			}
			b.ReportMetric(float64(n*b.N)/drained.Seconds(), "msgs/s")
			b.ReportMetric(float64(calls.Load())/float64(b.N), "broker-calls/op")
			b.ReportMetric(float64(cpu.Microseconds())/float64(n*b.N), "client-µs/msg")
		})
	}
}
