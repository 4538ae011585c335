package reliability_test

import (
	"testing"
	"time"

	"github.com/leasestore/leasestore/leasing"
)

// Stress: at least 16 processors, each on its own pool, work one queue of
// messages with real time and short leases (no pinned clock), so that
// leases really expire and are reclaimed. Handlers randomly fail, run longer
// than a lease (the heartbeat must keep them), or crash (hang without
// renewing, so the lease expires and another worker reclaims the message).
// Every handler invocation is recorded and copied into stress_invocations
// (message_id, lease_generation, worker, started_at, finished_at,
// lease_valid_until, result) in the run's own database; every claim, renew
// and outcome write is recorded by a Store wrapper. At the end:
//
//   - every message is in exactly one terminal state (completed/published or
//     dead_lettered): none lost, none pending, failed or in flight; exactly
//     one generation wrote that terminal state, it is the row's final
//     generation and owner, and that generation's handler succeeded (or,
//     for a dead letter, failed on its last attempt);
//   - no write was applied after a newer generation of its message had been
//     claimed, and every write sent after such a reclaim was refused
//     (lost or terminal); refusals are counted;
//   - no two invocations of a message overlapped while both held a valid
//     lease: an invocation of generation g+1 started only after generation
//     g's invocation finished or its lease (last known expiry) ended;
//   - at most one invocation per (message, generation) (the table's key);
//   - attempt_count = lease_generation - applied releases, read from the
//     row's attempt history (one entry per generation, each with its
//     attempt number: +1 per claim, -1 after a release), which agrees with
//     the recorder: every release a reply reported is in it, and every one
//     no reply reported ran under a release or orphan sweep of its owner
//     that returned an error (it committed, the reply came too late or
//     not at all); no released generation ran its handler; every recorded
//     claim's generation is one the row went through.
//
// The fault tests (fault_*_test.go) run the same harness with connections
// terminated, replies dropped after the statement was sent, whole workers
// crashing, and (long form only) a server restart.
//
// The harness: the recording store (stress_recorder_test.go), the faults it
// injects (stress_faults_test.go), the run (stress_run_test.go) and the
// checks and figures (stress_check_test.go).
//
// CI: 2,000 messages, 16 workers. Long (make stress, -stress or
// LEASESTORE_STRESS=1): 100,000 messages.

func TestStress(t *testing.T) {
	t.Parallel()
	for _, q := range queuesBoth {
		t.Run(string(q), func(t *testing.T) {
			t.Parallel()
			cfg := stressConfig{
				queue:     q,
				messages:  pick(2_000, 100_000),
				workers:   16,
				lease:     300 * time.Millisecond,
				failRate:  0.15,
				slowRate:  0.02,
				crashRate: 0.02,
				timeout:   pick(60*time.Second, 30*time.Minute),
			}
			if q == leasing.Outbox {
				cfg.messages = pick(1_000, 100_000)
			}
			runStress(t, cfg).report(t)
		})
	}
}

// stressConfig is one stress run.
type stressConfig struct {
	queue    leasing.Queue
	messages int
	workers  int
	// lease is every processor's LeaseDuration; the heartbeat runs every
	// lease/4.
	lease time.Duration
	// Handler behaviour rates, per invocation (decided from a hash of
	// the message id and generation, so reruns of one attempt agree).
	failRate, slowRate, crashRate float64
	maxAttempts                   int // default 4
	// Faults.
	killEvery        time.Duration // pg_terminate_backend of a random worker backend
	dropReplyRate    float64       // per statement: the connection dies after sending it
	workerCrashEvery time.Duration // a whole worker stops talking to the database, then is replaced
	restartAtDone    []float64     // restart the PostgreSQL server when these fractions of the messages are finished, ascending (long form only)
	timeout          time.Duration
}
