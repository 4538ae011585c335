package main

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/leasestore/leasestore/internal/dbtest"
)

// TestDoctorAndBenchFlags: doctor and bench parse their own flags after
// --database-url is taken out, wherever it stands, and reject bad flags
// with exit status 2 before connecting.
func TestDoctorAndBenchFlags(t *testing.T) {
	t.Parallel()
	unreachable := unreachableURL(t)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"doctor", "--batch", "0", "--database-url", unreachable}, "batch must be"},
		{[]string{"doctor", "--database-url=" + unreachable, "--queue", "x"}, "inbox or outbox"},
		{[]string{"doctor", "--database-url", "postgres://%zz"}, "bad database URL"},
		{[]string{"doctor", "--max-oldest-due", "-1m", "--database-url", unreachable}, "--max-oldest-due must be positive, got -1m0s"},
		{[]string{"doctor", "--max-oldest-due", "0s", "--database-url", unreachable}, "--max-oldest-due must be positive"},
		{[]string{"doctor", "--max-xact-age", "-5m", "--database-url", unreachable}, "--max-xact-age must be positive"},
		{[]string{"doctor", "--max-dead-tuples", "-1", "--database-url", unreachable}, "--max-dead-tuples must be at least 1"},
		{[]string{"doctor", "--max-claim-buffers", "-1", "--database-url", unreachable}, "--max-claim-buffers must be >= 0"},
		{[]string{"bench", "--database-url", unreachable, "--rounds", "21"}, "rounds must be"},
		{[]string{"bench", "--messages", "10", "--database-url"}, "flag needs an argument"},
		{[]string{"bench", "--rounds", "0", "--database-url", unreachable}, "--rounds must not be 0"},
		{[]string{"bench", "--messages", "0", "--database-url", unreachable}, "--messages must not be 0"},
	} {
		r := leasectl(t, tc.args...)
		require.Equal(t, 2, r.code, "%v: stderr:\n%s", tc.args, r.stderr)
		require.Contains(t, r.stderr, tc.want, tc.args)
	}

	url := dbtest.DatabaseURL(t)
	r := leasectl(t, "doctor", "--json", "--database-url", url, "--queue", "inbox")
	require.Contains(t, []int{0, 1}, r.code, r.stderr) // 1 on a server with autovacuum off
	var rep struct {
		Queues []struct {
			Queue string `json:"queue"`
		} `json:"queues"`
	}
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &rep), r.stdout)
	require.Len(t, rep.Queues, 1)
	require.Equal(t, "inbox", rep.Queues[0].Queue)
}
