package processor_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/leasestore/leasestore/internal/logtest"
	"github.com/leasestore/leasestore/leasing"
	"github.com/leasestore/leasestore/leasing/processor"
)

// TestListenerLogsReconnect: a listener whose connection is terminated
// logs the loss (warn, with the error and the backoff) and each LISTEN in
// place (info, with the backend pid), every record with queue and channel.
func TestListenerLogsReconnect(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := freshURL(t)
	admin := adminConn(t, url)
	pool := newPool(t, url, "", 1)
	rec := logtest.New(slog.LevelDebug)
	listener, err := leasing.NewListener(pool.Config().ConnConfig, leasing.Outbox,
		leasing.ListenerOptions{MinBackoff: 10 * time.Millisecond, MaxBackoff: 50 * time.Millisecond, Logger: rec.Logger()})
	require.NoError(t, err)
	lctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- listener.Run(lctx) }()
	defer func() {
		stop()
		require.NoError(t, <-done)
	}()

	waitPID := func(not uint32) uint32 {
		var pid uint32
		require.Eventually(t, func() bool { pid = listener.BackendPID(); return pid != 0 && pid != not }, 10*time.Second, 5*time.Millisecond)
		return pid
	}
	first := waitPID(0)
	var ok bool
	require.NoError(t, admin.QueryRow(ctx, "SELECT pg_terminate_backend($1)", int32(first)).Scan(&ok))
	require.True(t, ok)
	second := waitPID(first)
	require.Eventually(t, func() bool { return len(rec.Find("listener connected")) >= 2 }, 10*time.Second, 5*time.Millisecond)

	for _, r := range rec.Records() {
		require.Equal(t, "outbox", r.Str(processor.LogKeyQueue), r.Message)
		require.Equal(t, listener.Channel(), r.Str(processor.LogKeyChannel), r.Message)
	}
	connected := rec.Find("listener connected")
	require.Equal(t, slog.LevelInfo, connected[0].Level)
	require.Equal(t, int64(first), connected[0].Attrs["backend_pid"].Int64())
	require.Equal(t, int64(second), connected[1].Attrs["backend_pid"].Int64())
	lost := rec.Find("listener connection lost; reconnecting")
	require.NotEmpty(t, lost)
	require.Equal(t, slog.LevelWarn, lost[0].Level)
	require.NotEmpty(t, lost[0].Str(processor.LogKeyError))
	require.Equal(t, 10*time.Millisecond, lost[0].Attrs["backoff"].Duration())
}
