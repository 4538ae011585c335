package processor_test

import (
	"context"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/leasestore/leasestore/leasing"
	"github.com/leasestore/leasestore/leasing/processor"
)

// TestProcessorReportsParkedRows: a claim that parks rows (here a row at the
// attempt limit, loaded into Memory) hands its leases to the handlers as
// usual, reports a *leasing.ParkedError to OnError and counts the parked
// rows; the parked row never reaches a handler and the loop claims on.
func TestProcessorReportsParkedRows(t *testing.T) {
	t.Parallel()
	for _, q := range []leasing.Queue{leasing.Inbox, leasing.Outbox} {
		t.Run(string(q), func(t *testing.T) {
			t.Parallel()
			b := setupProcessor(t, q)
			now := b.clock.Now()
			bad := leasing.Row{
				Message: leasing.Message{ID: uuid.New(), Headers: []byte(`{}`), CreatedAt: now.Add(-time.Hour), VisibleAfter: now.Add(-time.Hour)},
				Status:  leasing.StatusPending, AttemptCount: math.MaxInt32,
			}
			require.NoError(t, b.mem.Load(bad))
			good := b.enqueue(t, 5)

			var (
				mu       sync.Mutex
				reported []error
				handled  = map[uuid.UUID]bool{}
			)
			b.start(t, nil, func(_ context.Context, l leasing.Lease) error {
				mu.Lock()
				handled[l.Message.ID] = true
				mu.Unlock()
				return nil
			}, processor.Options{BatchSize: 2, OnError: func(err error) {
				mu.Lock()
				reported = append(reported, err)
				mu.Unlock()
			}})
			for _, id := range good {
				waitFor(t, statusIs(b.mem, id, q.Succeeded()), "good message handled")
			}
			require.Equal(t, leasing.StatusDeadLettered, b.row(t, bad.ID).Status)
			mu.Lock()
			defer mu.Unlock()
			require.False(t, handled[bad.ID], "a parked row never reaches a handler")
			require.Len(t, reported, 1)
			var pe *leasing.ParkedError
			require.ErrorAs(t, reported[0], &pe)
			require.Equal(t, []leasing.ParkedRow{{ID: bad.ID, Reason: "parked by the claim: attempt_count is at its limit (2147483647)"}}, pe.Parked)
			require.Contains(t, reported[0].Error(), "processor: "+string(q)+" claim: ")
			b.requireCounters(t, map[string]int64{"processor.parked": 1, "processor.leases_acquired": 5, processor.SucceededCounter(q): 5})
		})
	}
}
