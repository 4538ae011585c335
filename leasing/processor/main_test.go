package processor_test

import (
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/leasestore/leasestore/internal/pgadmin"
)

// TestMain runs the tests and the examples (pgadmin.ExampleMain) and fails
// them when a goroutine outlives them: every processor, worker, writer,
// heartbeat and listener must have returned.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(pgadmin.ExampleMain(m))
}

// examplePool returns a pool on a migrated database of the calling
// example's own, as a program would open one on its database and run
// db.MigrateUp (see pgadmin.ExamplePool). Without a server the examples
// are skipped, or fail under CI=true (pgadmin.ExampleMain).
func examplePool() *pgxpool.Pool { return pgadmin.ExamplePool() }
