package processor_test

import (
	"context"
	"errors"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/leasestore/leasestore/internal/brokertest"
	"github.com/leasestore/leasestore/internal/dbtest"
	"github.com/leasestore/leasestore/leasing"
	"github.com/leasestore/leasestore/leasing/processor"
)

// TestDirectConfigListener: with a DirectConfig and no WorkSignal the
// processor runs its own Listener: a message enqueued while it waits out a
// one-minute poll is handled at once. A Listener that cannot connect
// reports to OnError and in Health, and the processor stays ready.
func TestDirectConfigListener(t *testing.T) {
	t.Parallel()
	pg, cfg := instanceStore(t, dbtest.DatabaseURL(t))

	t.Run("Wakes", func(t *testing.T) {
		handled := make(chan string, 2)
		p, err := processor.New(pg, func(_ context.Context, l leasing.Lease) error { handled <- string(l.Message.Payload); return nil },
			processor.Options{DirectConfig: cfg, PollInterval: time.Minute})
		require.NoError(t, err)
		_, err = pg.Enqueue(t.Context(), leasing.NewMessage{Type: "t", Payload: []byte("first")})
		require.NoError(t, err)
		errc := make(chan error, 1)
		go func() { errc <- p.Run(context.Background()) }()
		require.Equal(t, "first", <-handled)
		// Past the short re-polls after a claim that found work: from here
		// only a notification wakes the processor before the minute ends.
		time.Sleep(300 * time.Millisecond)
		_, err = pg.Enqueue(t.Context(), leasing.NewMessage{Type: "t", Payload: []byte("second")})
		require.NoError(t, err)
		select {
		case got := <-handled:
			require.Equal(t, "second", got)
		case <-time.After(20 * time.Second):
			require.FailNow(t, "the listener did not wake the processor")
		}
		require.Empty(t, p.Health().ListenerError)
		require.False(t, p.Health().ListenerSilent, "a listener that delivers is not silent")
		require.NoError(t, p.Stop(context.Background()))
		require.NoError(t, <-errc)
	})

	t.Run("SilentInHealth", func(t *testing.T) {
		// The listener reaches the server through a proxy; once the proxy
		// cuts it off the listener cannot LISTEN, and health says so while
		// the processor, polling, stays ready.
		proxy := brokertest.NewProxy(t, net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port))))
		direct := cfg.Copy()
		host, port, err := net.SplitHostPort(proxy.Addr())
		require.NoError(t, err)
		n, err := strconv.Atoi(port)
		require.NoError(t, err)
		direct.Host, direct.Port, direct.Fallbacks = host, uint16(n), nil
		p, err := processor.New(pg, func(context.Context, leasing.Lease) error { return nil },
			processor.Options{DirectConfig: direct, PollInterval: 10 * time.Millisecond})
		require.NoError(t, err)
		errc := make(chan error, 1)
		go func() { errc <- p.Run(context.Background()) }()
		require.Eventually(t, func() bool { h := p.Health(); return h.Ready && !h.ListenerHeard.IsZero() && !h.ListenerSilent },
			10*time.Second, 5*time.Millisecond, "listening")
		proxy.Cut()
		require.Eventually(t, func() bool { h := p.Health(); return h.ListenerSilent && h.Ready },
			10*time.Second, 5*time.Millisecond, "silent, still ready")
		require.NoError(t, p.Stop(context.Background()))
		require.NoError(t, <-errc)
	})

	t.Run("ReportsErrors", func(t *testing.T) {
		bad, err := pgx.ParseConfig("postgres://postgres@127.0.0.1:1/postgres?connect_timeout=1")
		require.NoError(t, err)
		reported := make(chan error, 100)
		p, err := processor.New(pg, func(context.Context, leasing.Lease) error { return nil },
			processor.Options{DirectConfig: bad, PollInterval: 10 * time.Millisecond, OnError: func(err error) {
				select {
				case reported <- err:
				default:
				}
			}})
		require.NoError(t, err)
		errc := make(chan error, 1)
		go func() { errc <- p.Run(context.Background()) }()
		var got error
		select {
		case got = <-reported:
		case <-time.After(10 * time.Second):
			require.FailNow(t, "no listener error reported")
		}
		require.Contains(t, got.Error(), "listener")
		require.Eventually(t, func() bool {
			h := p.Health()
			return h.ListenerError != "" && h.Ready
		}, 10*time.Second, 5*time.Millisecond)
		require.NoError(t, p.Stop(context.Background()))
		require.NoError(t, <-errc)
		require.False(t, errors.Is(got, leasing.ErrInvalidArgument))
	})
}
