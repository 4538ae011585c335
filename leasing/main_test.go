package leasing_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests when a goroutine outlives them, such
// as one the contract suite starts to contend for leases.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
