package leasing_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/leasestore/leasestore/internal/bench"
	"github.com/leasestore/leasestore/internal/dbtest"
	"github.com/leasestore/leasestore/leasing"
)

// BenchmarkQueryModes measures the processor's hot path, CompleteAndClaim
// of batches of 10 (the previous batch's complete and the next claim in one
// round trip and one commit), in each pgx query mode, connected directly
// and, in the modes that work there (poolerModes), through PgBouncer in
// transaction mode. Pools send uuids in binary (leasing.RegisterTypes).
// ns/op is one call; it reports messages/s and the test process's CPU time
// per message (client-µs/msg).
func BenchmarkQueryModes(b *testing.B) {
	for _, route := range []string{"direct", "pgbouncer"} {
		for _, mode := range queryModes {
			if route == "pgbouncer" && !slices.Contains(poolerModes, mode) {
				continue
			}
			b.Run(route+"/"+mode, func(b *testing.B) {
				ctx := context.Background()
				direct := dbtest.DatabaseURL(b)
				filler := benchPoolAt(b, direct)
				benchFill(b, filler, benchLoopRows, 0)
				u := direct
				if route == "pgbouncer" {
					u = dbtest.PgBouncerURL(b, direct)
				}
				store, err := leasing.NewPostgres(benchPoolAt(b, withQueryMode(b, u, mode)), leasing.Inbox, leasing.PostgresOptions{})
				require.NoError(b, err)
				req := leasing.ClaimRequest{Owner: leasing.NewOwner("bench"), BatchSize: 10, LeaseFor: time.Minute}

				cpu0, _ := bench.ProcessCPU()
				b.ResetTimer()
				messages := completeAndClaimLoop(ctx, b, store, filler, req)
				cpu1, _ := bench.ProcessCPU()
				b.ReportMetric(float64(messages)/b.Elapsed().Seconds(), "msgs/s")
				b.ReportMetric(float64((cpu1-cpu0).Microseconds())/float64(max(messages, 1)), "client-µs/msg")
			})
		}
	}
}
