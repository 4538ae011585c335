package processor_test

import (
	"testing"

	"github.com/leasestore/leasestore/integration/internal/e2e"
	"github.com/leasestore/leasestore/leasing"
)

// e2eQueues are the queues every end-to-end case runs on: the inbox with a
// handler, the outbox with a Publisher that publishes to an e2eBroker.
var e2eQueues = []leasing.Queue{leasing.Inbox, leasing.Outbox}

// e2eTopic is the topic of every outbox message the cases enqueue.
const e2eTopic = "orders"

// e2eWait bounds every wait for a condition (e2e.Wait).
const e2eWait = e2e.Wait

// TestProcessorEndToEnd runs processors on real PostgreSQL, for the inbox
// (handler) and the outbox (publisher and fake broker). Each case has its
// own database; every processor has its own pool. The database clock is
// pinned (PostgresOptions.Now) and stepped with a manual clock, so no case
// sleeps for a lease or a backoff to run out: leases are 30s and retry
// delays seconds of the pinned clock, while poll and heartbeat tick every
// 10ms of real time.
func TestProcessorEndToEnd(t *testing.T) {
	t.Parallel()
	for _, q := range e2eQueues {
		t.Run(string(q), func(t *testing.T) {
			t.Parallel()
			testProcessorEndToEnd(t, q)
		})
	}
}

// testProcessorEndToEnd runs every end-to-end case on queue q, topic by
// topic: delivery (processor_e2e_delivery_test.go), retries and dead letters
// (processor_e2e_retry_test.go), lease loss and heartbeat
// (processor_e2e_lease_test.go), handler timeouts
// (processor_e2e_timeout_test.go), shutdown (processor_e2e_shutdown_test.go)
// and metrics (processor_e2e_metrics_test.go). The helpers are in
// processor_e2e_setup_test.go.
func testProcessorEndToEnd(t *testing.T, q leasing.Queue) {
	testE2ESuccess(t, q)
	testE2ERetries(t, q)
	testE2ELeaseLoss(t, q)
	testE2EHandlerTimeout(t, q)
	testE2EShutdown(t, q)
	testE2EDisjointClaims(t, q)
	testE2EMetrics(t, q)
	testE2EHistograms(t, q)
	testE2ETenantScoping(t, q)
}
