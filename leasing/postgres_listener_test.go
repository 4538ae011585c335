package leasing_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/leasestore/leasestore/gen"
	"github.com/leasestore/leasestore/internal/dbtest"
	"github.com/leasestore/leasestore/leasing"
)

func TestListenerOptions(t *testing.T) {
	t.Parallel()
	cfg, err := pgx.ParseConfig("postgres://postgres@127.0.0.1:5432/postgres")
	require.NoError(t, err)
	_, err = leasing.NewListener(cfg, leasing.Inbox, leasing.ListenerOptions{})
	require.NoError(t, err)
	for _, opts := range []leasing.ListenerOptions{
		{ProbeWait: -time.Second},
		{MinBackoff: time.Second, MaxBackoff: time.Millisecond},
	} {
		_, err = leasing.NewListener(cfg, leasing.Inbox, opts)
		var argErr *leasing.ArgumentError
		require.ErrorAs(t, err, &argErr, "%+v", opts)
	}
	_, err = leasing.NewListener(nil, leasing.Inbox, leasing.ListenerOptions{})
	require.ErrorIs(t, err, leasing.ErrInvalidArgument)
}

// TestListenerWakesOnceListening: notifications that arrive while a new
// connection's LISTEN is checked (the probe) wake the listener only once
// the check passed, so that a wake always finds BackendPID set. Another
// connection notifies the channel every millisecond throughout.
func TestListenerWakesOnceListening(t *testing.T) {
	t.Parallel()
	url := dbtest.DatabaseURL(t)
	notifier := adminConn(t, url)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	notifying := make(chan struct{})
	go func() {
		defer close(notifying)
		for ctx.Err() == nil {
			_ = gen.New().SignalProbe(ctx, notifier, gen.SignalProbeParams{Channel: leasing.Inbox.Channel(), Payload: "other"})
			time.Sleep(time.Millisecond)
		}
	}()
	cfg, err := pgx.ParseConfig(url)
	require.NoError(t, err)
	l, err := leasing.NewListener(cfg, leasing.Inbox, leasing.ListenerOptions{})
	require.NoError(t, err)
	ran := make(chan error, 1)
	go func() { ran <- l.Run(ctx) }()
	for range 20 {
		select {
		case <-l.Wake():
		case err := <-ran:
			t.Fatalf("Run returned %v", err)
		case <-time.After(10 * time.Second):
			t.Fatal("no wake within 10s")
		}
		require.NotZero(t, l.BackendPID(), "woken before LISTEN was checked")
	}
	cancel()
	require.NoError(t, <-ran)
	<-notifying
}
