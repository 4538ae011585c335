package integration

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/leasestore/leasestore/integration/dbtest"
	"github.com/leasestore/leasestore/internal/bench"
	"github.com/leasestore/leasestore/leasing"
)

// TestBenchRun runs a small bench end to end on both queues, pgbench
// baseline included when pgbench is installed, and requires both drains to
// verify: every message completed exactly once, other rows untouched.
func TestBenchRun(t *testing.T) {
	t.Parallel()
	for _, q := range []leasing.Queue{leasing.Inbox, leasing.Outbox} {
		t.Run(string(q), func(t *testing.T) {
			t.Parallel()
			var out bytes.Buffer
			res, err := bench.Run(t.Context(), bench.Config{
				AdminURL: dbtest.URL(t), Queue: q, Messages: 1_000, TerminalRows: 500, DeferredRows: 50,
				ExpiredLeases: 20, Workers: 3, BatchSize: 7, SampleEvery: 200,
			}, &out)
			require.NoError(t, err, out.String())
			t.Log(out.String())
			require.Equal(t, 1_020, res.Drained)
			require.NotNil(t, res.API)
			require.True(t, res.API.Verified, res.API.Problem)
			require.Positive(t, res.API.MessagesPerSecond)
			require.Equal(t, 10, res.Clean.Rows)
			require.False(t, res.Clean.SortOverEligible)
			require.NotNil(t, res.Steady)
			if res.Raw == nil {
				t.Logf("pgbench baseline skipped: %s", res.RawSkipped)
				return
			}
			require.True(t, res.Raw.Verified, res.Raw.Problem)
			require.Positive(t, res.APIVsRaw)
		})
	}
}
