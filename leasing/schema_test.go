package leasing

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
)

// A call that finds another call's schema check running waits only as
// long as its own context allows, and a store whose check passed never
// waits.
func TestSchemaReadyWaitEndsWithTheCallersContext(t *testing.T) {
	s := &Postgres{schemaTurn: make(chan struct{}, 1)}
	s.schemaTurn <- struct{}{} // another call's check is running
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	err := s.schemaReady(ctx)
	require.ErrorIs(t, err, context.Canceled)
	require.ErrorContains(t, err, "wait for the schema check")
	require.Len(t, s.schemaTurn, 1, "the waiter must not take or release the running check's turn")

	s.schemaOK.Store(true)
	require.NoError(t, s.schemaReady(ctx))
}
