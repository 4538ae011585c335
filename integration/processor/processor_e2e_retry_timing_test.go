package processor_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/leasestore/leasestore/leasing"
	"github.com/leasestore/leasestore/leasing/processor"
)

// TestE2ERetriesOnTimeWithListener is the case on PostgreSQL, on
// the database's clock: a Listener as WorkSignal, a poll an hour away, a
// 200 ms fixed backoff and a handler that fails at once. Each retry is
// claimed when its backoff ends (the insert's notification only woke the
// first claim), so the third attempt succeeds within seconds; before, the
// second attempt waited for the poll.
func TestE2ERetriesOnTimeWithListener(t *testing.T) {
	t.Parallel()
	for _, q := range e2eQueues {
		t.Run(string(q), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			url := freshURL(t)
			store := openStore(t, url, q, leasing.PostgresOptions{})
			cfg, err := pgx.ParseConfig(url)
			require.NoError(t, err)
			l, err := leasing.NewListener(cfg, q, leasing.ListenerOptions{})
			require.NoError(t, err)
			listenCtx, stopListening := context.WithCancel(ctx)
			listened := make(chan error, 1)
			go func() { listened <- l.Run(listenCtx) }()
			defer func() {
				stopListening()
				require.NoError(t, <-listened)
			}()

			var calls atomic.Int32
			p, err := processor.New(store, func(context.Context, leasing.Lease) error {
				if calls.Add(1) < 3 {
					return errors.New("fails at once")
				}
				return nil
			}, processor.Options{
				PollInterval: time.Hour, WorkSignal: l,
				RetryPolicy: processor.RetryPolicy{InitialDelay: 200 * time.Millisecond, Multiplier: 1},
			})
			require.NoError(t, err)
			runCtx, stop := context.WithCancel(ctx)
			ran := make(chan error, 1)
			go func() { ran <- p.Run(runCtx) }()
			defer func() {
				stop()
				require.NoError(t, <-ran)
			}()
			require.Eventually(t, func() bool { return l.BackendPID() != 0 }, e2eWait, time.Millisecond, "listening")

			msg := leasing.NewMessage{Type: "e2e", Payload: []byte("p")}
			if q == leasing.Outbox {
				msg.Topic = e2eTopic
			}
			res, err := store.Enqueue(ctx, msg)
			require.NoError(t, err)
			require.Eventually(t, func() bool {
				r, err := store.Get(ctx, res.IDs[0])
				return err == nil && r.Status == q.Succeeded()
			}, e2eWait, 5*time.Millisecond, "succeeded on attempt 3 without waiting for the hourly poll")
			r, err := store.Get(ctx, res.IDs[0])
			require.NoError(t, err)
			require.Equal(t, 3, r.AttemptCount)
		})
	}
}
