package leasing

import (
	"context"
	"errors"
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

	// A cause given to the context does not hide the context's error.
	ctx, cancelCause := context.WithCancelCause(t.Context())
	cancelCause(errors.New("shutting down"))
	require.ErrorIs(t, s.schemaReady(ctx), context.Canceled)

	// The waiter goes on once the running check ends, and finds it passed.
	done := make(chan error, 1)
	go func() { done <- s.schemaReady(t.Context()) }()
	s.schemaOK.Store(true)
	<-s.schemaTurn
	require.NoError(t, <-done)
	require.Empty(t, s.schemaTurn, "the waiter gives its turn back")
	require.NoError(t, s.schemaReady(ctx), "a passed check needs no turn, even with an ended context")
}
