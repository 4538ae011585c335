package reliability_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/leasestore/leasestore/leasing"
	"github.com/leasestore/leasestore/leasing/processor"
)

// TestFaultListener: the work signal's connection is broken again and
// again (pg_terminate_backend). Wake-ups resume after each reconnect, a
// message inserted while the listener is down is picked up by the wake the
// listener sends after reconnecting, and a processor whose listener never
// connects still works by polling.
func TestFaultListener(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := freshURL(t)
	admin := adminConn(t, url)
	pool := newPool(t, url, "", 2)
	store, err := leasing.NewPostgres(pool, leasing.Inbox, leasing.PostgresOptions{})
	require.NoError(t, err)
	listener, err := leasing.NewListener(pool.Config().ConnConfig, leasing.Inbox, leasing.ListenerOptions{MinBackoff: 10 * time.Millisecond, MaxBackoff: 50 * time.Millisecond})
	require.NoError(t, err)
	lctx, stopListener := context.WithCancel(ctx)
	defer stopListener()
	go func() { _ = listener.Run(lctx) }()

	handled := make(chan uuid.UUID, 100)
	proc, err := processor.New(store, func(_ context.Context, l leasing.Lease) error {
		handled <- l.Message.ID
		return nil
	}, processor.Options{PollInterval: time.Hour, WorkSignal: listener}) // only wake-ups can find new rows
	require.NoError(t, err)
	go func() { _ = proc.Run(ctx) }()
	defer func() {
		stopCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		_ = proc.Stop(stopCtx)
	}()

	expect := func(what string, id uuid.UUID) {
		t.Helper()
		select {
		case got := <-handled:
			require.Equal(t, id, got, what)
		case <-time.After(5 * time.Second):
			t.Fatalf("%s: message not handled within 5s (poll interval is 1h)", what)
		}
	}
	enqueue := func() uuid.UUID {
		res, err := store.Enqueue(ctx, leasing.NewMessage{})
		require.NoError(t, err)
		return res.IDs[0]
	}
	waitPID := func(not uint32) uint32 {
		var pid uint32
		require.Eventually(t, func() bool { pid = listener.BackendPID(); return pid != 0 && pid != not }, 10*time.Second, 5*time.Millisecond)
		return pid
	}
	kill := func(pid uint32) {
		var ok bool
		require.NoError(t, admin.QueryRow(ctx, "SELECT pg_terminate_backend($1)", int32(pid)).Scan(&ok))
		require.True(t, ok)
	}

	pid := waitPID(0)
	expect("before any fault", enqueue())
	for i := range 5 {
		kill(pid)
		if i%2 == 0 {
			// Inserted while the listener may be down: the wake after the
			// reconnect covers it.
			expect("inserted during the outage", enqueue())
			pid = waitPID(pid)
		} else {
			pid = waitPID(pid)
			expect("after a reconnect", enqueue())
		}
	}

	// No working listener at all: polling alone delivers.
	broken := pool.Config().ConnConfig.Copy()
	broken.Port = 1 // nothing listens there
	deaf, err := leasing.NewListener(broken, leasing.Outbox, leasing.ListenerOptions{MinBackoff: 10 * time.Millisecond, MaxBackoff: 20 * time.Millisecond})
	require.NoError(t, err)
	go func() { _ = deaf.Run(lctx) }()
	outbox, err := leasing.NewPostgres(pool, leasing.Outbox, leasing.PostgresOptions{})
	require.NoError(t, err)
	polled := make(chan struct{}, 10)
	poller, err := processor.New(outbox, func(context.Context, leasing.Lease) error {
		polled <- struct{}{}
		return nil
	}, processor.Options{PollInterval: 100 * time.Millisecond, WorkSignal: deaf})
	require.NoError(t, err)
	go func() { _ = poller.Run(ctx) }()
	defer func() {
		stopCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		_ = poller.Stop(stopCtx)
	}()
	time.Sleep(150 * time.Millisecond) // let the first (empty) claim pass
	_, err = outbox.Enqueue(ctx, leasing.NewMessage{Topic: "t"})
	require.NoError(t, err)
	select {
	case <-polled:
	case <-time.After(5 * time.Second):
		t.Fatal("polling did not cover a missing work signal")
	}
}
