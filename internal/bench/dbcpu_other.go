//go:build !linux

package bench

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// DatabaseCPU reports false: the server's CPU time is read from /proc,
// on Linux only (see dbcpu_linux.go).
func DatabaseCPU(context.Context, *pgxpool.Pool) (time.Duration, bool) { return 0, false }
