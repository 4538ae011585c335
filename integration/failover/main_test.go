// Package failover_test fails a PostgreSQL primary over to its streaming
// standby (integration/internal/pgcluster) while processors, a listener
// and producers run, and asserts what the store promises across the
// switch (docs/high-availability.md).
package failover_test

import (
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/leasestore/leasestore/integration/internal/pgcluster"
)

// TestMain fails the run when a goroutine outlives the tests and deletes
// the cluster template once the tests ran.
func TestMain(m *testing.M) {
	code := 0
	func() {
		defer pgcluster.Cleanup()
		defer func() {
			if err := goleak.Find(); err != nil && code == 0 {
				os.Stderr.WriteString("goleak: " + err.Error() + "\n")
				code = 1
			}
		}()
		code = m.Run()
	}()
	os.Exit(code)
}
