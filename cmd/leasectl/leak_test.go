package main

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/leasestore/leasestore/internal/dbtest"
)

// TestMain fails the run when a goroutine outlives the tests (serve, the
// demo and the processors the commands start), and drops this run's
// databases when the run is interrupted (dbtest.Main).
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(dbtest.Main(m))
}
