package processor_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/leasestore/leasestore/leasing"
	"github.com/leasestore/leasestore/leasing/processor"
)

// TestE2EVerdicts: on PostgreSQL, at the pinned clock, a Permanent verdict
// dead-letters on the first attempt, and RetryAfter and Unavailable release
// the message with its attempt returned, due after the delay (RetryAfter's
// capped at MaxDelay) with the error as last error.
func TestE2EVerdicts(t *testing.T) {
	t.Parallel()
	policy := processor.RetryPolicy{MaxAttempts: 5, InitialDelay: 7 * time.Second, MaxDelay: time.Minute}
	for _, q := range e2eQueues {
		t.Run(string(q), func(t *testing.T) {
			t.Parallel()
			b := e2eSetup(t, q)
			ids := b.enqueueN(t, 3)
			verdicts := map[uuid.UUID]error{
				ids[0]: processor.Permanent(errors.New("bad payload")),
				ids[1]: processor.RetryAfter(time.Hour, errors.New("slow down")),
				ids[2]: processor.Unavailable(errors.New("connection refused")),
			}
			b.newProc(t, "v", func(_ context.Context, m leasing.Message) error { return verdicts[m.ID] },
				processor.Options{RetryPolicy: policy}).run()
			b.waitStatus(t, ids[0], leasing.StatusDeadLettered)
			for _, id := range ids[1:] {
				b.waitFor(t, func() bool { r := b.peek(id); return r.Status == leasing.StatusPending && r.LastError != "" }, "released")
			}
			now := b.clock.Now()
			dead := b.row(t, ids[0])
			require.Equal(t, 1, dead.AttemptCount)
			require.Equal(t, "permanent: bad payload", dead.LastError)
			for i, want := range []time.Duration{time.Minute, 7 * time.Second} {
				r := b.row(t, ids[1+i])
				require.Zero(t, r.AttemptCount, "no attempt spent")
				require.Equal(t, verdicts[ids[1+i]].Error(), r.LastError)
				require.Equal(t, now.Add(want), r.VisibleAfter)
			}
		})
	}
}
