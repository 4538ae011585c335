package main

import (
	"bytes"
	"context"
	"os"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// adminURL returns the server the test may create databases on: it skips
// without one, and fails under CI=true.
func adminURL(t *testing.T) string {
	t.Helper()
	url := envOr("TEST_DATABASE_URL", envOr("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("no PostgreSQL at %s under CI: %v", url, err)
		}
		t.Skipf("no PostgreSQL at %s: %v", url, err)
	}
	_ = conn.Close(ctx)
	return url
}

func TestDemo(t *testing.T) {
	var out bytes.Buffer
	err := run(context.Background(), &out, config{AdminURL: adminURL(t), Messages: 100, Batch: 10, Lease: time.Second})
	require.NoError(t, err, out.String())
	require.Contains(t, out.String(), "PASS: the instances claimed disjoint subsets and every message finished")
	require.Contains(t, out.String(), orderingPass)
	require.Contains(t, out.String(), outagePass)
	require.Contains(t, out.String(), `msg="breaker opened`)
	require.Contains(t, out.String(), `msg="breaker closed`)
	require.Contains(t, out.String(), "order-2 event-1: attempt 2 fails; order-2 waits for its retry")
	require.Regexp(t, `(?m)^  litebus\.inbox\.queue\.depth +completed +100$`, out.String())
	require.Regexp(t, `(?m)^  litebus\.outbox\.queue\.depth +published +100$`, out.String())

	// Counter totals over both instances: 100 messages, one failing once,
	// none lost (the slow one was renewed, not reclaimed).
	totals := map[string]int{}
	for _, m := range regexp.MustCompile(`(?m)^  (litebus\.\S+) +demo/[AB] +(\d+)$`).FindAllStringSubmatch(out.String(), -1) {
		n, err := strconv.Atoi(m[2])
		require.NoError(t, err)
		totals[m[1]] += n
	}
	for _, q := range []string{"inbox", "outbox"} {
		succeeded := map[string]string{"inbox": "succeeded", "outbox": "published"}[q]
		for name, want := range map[string]int{"leases_acquired": 101, succeeded: 100, "failed": 1} {
			require.Equal(t, want, totals["litebus."+q+".processor."+name], "%s %s\n%s", q, name, out.String())
		}
		for _, name := range []string{"lease_lost", "dead_lettered", "persist_skipped", "persist_rejected"} {
			require.Zero(t, totals["litebus."+q+".processor."+name], "%s %s", q, name)
		}
	}
}
