package bench

import (
	"context"

	"github.com/jackc/pgx/v5/pgxpool"
)

// databaseCPUSince starts measuring the CPU time of the server behind
// pool (DatabaseCPU); the function it returns gives the seconds used
// since, 0 where the server's CPU time is not read.
func databaseCPUSince(ctx context.Context, pool *pgxpool.Pool) func() float64 {
	start, known := DatabaseCPU(ctx, pool)
	return func() float64 {
		end, ok := DatabaseCPU(ctx, pool)
		if !known || !ok {
			return 0
		}
		return (end - start).Seconds()
	}
}
