package processor

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/leasestore/leasestore/internal/metrictest"
	"github.com/leasestore/leasestore/leasing"
)

// blockedFails is a Store whose Fail waits for release once it has told
// entered that it was called.
type blockedFails struct {
	leasing.Store
	entered, release chan struct{}
}

func (s blockedFails) Fail(ctx context.Context, failures ...leasing.Failure) (leasing.WriteResult, error) {
	close(s.entered)
	select {
	case <-s.release:
	case <-ctx.Done():
		return leasing.WriteResult{}, ctx.Err()
	}
	res := leasing.WriteResult{}
	for _, f := range failures {
		res.Outcomes = append(res.Outcomes, leasing.MessageOutcome{MessageID: f.Lease.Message.ID, Outcome: leasing.OutcomeApplied})
	}
	return res, nil
}

// TestWriterRecordsCommittedFirst: in a batch with store writes, the
// completions that committed in their handlers' transactions are recorded
// before any store call, not behind the others and their retries.
func TestWriterRecordsCommittedFirst(t *testing.T) {
	t.Parallel()
	mem, err := leasing.NewMemory(leasing.Inbox, leasing.MemoryOptions{})
	require.NoError(t, err)
	store := blockedFails{Store: mem, entered: make(chan struct{}), release: make(chan struct{})}
	meter := metrictest.NewProvider()
	p, err := New(store, func(context.Context, leasing.Lease) error { return nil },
		Options{Meter: meter.Meter("test"), OnError: func(error) {}})
	require.NoError(t, err)
	p.completesTx = true
	book := newBook(time.Minute, p.ev)
	hs := book.track(context.Background(), []leasing.Lease{
		{Queue: leasing.Inbox, Owner: "o", Generation: 1, Message: leasing.Message{ID: uuid.New()}},
		{Queue: leasing.Inbox, Owner: "o", Generation: 1, Message: leasing.Message{ID: uuid.New()}},
	}, time.Now())
	w := newWriter(p, book, context.Background(), 8)
	failed := pendingWrite{h: hs[0], kind: writeFail, failure: leasing.Failure{Lease: *hs[0].lease, Error: "boom"}}
	committed := pendingWrite{h: hs[1], kind: writeCommitted, failure: leasing.Failure{Lease: *hs[1].lease}}

	wrote := make(chan struct{})
	go func() {
		defer close(wrote)
		w.write([]pendingWrite{failed, committed})
	}()
	<-store.entered
	succeeded := MetricName(leasing.Inbox, "processor.succeeded")
	require.EqualValues(t, 1, meter.Sum(succeeded), "the committed completion recorded before the Fail")
	close(store.release)
	<-wrote
}
