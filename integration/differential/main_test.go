package differential_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/leasestore/leasestore/internal/dbtest"
)

// TestMain fails the run when a goroutine outlives the tests, and drops
// this run's databases and roles when the run is interrupted (dbtest.Main).
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(dbtest.Main(m))
}
