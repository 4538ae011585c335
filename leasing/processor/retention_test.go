package processor_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/leasestore/leasestore/internal/dbtest"
	"github.com/leasestore/leasestore/leasing"
	"github.com/leasestore/leasestore/leasing/processor"
)

// TestRetention: a processor with a retention policy purges the rows it
// completed once they are older than the policy's window; a policy below
// its min dedup window, or on a store that cannot apply it, is refused by
// New.
func TestRetention(t *testing.T) {
	t.Parallel()
	pg, _ := instanceStore(t, dbtest.DatabaseURL(t))
	res, err := pg.Enqueue(t.Context(), leasing.NewMessage{Type: "t", Payload: []byte("a")}, leasing.NewMessage{Type: "t", Payload: []byte("b")})
	require.NoError(t, err)
	p, err := processor.New(pg, func(context.Context, leasing.Lease) error { return nil }, processor.Options{
		PollInterval: 10 * time.Millisecond,
		Retention:    leasing.RetentionPolicy{Finished: time.Millisecond, Interval: 10 * time.Millisecond},
	})
	require.NoError(t, err)
	errc := make(chan error, 1)
	go func() { errc <- p.Run(context.Background()) }()
	require.Eventually(t, func() bool {
		for _, id := range res.IDs {
			if _, err := pg.Get(t.Context(), id); err == nil {
				return false
			}
		}
		return true
	}, 20*time.Second, 10*time.Millisecond, "completed rows purged")
	require.NoError(t, p.Stop(context.Background()))
	require.NoError(t, <-errc)

	handler := func(context.Context, leasing.Lease) error { return nil }
	_, err = processor.New(pg, handler, processor.Options{Retention: leasing.RetentionPolicy{Finished: time.Minute, MinDedupWindow: time.Hour}})
	require.ErrorIs(t, err, leasing.ErrInvalidArgument)
	mem, err := leasing.NewMemory(leasing.Inbox, leasing.MemoryOptions{})
	require.NoError(t, err)
	_, err = processor.New(mem, handler, processor.Options{Retention: leasing.RetentionPolicy{Finished: time.Hour}})
	require.ErrorIs(t, err, leasing.ErrInvalidArgument)
}
