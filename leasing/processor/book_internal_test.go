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

// TestBookPastDeadlineDoesNotRun: a lease whose local deadline passed
// before its handler could start (a claim that answered late) is lost
// instead of run; one within its deadline runs.
func TestBookPastDeadlineDoesNotRun(t *testing.T) {
	ev, err := newEvents(Options{}, leasing.Inbox, leasing.ClaimRequest{Owner: "o"}, false)
	require.NoError(t, err)
	b := newBook(time.Second, ev)
	late := b.track(context.Background(), []leasing.Lease{{Queue: leasing.Inbox, Owner: "o", Generation: 1, Message: leasing.Message{ID: uuid.New()}}},
		time.Now().Add(-time.Second))
	_, ok := b.advance(late[0], stateRunning)
	require.False(t, ok, "a lease past its local deadline does not run")
	require.True(t, b.isLost(late[0]))
	require.ErrorIs(t, context.Cause(late[0].ctx), leasing.ErrLeaseLost)
	require.Empty(t, b.held)

	fresh := b.track(context.Background(), []leasing.Lease{{Queue: leasing.Inbox, Owner: "o", Generation: 1, Message: leasing.Message{ID: uuid.New()}}}, time.Now())
	_, ok = b.advance(fresh[0], stateRunning)
	require.True(t, ok, "a lease within its local deadline runs")
}

// TestBookApplyRenewCountsLost: of the leases a renew found gone, only
// those the book gives up count as lost; one whose outcome is being
// written, and one already written and let go, are settled by their
// writes.
func TestBookApplyRenewCountsLost(t *testing.T) {
	ev, err := newEvents(Options{}, leasing.Inbox, leasing.ClaimRequest{Owner: "o"}, false)
	require.NoError(t, err)
	b := newBook(time.Minute, ev)
	leases := make([]leasing.Lease, 3)
	for i := range leases {
		leases[i] = leasing.Lease{Queue: leasing.Inbox, Owner: "o", Generation: 1, Message: leasing.Message{ID: uuid.New()}}
	}
	batch := append([]leasing.Lease(nil), leases...)
	hs := b.track(context.Background(), leases, time.Now())
	running, writing, written := hs[0], hs[1], hs[2]
	_, ok := b.advance(running, stateRunning)
	require.True(t, ok)
	_, ok = b.advance(writing, stateWriting)
	require.True(t, ok)
	done, ok := b.advance(written, stateWriting)
	require.True(t, ok)
	b.untrack([]pendingWrite{{h: written, kind: writeComplete, failure: leasing.Failure{Lease: done}}}, false)

	lost := b.applyRenew(batch, leasing.RenewResult{Lost: []uuid.UUID{batch[0].Message.ID, batch[1].Message.ID, batch[2].Message.ID}}, time.Now())
	require.Equal(t, 1, lost, "only the running lease is lost")
	require.True(t, b.isLost(running))
	require.False(t, b.isLost(writing), "its write's result decides")
}
