package main

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the demo's test when a goroutine outlives it: every
// processor and listener the demo starts must have returned.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
