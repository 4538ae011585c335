package bench_test

import (
	"net/url"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/leasestore/leasestore/internal/bench"
	"github.com/leasestore/leasestore/internal/dbtest"
)

// TestDatabaseCPU reads the server's CPU time around a statement that
// counts ten million rows, and requires the count's CPU in it. Where the
// server is another machine's the figure is unknown (false); on Linux, a
// server at a loopback address must be read.
func TestDatabaseCPU(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	before, known := bench.DatabaseCPU(t.Context(), pool)
	if !known {
		require.False(t, serverHere(t), "the server runs here, but its CPU time was not read")
		t.Skip("the server's CPU time is not read from this machine")
	}
	var n int64
	require.NoError(t, pool.QueryRow(t.Context(), "SELECT count(*) FROM generate_series(1, 10000000)").Scan(&n))
	require.EqualValues(t, 10_000_000, n)
	after, known := bench.DatabaseCPU(t.Context(), pool)
	require.True(t, known)
	require.GreaterOrEqual(t, after-before, 100*time.Millisecond, "the count's CPU time, at least")
}

// serverHere reports whether the tests' server runs on this Linux
// machine (a loopback address), whose CPU time DatabaseCPU must read.
func serverHere(t *testing.T) bool {
	u, err := url.Parse(dbtest.URL(t))
	require.NoError(t, err)
	switch u.Hostname() {
	case "127.0.0.1", "localhost", "::1":
		return runtime.GOOS == "linux"
	}
	return false
}
