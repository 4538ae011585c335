package processor_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests when a goroutine outlives them: every
// processor, worker, writer, heartbeat and listener must have returned.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
