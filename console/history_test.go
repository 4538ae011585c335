package console_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"regexp"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/leasestore/leasestore/console"
	"github.com/leasestore/leasestore/internal/dbtest"
	"github.com/leasestore/leasestore/leasing"
)

// queuesPage serves the queues page without a server (no goroutines).
func queuesPage(t *testing.T, c *console.Console) string {
	t.Helper()
	w := httptest.NewRecorder()
	c.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/", nil))
	require.Equal(t, http.StatusOK, w.Code, w.Body.String())
	return w.Body.String()
}

func TestHistorySampledUntilClose(t *testing.T) {
	t.Parallel()
	url := dbtest.DatabaseURL(t)
	inbox := dbtest.OpenStore(t, url, leasing.Inbox, leasing.PostgresOptions{})
	_, err := inbox.Enqueue(t.Context(), leasing.NewMessage{Type: "a"}, leasing.NewMessage{Type: "a"}, leasing.NewMessage{Type: "a"})
	require.NoError(t, err)
	c, err := console.New(console.Options{SampleEvery: 100 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}, inbox)
	require.NoError(t, err)
	require.NotContains(t, queuesPage(t, c), "sampled every", "no history before Run")

	ran := make(chan error, 1)
	go func() { ran <- c.Run(context.Background()) }()
	require.Eventually(t, func() bool {
		return regexpMatch(queuesPage(t, c), `depth \(waiting, pending, in flight, failed\): now 3, max 3`)
	}, 10*time.Second, 20*time.Millisecond)
	body := queuesPage(t, c)
	require.Contains(t, body, "since this console started, sampled every 100ms")
	require.Contains(t, body, `<svg class="depth"`)

	// Two messages succeed: the depth falls to 1 and a rate shows.
	leases, err := inbox.Claim(t.Context(), leasing.ClaimRequest{Owner: "t", BatchSize: 2, LeaseFor: time.Minute})
	require.NoError(t, err)
	require.Len(t, leases, 2)
	_, err = inbox.Complete(t.Context(), leases...)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		b := queuesPage(t, c)
		return regexpMatch(b, `now 1, max 3`) && regexpMatch(b, `succeeded per minute: now [0-9.]+, max [1-9][0-9]*\.[0-9]`)
	}, 10*time.Second, 20*time.Millisecond)
	require.Regexp(t, `<polyline [^>]*points="[0-9., ]+"`, queuesPage(t, c))

	require.ErrorContains(t, c.Run(t.Context()), "already running")
	require.NoError(t, c.Close())
	select {
	case err := <-ran:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after Close")
	}
	require.NoError(t, c.Close(), "Close twice")
	require.ErrorContains(t, c.Run(t.Context()), "closed")
	// The page still serves its history after Close.
	require.Contains(t, queuesPage(t, c), "now 1, max 3")
}

func TestHistoryRunStopsWithContext(t *testing.T) {
	t.Parallel()
	url := dbtest.DatabaseURL(t)
	inbox := dbtest.OpenStore(t, url, leasing.Inbox, leasing.PostgresOptions{})
	c, err := console.New(console.Options{SampleEvery: 100 * time.Millisecond}, inbox)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	require.NoError(t, c.Run(ctx))
	require.NoError(t, c.Run(ctx), "Run again after its context ended")
	off, err := console.New(console.Options{SampleEvery: -1}, inbox)
	require.NoError(t, err)
	require.NoError(t, off.Run(t.Context()), "sampling off returns at once")
	require.NotContains(t, queuesPage(t, off), "sampled every")
}

func regexpMatch(s, re string) bool { return regexp.MustCompile(re).MatchString(s) }
