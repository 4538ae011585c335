package reliability_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/leasestore/leasestore/leasing"
)

// TestFaultChaos runs the stress harness with faults injected; the stress
// invariants must hold (see stress_test.go).
func TestFaultChaos(t *testing.T) {
	t.Parallel()
	base := stressConfig{
		queue:     leasing.Inbox,
		messages:  pick(800, 20_000),
		workers:   16,
		lease:     300 * time.Millisecond,
		failRate:  0.1,
		slowRate:  0.02,
		crashRate: 0.02,
		timeout:   pick(90*time.Second, 30*time.Minute),
	}
	// pg_terminate_backend of a random worker connection (busy ones
	// first: claims, renews, outcome writes) every ~40ms.
	t.Run("TerminateBackends", func(t *testing.T) {
		t.Parallel()
		cfg := base
		cfg.killEvery = 40 * time.Millisecond
		res := runStress(t, cfg)
		res.report(t)
		require.NotZero(t, len(res.kills), "no backend was terminated")
	})
	// 2% of statements lose their reply after being sent: commits of
	// unknown outcome for claims, renews and outcome writes.
	t.Run("DroppedReplies", func(t *testing.T) {
		t.Parallel()
		cfg := base
		cfg.queue = leasing.Outbox
		cfg.dropReplyRate = 0.02
		res := runStress(t, cfg)
		res.report(t)
		require.NotZero(t, res.dropped, "no reply was dropped")
	})
	// A worker stops reaching the database (a crashed process) every
	// 400ms and is replaced by a fresh one.
	t.Run("WorkerCrashes", func(t *testing.T) {
		t.Parallel()
		cfg := base
		cfg.workerCrashEvery = 400 * time.Millisecond
		res := runStress(t, cfg)
		res.report(t)
		require.NotZero(t, res.workerCrashes)
	})
}

// TestFaultServerRestart restarts the whole PostgreSQL server twice during
// a stress run; the stress invariants must hold. Long form only, and not
// parallel: it breaks every session on the shared server, and Go runs it
// while this binary's parallel tests wait.
func TestFaultServerRestart(t *testing.T) {
	if !long() {
		t.Skip("restarts the shared server: long form only (-stress or LEASESTORE_STRESS=1)")
	}
	t.Cleanup(func() { ensureServerUp(t) })
	res := runStress(t, stressConfig{
		queue:         leasing.Inbox,
		messages:      20_000,
		workers:       16,
		lease:         300 * time.Millisecond,
		failRate:      0.1,
		slowRate:      0.02,
		crashRate:     0.02,
		restartAtDone: []float64{0.2, 0.6},
		timeout:       10 * time.Minute,
	})
	res.report(t)
	require.Equal(t, 2, res.restarts)
}
