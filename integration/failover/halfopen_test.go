package failover_test

import (
	"context"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/leasestore/leasestore/integration/internal/pgcluster"
	"github.com/leasestore/leasestore/internal/dbtest"
	"github.com/leasestore/leasestore/internal/metrictest"
	"github.com/leasestore/leasestore/leasing"
)

// TestListenerHalfOpen black-holes a Listener's connection at a proxy, as
// a failover behind a proxy or a dropped NAT entry leaves it: the client
// can write, nothing comes back, no error ever arrives. The heartbeat
// notices (its failure counted, the listener unhealthy meanwhile), the
// listener reconnects through the proxy, and the next insert's NOTIFY
// wakes it. Without the heartbeat it would wait forever.
func TestListenerHalfOpen(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	url := dbtest.DatabaseURL(t)
	direct, err := pgx.ParseConfig(url)
	require.NoError(t, err)
	proxy := pgcluster.NewProxy(t, net.JoinHostPort(direct.Host, strconv.Itoa(int(direct.Port))))
	cfg := direct.Copy()
	cfg.Host, cfg.Port = "127.0.0.1", uint16(proxy.Port())

	metrics := metrictest.NewProvider()
	const interval, timeout = 300 * time.Millisecond, 300 * time.Millisecond
	l, err := leasing.NewListener(cfg, leasing.Inbox, leasing.ListenerOptions{
		MinBackoff: 20 * time.Millisecond, MaxBackoff: 200 * time.Millisecond,
		HeartbeatInterval: interval, HeartbeatTimeout: timeout, Meter: metrics.Meter(""),
	})
	require.NoError(t, err)
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- l.Run(runCtx) }()
	defer func() { stop(); require.NoError(t, <-done) }()

	waitFor(t, func() bool { return l.Healthy() }, 10*time.Second, "the listener to connect")
	healthy := func() float64 {
		points, err := metrics.Observe(ctx)
		require.NoError(t, err)
		p := points["litebus.inbox.listener.healthy"]
		require.Len(t, p, 1)
		return p[0].Value
	}
	require.Equal(t, 1.0, healthy())
	drain(l)
	pid := l.BackendPID()
	heardBefore := l.LastHeard()

	require.Equal(t, 1, proxy.BlackHole())
	waitFor(t, func() bool { n := l.BackendPID(); return n != 0 && n != pid }, 10*time.Second, "a reconnect after the connection went half-open")
	require.GreaterOrEqual(t, metrics.Sum("litebus.inbox.listener.heartbeat_failures"), int64(1))
	require.GreaterOrEqual(t, metrics.Sum("litebus.inbox.listener.reconnects"), int64(1))
	require.True(t, l.LastHeard().After(heardBefore))
	require.Equal(t, 1.0, healthy())

	// Notifications arrive on the new connection.
	drain(l)
	store := openStores(t, url)[leasing.Inbox]
	_, err = store.Enqueue(ctx, newMessages(leasing.Inbox, "halfopen", 1)...)
	require.NoError(t, err)
	select {
	case <-l.Wake():
	case <-ctx.Done():
		t.Fatal("no wake after the reconnect")
	}
}

// drain empties the listener's wake channel.
func drain(l *leasing.Listener) {
	select {
	case <-l.Wake():
	default:
	}
}
