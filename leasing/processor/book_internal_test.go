package processor

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/leasestore/leasestore/leasing"
)

// TestBookUntrackFreesLease: held leases share their claim's lease list;
// once one's outcome is written, untrack zeroes its element, so that a
// lease of the same claim still held keeps only its own message alive.
func TestBookUntrackFreesLease(t *testing.T) {
	b := newBook(time.Minute, nil)
	first, second := uuid.New(), uuid.New()
	leases := []leasing.Lease{
		{Queue: leasing.Inbox, Owner: "o", Generation: 1, Message: leasing.Message{ID: first, Payload: []byte("one")}},
		{Queue: leasing.Inbox, Owner: "o", Generation: 1, Message: leasing.Message{ID: second, Payload: []byte("two")}},
	}
	hs := b.track(context.Background(), leases, time.Now())
	written, ok := b.advance(hs[0], stateWriting)
	require.True(t, ok)
	require.Equal(t, []byte("one"), written.Message.Payload)

	b.untrack([]pendingWrite{{h: hs[0], kind: writeComplete, failure: leasing.Failure{Lease: written}}}, false)
	require.Zero(t, leases[0], "the written lease's element no longer holds its message")
	require.Equal(t, []byte("two"), b.lease(hs[1]).Message.Payload, "the other lease is still held")
	require.Equal(t, []uuid.UUID{second}, b.known())
}
