package bench_test

import (
	"bytes"
	"runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/leasestore/leasestore/internal/bench"
	"github.com/leasestore/leasestore/internal/dbtest"
	"github.com/leasestore/leasestore/leasing"
)

// TestBenchRun runs a small bench end to end on both queues (the outbox in
// two rounds), pgbench baseline included when pgbench is installed, and
// requires every drain to verify (every message completed exactly once,
// other rows untouched) and, on Linux, to report its client's CPU time,
// and the server's when the server runs here.
// With the baseline the claim-cost samples come from a drain of their own.
// The outbox's rounds also drain with processors (Config.Processors), which
// send their completions with their claims (Config.MergeCompletions).
func TestBenchRun(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		q          leasing.Queue
		rounds     int
		processors bool
	}{{leasing.Inbox, 1, false}, {leasing.Outbox, 2, true}} {
		t.Run(string(c.q), func(t *testing.T) {
			t.Parallel()
			var out bytes.Buffer
			res, err := bench.Run(t.Context(), bench.Config{
				AdminURL: dbtest.URL(t), Queue: c.q, Messages: 1_000, TerminalRows: 500, DeferredRows: 50,
				ExpiredLeases: 20, Workers: 3, BatchSize: 7, SampleEvery: 200, Rounds: c.rounds, Processors: c.processors,
				MergeCompletions: c.processors,
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
			require.Len(t, res.Rounds, c.rounds)
			for _, r := range res.Rounds {
				require.Equal(t, c.processors, r.Processor != nil)
			}
			require.Equal(t, c.processors, res.MergedCompletions)
			require.Equal(t, c.processors, strings.Contains(out.String(), "completions merged with claims"))
			for _, d := range res.Drains() {
				require.True(t, d.Verified, "%s: %s", d.Method, d.Problem)
				if runtime.GOOS == "linux" { // elsewhere the figure may be unknown (0)
					require.Positive(t, d.ClientCPUSeconds, "%s: client CPU of the drain", d.Method)
				}
				if serverHere(t) {
					require.Positive(t, d.DatabaseCPUSeconds, "%s: database CPU of the drain", d.Method)
				}
				if d.Method != "pgbench" {
					require.Positive(t, d.ClientBytesPerMessage, "%s: bytes the drain allocated", d.Method)
				}
			}
			if res.Raw == nil {
				t.Logf("pgbench baseline skipped: %s", res.RawSkipped)
				return
			}
			// The sampled drain ran apart from the compared rounds.
			require.NotNil(t, res.Sampled)
			drains := 1 + 2*c.rounds
			if c.processors {
				drains += c.rounds
				require.Positive(t, res.ProcessorVsRaw)
				require.Contains(t, out.String(), "processor / pgbench: ")
			}
			require.Len(t, res.Drains(), drains)
			require.Positive(t, res.APIVsRaw)
		})
	}
}

// TestBenchTopicClaim measures, with --fill-only, the claim scoped to one
// topic behind due rows of another beside the unscoped claim: it takes the
// fewer rows of that topic than its batch (so none of the others), through
// the topic index, sorting no eligible row.
func TestBenchTopicClaim(t *testing.T) {
	t.Parallel()
	for _, q := range []leasing.Queue{leasing.Inbox, leasing.Outbox} {
		t.Run(string(q), func(t *testing.T) {
			t.Parallel()
			var out bytes.Buffer
			res, err := bench.Run(t.Context(), bench.Config{
				AdminURL: dbtest.URL(t), Queue: q, Messages: 2_000, TopicRows: 4, SkipDrain: true,
			}, &out)
			require.NoError(t, err, out.String())
			t.Log(out.String())
			require.NotNil(t, res.Topic)
			require.NotNil(t, res.TopicGeneric)
			require.Equal(t, 10, res.Clean.Rows)
			require.Equal(t, 4, res.Topic.Rows)
			require.Equal(t, 4, res.TopicGeneric.Rows)
			require.False(t, res.Topic.SeqScan || res.Topic.SortOverEligible, res.Topic.Plan)
			require.Contains(t, strings.Join(res.Topic.Plan, "\n"), q.Table()+"_topic_ready_idx")
			require.Contains(t, out.String(), "claim of 10 for one topic (4 due rows of it behind the 2000 of other topics)")
		})
	}
	_, err := bench.Run(t.Context(), bench.Config{AdminURL: "-", Queue: leasing.Inbox, TopicRows: 5}, &bytes.Buffer{})
	require.ErrorContains(t, err, "--fill-only")
}

// TestBenchMergeNeedsProcessors: merged completions without processors is
// a configuration error, before anything runs.
func TestBenchMergeNeedsProcessors(t *testing.T) {
	t.Parallel()
	_, err := bench.Run(t.Context(), bench.Config{AdminURL: "-", Queue: leasing.Inbox, MergeCompletions: true}, &bytes.Buffer{})
	require.ErrorContains(t, err, "--processors")
}
