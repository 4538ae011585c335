// Package failover_test fails a PostgreSQL primary over to its streaming
// standby (integration/internal/pgcluster) while processors, a listener
// and producers run, and asserts what the store promises across the
// switch (docs/high-availability.md).
package failover_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/leasestore/leasestore/integration/internal/pgcluster"
	"github.com/leasestore/leasestore/internal/dbtest"
)

// TestMain fails the run when a goroutine outlives the tests, drops this
// run's databases and roles (dbtest.Main), and stops the clusters and
// deletes their directories when the run is interrupted (pgcluster.Main).
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(pgcluster.Main(dbtest.Main(m)))
}
