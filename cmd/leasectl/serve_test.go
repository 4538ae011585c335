package main

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/leasestore/leasestore/internal/dbtest"
)

// syncBuffer is a bytes.Buffer safe for one writer and one reader.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

// Write appends p.
func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// String returns what was written so far.
func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// TestServe scrapes the queue-depth gauges from serve and stops it by cancelling its context.
func TestServe(t *testing.T) {
	t.Parallel()
	url := dbtest.DatabaseURL(t)
	requireOK(t, "enqueue", "--queue", "inbox", "--count", "2", "--database-url", url)

	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var stdout, stderr syncBuffer
	exited := make(chan int, 1)
	go func() {
		exited <- runContext(ctx, []string{"serve", "--metrics-addr", "127.0.0.1:0", "--database-url", url}, &stdout, &stderr)
	}()

	addr := regexp.MustCompile(`http://(\S+)/metrics`)
	var metricsURL string
	require.Eventually(t, func() bool {
		m := addr.FindStringSubmatch(stdout.String())
		if m != nil {
			metricsURL = "http://" + m[1] + "/metrics"
		}
		return m != nil
	}, 10*time.Second, 10*time.Millisecond, "stderr: %s", &stderr)
	_, _, err := net.SplitHostPort(strings.TrimPrefix(strings.TrimSuffix(metricsURL, "/metrics"), "http://"))
	require.NoError(t, err)

	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, metricsURL, nil)
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, resp.Body.Close())
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	metrics := string(body)
	require.Regexp(t, `(?m)^litebus_inbox_queue_depth\{.*status="pending".*\} 2$`, metrics)
	require.Regexp(t, `(?m)^litebus_inbox_queue_depth\{.*status="processing".*\} 0$`, metrics)
	require.Regexp(t, `(?m)^litebus_outbox_queue_depth\{.*status="publishing".*\} 0$`, metrics)
	require.Contains(t, metrics, "litebus_inbox_queue_expired_leases")
	require.Contains(t, metrics, "litebus_outbox_queue_oldest_due_age_seconds")

	cancel()
	select {
	case code := <-exited:
		require.Equal(t, 0, code, stderr.String())
	case <-time.After(10 * time.Second):
		t.Fatal("serve did not stop after its context was cancelled")
	}
}
