package processor_test

import (
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/leasestore/leasestore/internal/dbtest"
)

// TestMain runs the tests and the examples (dbtest.ExampleMain) and fails
// them when a goroutine outlives them: every processor, worker, writer,
// heartbeat and listener must have returned.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(dbtest.ExampleMain(m))
}

// examplePool returns a pool on a migrated database of the calling
// example's own, as a program would open one on its database and run
// db.MigrateUp (see dbtest.ExamplePool). Without a server the examples
// are skipped, or fail under CI=true (dbtest.ExampleMain).
func examplePool() *pgxpool.Pool { return dbtest.ExamplePool() }
